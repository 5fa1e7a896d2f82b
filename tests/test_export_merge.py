"""Several raw datasets exported as one verified set (export/merge.py), in every format.

Three "robots" (different dates, overlapping tasks, unique episode lengths so every episode is
recognisable) become one accepted/rejected pair; each format's own reader reads it back and
every episode is traced to its source dataset and source episode, whose rows must be equal.
"""

from __future__ import annotations

import glob
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import h5py
import msgpack
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset

from eva_export.cli import main as cli_main
from eva_export.config import Config, parse_config
from eva_export.dataset.meta import read_meta
from eva_export.dataset.records import Feature
from eva_export.dataset.table import to_numpy
from eva_export.dataset.writer import DatasetWriter, make_features
from eva_export.errors import EvaError
from eva_export.export.merge import ORIGINS_KEY, SOURCES_KEY
from eva_export.export.records import QualitySplit
from eva_export.export.request import ExportRequest
from eva_export.export.runner import ExportService
from eva_export.formats.registry import get_spec
from eva_export.formats.verify import verify_export
from eva_export.store import open_store

FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store")
PICK, PLACE, WIPE = "pick the cube", "place the cube", "wipe the table"
FIXTURES = Path("/work/shared/fixtures/lerobot-written")

pytestmark = pytest.mark.timeout(600)


def robots(root: Path) -> list[Path]:
    """Three robots' days: r2 lists its tasks in another order than r1 (remapping), r2:2 is red
    but passed by an operator, r3:0 green but failed."""
    r1 = make_dataset(root / "r1" / "raw", [Ep(20, task=PICK, extra={"day": "2026-11-01"}),
                                             Ep(21, "red", task=PLACE, extra={"day": "2026-11-01"}),
                                             Ep(22, task=PICK, extra={"day": "2026-11-01"})])
    r2 = make_dataset(root / "r2" / "raw", [Ep(23, task=PLACE, extra={"day": "2026-11-02"}),
                                             Ep(24, task=WIPE, extra={"day": "2026-11-02"}),
                                             Ep(25, "red", verdict="pass", task=PICK, extra={"day": "2026-11-02"})])
    r3 = make_dataset(root / "r3" / "raw", [Ep(26, task=WIPE, verdict="fail", extra={"day": "2026-11-03"}),
                                             Ep(27, task=PICK, extra={"day": "2026-11-03"})])
    return [r1, r2, r3]


ACCEPTED = [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2), (2, 1)]  # (robot, source episode), in output order
REJECTED = [(0, 1), (2, 0)]


def config(root: Path) -> Config:
    return parse_config({"collection": {"log_dir": str(root)}, "export": {"workers": 1}})


@dataclass(frozen=True)
class SourceEp:
    dataset: str
    index: int
    task: str
    state: np.ndarray
    length: int


def source_episode(src: Path, index: int) -> SourceEp:
    meta = read_meta(src)
    table = pq.read_table(meta.data_path(index))
    task = meta.task_text[int(to_numpy(table.column("task_index"))[0])]
    return SourceEp(str(src.resolve()), index, task, to_numpy(table.column("observation.state")), table.num_rows)


@dataclass(frozen=True)
class ReadEp:
    """One output episode as its format's reader gives it back."""

    dataset: str
    index: int
    task: str
    state: np.ndarray


def read_v21(d: Path) -> list[ReadEp]:
    meta = read_meta(d)
    out = []
    for row in meta.episodes:
        i = row.episode_index
        table = pq.read_table(d / meta.info.data_file(i))
        assert to_numpy(table.column("episode_index")).tolist() == [i] * row.length
        with av.open(str(d / meta.info.video_file("observation.images.cam0", i))) as c:
            assert sum(1 for _ in c.decode(video=0)) == row.length  # PyAV: every frame there
        task = meta.task_text[int(to_numpy(table.column("task_index"))[0])]
        out.append(ReadEp(row.extra["source_dataset"], row.extra["source_episode_index"], task,
                          to_numpy(table.column("observation.state"))))
    return out


def read_v3(d: Path) -> list[ReadEp]:
    eps = pq.read_table(sorted(glob.glob(str(d / "meta/episodes/*/*.parquet")))).to_pylist()
    t = pq.read_table(d / "meta/tasks.parquet").to_pydict()
    text = dict(zip(t["task_index"], t["task"], strict=True))
    out = []
    for e in eps:
        data = pq.read_table(d / f"data/chunk-{e['data/chunk_index']:03d}/file-{e['data/file_index']:03d}.parquet")
        rows = data.filter(pc.equal(data.column("episode_index"), e["episode_index"]))
        assert to_numpy(rows.column("index")).tolist() == list(range(e["dataset_from_index"], e["dataset_to_index"]))
        task = text[int(to_numpy(rows.column("task_index"))[0])]
        out.append(ReadEp(e["source_dataset"], e["source_episode_index"], task,
                          to_numpy(rows.column("observation.state"))))
    frames = 0
    cam = read_meta(d).info.video_keys[0]
    for f in sorted(glob.glob(str(d / f"videos/{cam}/*/*.mp4"))):
        with av.open(f) as c:
            frames += sum(1 for _ in c.decode(video=0))
    assert frames == sum(len(e.state) for e in out)
    return out


