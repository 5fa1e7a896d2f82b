"""Several raw datasets exported as one verified set (export/merge.py), in every format.

Three "robots" (different dates, overlapping tasks, unique episode lengths so every episode is
recognisable) become one accepted/rejected pair; each format's own reader reads it back and
every episode is traced to its source dataset and source episode, whose rows must be equal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset
from export_faults import faulty_service
from merge_helpers import (
    ACCEPTED,
    PICK,
    PLACE,
    READERS,
    REJECTED,
    WIPE,
    as_v20,
    as_v30,
    check_against_sources,
    config,
    read_hdf5,
    read_v3,
    read_v21,
    robots,
    source_episode,
    write_custom,
)

from eva_export.cli import main as cli_main
from eva_export.errors import EvaError
from eva_export.export.merge import ORIGINS_KEY, SOURCES_KEY
from eva_export.export.records import QualitySplit
from eva_export.export.request import ExportRequest
from eva_export.export.runner import ExportService
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.table import to_numpy
from eva_export.formats.registry import get_spec
from eva_export.formats.verify import verify_export

FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store")
FIXTURES = Path(__file__).resolve().parent / "fixtures"  # LeRobot-written (copied from /work/shared/fixtures)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("fleet")
    return root, robots(root)


@pytest.mark.parametrize("fmt", FORMATS)
def test_three_robots_one_verified_set(fleet: tuple[Path, list[Path]], fmt: str) -> None:
    root, sources = fleet
    job = ExportService(config(root), background=False, recover=False).run(sources, fmt, "fleet")
    assert job.state == "completed", job.error
    assert (job.accepted_episodes, job.rejected_episodes) == (len(ACCEPTED), len(REJECTED))
    pair = root / "fleet" / "export" / fmt
    assert Path(job.accepted_dir) == pair / "accepted"
    for name, want in (("accepted", ACCEPTED), ("rejected", REJECTED)):
        rep = verify_export(pair / name)
        assert rep.ok, rep.errors
        check_against_sources(READERS[fmt](pair / name), sources, want)
        marker = QualitySplit.read(pair / name)
        assert marker.source_dir == str((root / "fleet").resolve())
        assert [s["source_dir"] for s in marker.extra[SOURCES_KEY]] == [str(s.resolve()) for s in sources]
        assert [(o["source_dataset"], o["source_episode_index"]) for o in marker.extra[ORIGINS_KEY]] == [
            (str(sources[r].resolve()), i) for r, i in want]
        assert marker.source_episode_indices == [i for _, i in want]
        card = (pair / name / "README.md").read_text()  # the card's sources table: one line per source
        assert all(f"| {sources[r].resolve()} |" in card for r in {r for r, _ in want}), card


def test_tasks_merged_by_text_and_exact_stats(fleet: tuple[Path, list[Path]]) -> None:
    root, sources = fleet
    job = ExportService(config(root), background=False, recover=False).run(sources, "lerobot_v21", "fleet")
    assert job.state == "completed", job.error
    acc = root / "fleet" / "export" / "lerobot_v21" / "accepted"
    meta = read_meta(acc)
    assert [t.task for t in meta.tasks] == [PICK, PLACE, WIPE]  # r2's own order is place, wipe, pick
    assert [t.task for t in read_meta(acc.parent / "rejected").tasks] == [PLACE, WIPE]
    assert [r.extra["day"] for r in meta.episodes] == ["2026-11-01"] * 2 + ["2026-11-02"] * 3 + ["2026-11-03"]
    frames = [source_episode(sources[r], i).state for r, i in ACCEPTED]
    every = np.concatenate(frames).astype(np.float64)
    for stats_file in (acc / "meta/stats.json", root / "fleet/export/lerobot_v3/accepted/meta/stats.json"):
        if not stats_file.exists():  # the v3 set is written by the parametrized test when run with it
            continue
        st = json.loads(stats_file.read_text())["observation.state"]
        np.testing.assert_allclose(st["mean"], every.mean(0), rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(st["std"], every.std(0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(st["min"], every.min(0), atol=1e-6)
        np.testing.assert_allclose(st["max"], every.max(0), atol=1e-6)
        assert st["count"] == [len(every)]
    # the test can fail: an average of the episodes' averages is off by far more than the tolerance
    naive = np.mean([f.astype(np.float64).mean(0) for f in frames], axis=0)
    assert np.abs(naive - every.mean(0)).max() > 1.0


@pytest.mark.parametrize("kind,why", [("fps", "fps 15"), ("camera", "'observation.images.cam1' is missing"),
                                      ("size", "'observation.images.cam0' has shape"),
                                      ("state", "'observation.state' has shape")])
def test_feature_mismatch_refused_naming_the_source(tmp_path: Path, kind: str, why: str) -> None:
    a = make_dataset(tmp_path / "a" / "raw", [Ep(20)])
    b = tmp_path / "b" / "raw"
    if kind == "state":
        write_custom(b, 7)
    else:
        make_dataset(b, [Ep(20)], **{"fps": {"fps": 15}, "camera": {"cameras": 1},
                                     "size": {"width": 32}}[kind])  # type: ignore[arg-type]
    svc = ExportService(config(tmp_path), background=False, recover=False)
    with pytest.raises(EvaError) as exc:
        svc.run([a, b], "lerobot_v3", "merged")
    assert str(b.resolve() / "meta/info.json") in str(exc.value) and why in str(exc.value), exc.value
    assert not (tmp_path / "merged").exists()  # refused before anything was written
    assert svc.latest() is None  # and no job was queued


def test_request_rules(tmp_path: Path) -> None:
    a = make_dataset(tmp_path / "a" / "raw", [Ep(20)])
    b = make_dataset(tmp_path / "b" / "raw", [Ep(20)])
    svc = ExportService(config(tmp_path), background=False, recover=False)
    with pytest.raises(EvaError, match="a name is required"):
        svc.run([a, b], "hdf5")
    with pytest.raises(EvaError, match="refused"):
        svc.run([a, b], "hdf5", "../out")
    with pytest.raises(EvaError, match="given twice"):
        svc.run([a, a / ".." / "raw"], "hdf5", "out")
    with pytest.raises(EvaError, match="holds a recorded dataset"):
        svc.run([a, b], "hdf5", "a")  # <root>/a is robot a's dataset
    with pytest.raises(EvaError, match="outside the export data roots"):
        svc.run([a, tmp_path.parent], "hdf5", "out")
    assert ExportRequest((a,), get_spec("hdf5")).named is False


def test_fault_mid_export_resumes_per_unit(tmp_path: Path) -> None:
    sources = robots(tmp_path)
    total = len(ACCEPTED) + len(REJECTED)
    failed = faulty_service(config(tmp_path), background=False, recover=False, fail_at="unit:2").run(
        sources, "lerobot_v3", "fleet")
    assert failed.state == "failed" and "unit:2" in failed.error
    assert not (tmp_path / "fleet/export/lerobot_v3").exists()  # nothing published
    # serial units in source order: r1:0 and r1:1 were committed before r1:2 failed
    job = ExportService(config(tmp_path), background=False, recover=False).run(sources, "lerobot_v3", "fleet")
    assert job.state == "completed", job.error
    assert job.reused_episodes == 2
    check_against_sources(read_v3(tmp_path / "fleet/export/lerobot_v3/accepted"), sources, ACCEPTED)
    # a fault after every unit: the rerun reuses all of them
    failed = faulty_service(config(tmp_path), background=False, recover=False, fail_at="verified").run(
        sources, "lerobot_v3", "fleet")
    assert failed.state == "failed"
    job = ExportService(config(tmp_path), background=False, recover=False).run(sources, "lerobot_v3", "fleet")
    assert job.state == "completed" and job.reused_episodes == total
    # the staging is keyed by every source: a change in the last one starts afresh
    faulty_service(config(tmp_path), background=False, recover=False, fail_at="verified").run(
        sources, "lerobot_v3", "fleet")
    make_dataset(sources[2], [Ep(28, task=WIPE)])
    job = ExportService(config(tmp_path), background=False, recover=False).run(sources, "lerobot_v3", "fleet")
    assert job.state == "completed" and job.reused_episodes == 0
    assert job.accepted_episodes == len(ACCEPTED) + 1


def test_cli_merges_and_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_dataset(tmp_path / "a" / "raw", [Ep(20, task=PICK)])
    b = make_dataset(tmp_path / "b" / "raw", [Ep(21, task=PICK), Ep(22, task=PLACE)])
    assert cli_main(["export", str(a), str(b), "--format", "hdf5"]) == 2
    assert "a name is required" in capsys.readouterr().err
    assert cli_main(["export", str(a), str(b), "--format", "hdf5", "--name", "day1", "--workers", "1"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["accepted_dir"] == str((tmp_path / "day1/export/hdf5/accepted").resolve())
    check_against_sources(read_hdf5(Path(job["accepted_dir"])), [a, b], [(0, 0), (1, 0), (1, 1)])


def _lerobot_copy(tmp_path: Path, kind: str) -> Path:
    dst = tmp_path / f"lerobot_{kind.replace('/', '_')}"
    shutil.copytree(FIXTURES / kind, dst)
    assert cli_main(["review", str(dst), "--episodes", "all", "--verdict", "pass"]) == 0
    return dst


def test_lerobot_written_sources(tmp_path: Path) -> None:
    v21, v30 = _lerobot_copy(tmp_path, "lerobot-written/v21"), _lerobot_copy(tmp_path, "lerobot-written/v30")
    v20 = _lerobot_copy(tmp_path, "lerobot-derived/v20")
    ours = make_dataset(tmp_path / "ours" / "raw", [Ep(20)], fps=10)
    svc = ExportService(config(tmp_path), background=False, recover=False)
    with pytest.raises(EvaError) as exc:  # our camera names, our capture_time: not LeRobot's features
        svc.run([ours, v30], "lerobot_v3", "mixed")
    assert str(v30.resolve() / "meta/info.json") in str(exc.value)
    assert "feature 'capture_time' is missing" in str(exc.value)
    # what LeRobot 0.3.3 (v2.1) and 0.4.4 (v3.0) wrote, and its v2.0 form, agree: one set of three kinds
    job = svc.run([v21, v30, v20], "lerobot_v3", "lerobot_all")
    assert job.state == "completed", job.error
    acc = tmp_path / "lerobot_all/export/lerobot_v3/accepted"
    assert verify_export(acc).ok
    got = read_v3(acc)
    assert [(e.dataset, e.index) for e in got] == [(str(d.resolve()), i) for d in (v21, v30, v20) for i in (0, 1)]
    assert [len(e.state) for e in got] == [20, 15] * 3
    per_episode = [to_numpy(pq.read_table(d / f"data/chunk-000/episode_{i:06d}.parquet").column("observation.state"))
                   for d in (v21,) for i in range(2)]
    v30_state = to_numpy(pq.read_table(v30 / "data/chunk-000/file-000.parquet").column("observation.state"))
    v20_state = [to_numpy(pq.read_table(v20 / f"data/chunk-000/episode_{i:06d}.parquet").column("observation.state"))
                 for i in range(2)]
    np.testing.assert_allclose(np.concatenate([e.state for e in got]),
                               np.concatenate([*per_episode, v30_state, *v20_state]), rtol=0, atol=1e-6)


def test_every_source_kind_in_one_set(tmp_path: Path) -> None:
    """A v2.1 source, a v2.0 one and a v3.0 one (episodes rated in the sidecar) become one set."""
    r1, r2, r3 = robots(tmp_path / "made")
    v20, v30 = as_v20(r2, tmp_path / "r2_v20"), as_v30(r3, tmp_path / "r3_v30")
    for d in (v20, v30):  # a foreign dataset has no quality fields: rated by an operator
        assert cli_main(["review", str(d), "--episodes", "all", "--verdict", "pass"]) == 0
    job = ExportService(config(tmp_path), background=False, recover=False).run([r1, v20, v30], "lerobot_v21", "kinds")
    assert job.state == "completed", job.error
    acc = tmp_path / "kinds/export/lerobot_v21/accepted"
    got = read_v21(acc)
    want = [(r1, 0, r1, 0), (r1, 2, r1, 2)] + [(v20, i, r2, i) for i in range(3)] + [(v30, i, r3, i) for i in range(2)]
    assert [(e.dataset, e.index) for e in got] == [(str(d.resolve()), i) for d, i, _, _ in want]
    for e, (_, _, made, i) in zip(got, want, strict=True):
        src = source_episode(made, i)  # the values as recorded, before the conversion
        assert e.task == src.task
        np.testing.assert_allclose(e.state, src.state, rtol=0, atol=1e-6)
    kinds = [s["kind"] for s in QualitySplit.read(acc).extra[SOURCES_KEY]]
    assert kinds == ["lerobot_v21", "lerobot_v20", "lerobot_v30"]
    assert verify_export(acc).ok


def test_batch_merge_one_set_per_task(tmp_path: Path) -> None:
    from eva_export.export.batch import run_batch

    day = tmp_path / "day"
    picks = [make_dataset(day / f"robot{r}" / "raw", [Ep(20 + r, task=PICK), Ep(23 + r, task=PICK)]) for r in range(2)]
    wipe = make_dataset(day / "robot2" / "raw", [Ep(30, task=WIPE)])
    results = run_batch(day, "hdf5", workers=1, merge=True)
    assert [(r.dataset, r.result, r.accepted) for r in results] == [
        ("merged_pick_the_cube", "published", 4), ("merged_wipe_the_table", "published", 1)], results
    check_against_sources(read_hdf5(day / "merged_pick_the_cube/export/hdf5/accepted"), picks,
                          [(0, 0), (0, 1), (1, 0), (1, 1)])
    check_against_sources(read_hdf5(day / "merged_wipe_the_table/export/hdf5/accepted"), [wipe], [(0, 0)])
    assert [r.result for r in run_batch(day, "hdf5", workers=1, merge=True)] == ["skipped", "skipped"]
    make_dataset(picks[1], [Ep(26, task=PICK)])  # one source of the pick set changed: that set only
    again = run_batch(day, "hdf5", workers=1, merge=True)
    assert [(r.result, r.accepted) for r in again] == [("published", 5), ("skipped", 1)]