def _h5_items(group: Any) -> dict[str, Any]:
    items = {}
    for item in group.values():
        value = item["value"][()]
        kind = item.attrs["kind"]
        if kind == "string":
            value = value.decode() if isinstance(value, bytes) else str(value)
        elif kind == "msgpack":
            value = msgpack.unpackb(bytes(np.asarray(value).tobytes()), raw=False)
        items[item.attrs["key"]] = value
    return items


def read_hdf5(d: Path) -> list[ReadEp]:
    tasks = [json.loads(line)["task"] for line in (d / "meta/tasks.jsonl").read_text().splitlines()]
    out = []
    for f in sorted(glob.glob(str(d / "data/*/*.hdf5"))):
        with h5py.File(f, "r") as h:
            meta, cols = _h5_items(h["metadata"]), _h5_items(h["columns"])
        out.append(ReadEp(meta["source_dataset"], int(meta["source_episode_index"]),
                          tasks[int(np.asarray(cols["task_index"]).reshape(-1)[0])], np.asarray(cols["observation.state"])))
    return out


def read_mcap(d: Path) -> list[ReadEp]:
    from mcap.reader import make_reader

    tasks = [json.loads(line)["task"] for line in (d / "meta/tasks.jsonl").read_text().splitlines()]
    out = []
    for f in sorted(glob.glob(str(d / "data/*/*.mcap"))):
        with open(f, "rb") as fh:
            msgs = [m.data for _, c, m in make_reader(fh, validate_crcs=True).iter_messages() if c.topic == "episode"]
        payload = msgpack.unpackb(msgs[0], raw=False)
        meta, cols = payload["metadata"], payload["columns"]
        out.append(ReadEp(meta["source_dataset"], meta["source_episode_index"], tasks[int(cols["task_index"][0])],
                          np.asarray(cols["observation.state"], np.float32)))
    return out


def read_store(d: Path) -> list[ReadEp]:
    rows = [json.loads(line) for line in (d / "meta/episodes.jsonl").read_text().splitlines()]
    store = open_store(d)
    out = []
    for ep in store.episodes:
        samples = list(store.episode(ep))
        out.append(ReadEp(rows[ep]["source_dataset"], rows[ep]["source_episode_index"], samples[0]["task"],
                          np.stack([s["observation.state"] for s in samples])))
    return out


READERS = {"lerobot_v21": read_v21, "lerobot_v3": read_v3, "hdf5": read_hdf5, "mcap": read_mcap,
           "eva_store": read_store}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("fleet")
    return root, robots(root)


def check_against_sources(got: list[ReadEp], sources: list[Path], want: list[tuple[int, int]]) -> None:
    assert [(e.dataset, e.index) for e in got] == [(str(sources[r].resolve()), i) for r, i in want]
    for e, (r, i) in zip(got, want, strict=True):
        src = source_episode(sources[r], i)
        assert e.task == src.task
        np.testing.assert_allclose(e.state, src.state, rtol=0, atol=1e-6)


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


def _write_custom(root: Path, state_dim: int) -> Path:
    """A raw dataset like dsfactory's but with a ``state_dim``-wide observation.state."""
    names = [f"joint_{i}" for i in range(state_dim)]
    feats = make_features({"observation.state": Feature("float32", (state_dim,), names),
                           "action": Feature("float32", (6,), [f"joint_{i}" for i in range(6)]),
                           "capture_time": Feature("float64", (1,), None),
                           "observation.images.cam0": Feature.video(48, 64, 30),
                           "observation.images.cam1": Feature.video(48, 64, 30)})
    dw = DatasetWriter.open(root, fps=30, features=feats, robot_type="test")
    w = dw.begin_episode(PICK)
    for f in range(20):
        w.add_frame({"observation.state": np.full(state_dim, f, np.float32), "action": np.zeros(6, np.float32),
                     "capture_time": 1000.0 + f / 30},
                    {f"observation.images.cam{c}": np.full((48, 64, 3), 8 * f, np.uint8) for c in range(2)})
    w.finish()
    dw.commit(w, {"quality": "green", "quality_issues": []})
    return root


@pytest.mark.parametrize("kind,why", [("fps", "fps 15"), ("camera", "'observation.images.cam1' is missing"),
                                      ("size", "'observation.images.cam0' has shape"),
                                      ("state", "'observation.state' has shape")])
def test_feature_mismatch_refused_naming_the_source(tmp_path: Path, kind: str, why: str) -> None:
    a = make_dataset(tmp_path / "a" / "raw", [Ep(20)])
    b = tmp_path / "b" / "raw"
    if kind == "state":
        _write_custom(b, 7)
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
    failed = ExportService(config(tmp_path), background=False, recover=False, fail_at="unit:2").run(
        sources, "lerobot_v3", "fleet")
    assert failed.state == "failed" and "unit:2" in failed.error
    assert not (tmp_path / "fleet/export/lerobot_v3").exists()  # nothing published
    # serial units in source order: r1:0 and r1:1 were committed before r1:2 failed
    job = ExportService(config(tmp_path), background=False, recover=False).run(sources, "lerobot_v3", "fleet")
    assert job.state == "completed", job.error
    assert job.reused_episodes == 2
    check_against_sources(read_v3(tmp_path / "fleet/export/lerobot_v3/accepted"), sources, ACCEPTED)
    # a fault after every unit: the rerun reuses all of them
    failed = ExportService(config(tmp_path), background=False, recover=False, fail_at="verified").run(
        sources, "lerobot_v3", "fleet")
    assert failed.state == "failed"
    job = ExportService(config(tmp_path), background=False, recover=False).run(sources, "lerobot_v3", "fleet")
    assert job.state == "completed" and job.reused_episodes == total
    # the staging is keyed by every source: a change in the last one starts afresh
    ExportService(config(tmp_path), background=False, recover=False, fail_at="verified").run(
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
    dst = tmp_path / f"lerobot_{kind}"
    shutil.copytree(FIXTURES / kind, dst)
    assert cli_main(["review", str(dst), "--episodes", "all", "--verdict", "pass"]) == 0
    return dst


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="LeRobot-written fixtures are not on this machine")
def test_lerobot_written_sources(tmp_path: Path) -> None:
    v21, v30 = _lerobot_copy(tmp_path, "v21"), _lerobot_copy(tmp_path, "v30")
    ours = make_dataset(tmp_path / "ours" / "raw", [Ep(20)], fps=10)
    svc = ExportService(config(tmp_path), background=False, recover=False)
    with pytest.raises(EvaError) as exc:  # our camera names, our capture_time: not LeRobot's features
        svc.run([ours, v30], "lerobot_v3", "mixed")
    assert str(v30.resolve() / "meta/info.json") in str(exc.value)
    assert "feature 'capture_time' is missing" in str(exc.value)
    # what LeRobot 0.3.3 (v2.1) and 0.4.4 (v3.0) wrote agrees: one set from both kinds
    job = svc.run([v21, v30], "lerobot_v3", "lerobot_both")
    assert job.state == "completed", job.error
    acc = tmp_path / "lerobot_both/export/lerobot_v3/accepted"
    assert verify_export(acc).ok
    got = read_v3(acc)
    assert [(e.dataset, e.index) for e in got] == [(str(v21.resolve()), 0), (str(v21.resolve()), 1),
                                                   (str(v30.resolve()), 0), (str(v30.resolve()), 1)]
    assert [len(e.state) for e in got] == [20, 15, 20, 15]
    v21_state = [to_numpy(pq.read_table(v21 / f"data/chunk-000/episode_{i:06d}.parquet").column("observation.state"))
                 for i in range(2)]
    v30_state = to_numpy(pq.read_table(v30 / "data/chunk-000/file-000.parquet").column("observation.state"))
    np.testing.assert_allclose(np.concatenate([e.state for e in got]),
                               np.concatenate([*v21_state, v30_state]), rtol=0, atol=1e-6)


def as_v20(v21: Path, dst: Path) -> Path:
    """The dataset as an older LeRobot's v2.0 (no per-episode statistics, no quality fields)."""
    shutil.copytree(v21, dst)
    (dst / "meta/episodes_stats.jsonl").unlink()
    info = json.loads((dst / "meta/info.json").read_text())
    (dst / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    rows = [json.loads(x) for x in (dst / "meta/episodes.jsonl").read_text().splitlines()]
    (dst / "meta/episodes.jsonl").write_text(
        "".join(json.dumps({k: r[k] for k in ("episode_index", "tasks", "length")}) + "\n" for r in rows))
    return dst


def as_v30(v21: Path, dst: Path) -> Path:
    """The dataset as LeRobot 0.4.x's v3.0 (shared Parquet and MP4 files), without our extras."""
    from eva_export.formats.lerobot_v3 import LeRobotV3Exporter

    meta = read_meta(v21)
    QualitySplit(str(v21), "accepted", "lerobot_v21", [e.episode_index for e in meta.episodes]).write(v21)
    LeRobotV3Exporter().export(v21, dst)
    (v21 / "meta/quality_split.json").unlink()
    for name in ("quality_split.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl", "README.md"):
        (dst / "meta" / name).unlink(missing_ok=True)
    (dst / "README.md").unlink(missing_ok=True)
    eps = dst / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(eps)
    keep = ("episode_index", "tasks", "length", "data/", "dataset_", "videos/", "stats/", "meta/episodes/")
    pq.write_table(table.select([c for c in table.column_names if c.startswith(keep)]), eps)
    return dst


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
