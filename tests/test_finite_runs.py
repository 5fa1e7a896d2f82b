"""An operator-passed episode with NaN/inf runs exports as its finite runs (the default): every
format's accepted subset is finite and trainable, nothing is filled in, and every stats file of
every format holds finite numbers only; verify refuses what a trainer could not use."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset, state_value

from eva_export.config import parse_config
from eva_export.export.merge import ORIGINS_KEY
from eva_export.export.paths import ExportPaths
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats.common.card import CARD_FILE
from eva_export.formats.common.nonfinite import RUNS_KEY, kept_of
from eva_export.formats.common.table import to_numpy
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED

FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store")
RED = [{"code": "non_finite", "severity": "error", "detail": "observation.state NaN"}]
FRAMES = 60
# source episode 1: NaN at the start (0-4), inf in the middle (25), NaN (28) leaving a 2-frame
# run (26-27, shorter than the minimum), NaN at the end (55-59)
BURSTS = {0: np.nan, 1: np.nan, 2: np.nan, 3: np.nan, 4: np.nan, 25: np.inf, 28: -np.inf,
          55: np.nan, 56: np.nan, 57: np.nan, 58: np.nan, 59: np.nan}
RUNS = [(5, 25), (29, 55)]
pytestmark = pytest.mark.timeout(600)


def set_state(root: Path, episode: int, rows: dict[int, float], column: int | None = 2) -> None:
    """Write non-finite values into one raw episode's observation.state (``column`` None: every
    row of element 0, a whole-NaN element)."""
    path = root / f"data/chunk-000/episode_{episode:06d}.parquet"
    table = pq.read_table(path)
    i = table.schema.get_field_index("observation.state")
    typ = table.schema.field(i).type
    values = to_numpy(table.column(i)).reshape(table.num_rows, -1).copy()
    if column is None:
        values[:, 0] = np.nan
    for r, v in rows.items():
        values[r, column or 0] = v
    col = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=typ.value_type), typ.list_size)
    pq.write_table(table.set_column(i, table.schema.field(i), col), path)


def raw_source(root: Path) -> Path:
    """0 green; 1 red, passed, NaN/inf runs at start, middle and end; 2 red, passed, element 0 NaN
    in every row; 3 green; 4 red, not passed (rejected) with NaN."""
    src = make_dataset(root, [Ep(40), Ep(FRAMES, "red", RED, verdict="pass"), Ep(30, "red", RED, verdict="pass"),
                              Ep(35), Ep(20, "red", RED)], cameras=1, width=32, height=24)
    set_state(src, 1, BURSTS)
    set_state(src, 2, {}, column=None)
    set_state(src, 4, {3: np.nan})
    return src


def run(root: Path, sources: Any, fmt: str, name: str | None = None, **export: Any):  # type: ignore[no-untyped-def]
    cfg = parse_config({"collection": {"log_dir": str(root)}, "export": {"workers": 1, **export}})
    svc = ExportService(cfg, background=False, recover=False)
    return svc.run(sources, fmt, name) if name else svc.run(sources, fmt)


def numbers(obj: Any) -> list[float]:
    """Every number in a JSON value (None counts as a non-number: nulls are no statistics)."""
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in numbers(v)]
    if obj is None:
        return [math.nan]
    return [float(obj)] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def stats_files(d: Path) -> dict[str, list[float]]:
    """Every statistic a format writes: stats.json, episodes_stats.jsonl, v3's episode stats
    columns, eva_store's manifest."""
    out = {"meta/stats.json": numbers(json.loads((d / "meta/stats.json").read_text()))}
    if (d / "meta/episodes_stats.jsonl").is_file():
        out["meta/episodes_stats.jsonl"] = numbers([json.loads(x)["stats"] for x in
                                                    (d / "meta/episodes_stats.jsonl").read_text().splitlines()])
    for f in glob.glob(str(d / "meta/episodes/*/*.parquet")):
        t = pq.read_table(f)
        out[f] = numbers([t.column(c).to_pylist() for c in t.column_names if c.startswith("stats/")])
    for f in glob.glob(str(d / "**/manifest.json"), recursive=True):
        m = json.loads(Path(f).read_text())
        if "stats" in m:
            out[f] = numbers(m["stats"])
    return out


def assert_all_finite(d: Path) -> None:
    files = stats_files(d)
    assert files["meta/stats.json"], d
    for name, vals in files.items():
        assert vals and all(math.isfinite(v) for v in vals), f"{d}: {name} holds a non-finite number"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("runs")
    src = raw_source(root / "demo" / "raw")
    return {"src": src, "root": root, "jobs": {fmt: run(root, src, fmt) for fmt in FORMATS}}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_exports_the_finite_runs_verified_with_finite_stats(exported: dict[str, Any], fmt: str) -> None:
    job, src = exported["jobs"][fmt], exported["src"]
    assert job.state == COMPLETED, job.error
    # 0, the two long runs of 1, 3 (2 has no finite frame: dropped whole); 4 rejected
    assert (job.accepted_episodes, job.accepted_frames) == (4, 40 + 20 + 26 + 35)
    assert (job.nonfinite_cut_episodes, job.nonfinite_dropped_frames) == (2, FRAMES - 46 + 30)
    assert job.nonfinite_kept_episodes == 0 and job.warning == ""
    paths = ExportPaths.of(src, fmt)
    for d in (paths.accepted, paths.rejected):
        rep = verify_export(d)
        assert rep.ok, rep.errors
        assert any(c.startswith("meta/stats.json: ") and "every number finite" in c for c in rep.checks), rep.checks
        assert_all_finite(d)
    marker = QualitySplit.read(paths.accepted)
    assert marker.source_episode_indices == [0, 1, 1, 3]
    cut = {c["source_episode_index"]: c for c in marker.extra[RUNS_KEY]}
    assert cut[1]["runs"] == [list(r) for r in RUNS] and cut[1]["dropped_runs"] == 1
    assert cut[1]["dropped_frames"] == FRAMES - 46 and cut[1]["features"] == {"observation.state": len(BURSTS)}
    assert cut[2]["runs"] == [] and cut[2]["dropped_frames"] == 30 and cut[2]["features"] == {"observation.state": 30}
    assert kept_of(marker) == ()
    card = (paths.accepted / CARD_FILE).read_text(encoding="utf-8")
    assert "2 passed source episode(s) held NaN/inf values. Each is exported as its finite runs" in card
    assert "| 1 | observation.state: 12 | 60 | [5, 25) [29, 55) | 1 | 14 |" in card
    rej = kept_of(QualitySplit.read(paths.rejected))  # the rejected one is recorded, kept for review
    assert [(e.source_episode_index, e.features) for e in rej] == [(4, (("observation.state", 1),))]


def test_runs_hold_the_recorded_rows_and_frames_with_their_provenance(exported: dict[str, Any]) -> None:
    """The native export read back: rows bit-exact, renumbered, timestamps from 0 on the grid,
    the camera cut to the same frames, the row naming source episode and frame range."""
    d = ExportPaths.of(exported["src"], "lerobot_v21").accepted
    rows = [json.loads(x) for x in (d / "meta/episodes.jsonl").read_text().splitlines()]
    offset = 40
    for new, (a, b) in zip((1, 2), RUNS, strict=True):
        row = rows[new]
        assert row["finite_run"] == {"source_episode_index": 1, "from_frame": a, "to_frame": b}
        assert row["source_episode_index"] == 1 and row["length"] == b - a and row["qc_verdict"] == "pass"
        t = pq.read_table(d / f"data/chunk-000/episode_{new:06d}.parquet")
        state = to_numpy(t.column("observation.state"))
        want = np.stack([state_value(1, f) for f in range(a, b)])
        np.testing.assert_array_equal(state, want)  # not one value invented or changed
        assert to_numpy(t.column("frame_index")).tolist() == list(range(b - a))
        assert to_numpy(t.column("episode_index")).tolist() == [new] * (b - a)
        assert to_numpy(t.column("index")).tolist() == list(range(offset, offset + b - a))
        np.testing.assert_allclose(to_numpy(t.column("timestamp")), np.arange(b - a) / 30, atol=1e-6)
        with av.open(str(d / f"videos/chunk-000/observation.images.cam0/episode_{new:06d}.mp4")) as c:
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert len(frames) == b - a
        # dsfactory paints frame f's red channel (8 f) mod 256: the run's first and last frames
        assert abs(float(frames[0][..., 0].mean()) - (8 * a) % 256) < 4
        assert abs(float(frames[-1][..., 0].mean()) - (8 * (b - 1)) % 256) < 4
        offset += b - a
    stats = json.loads((d / "meta/stats.json").read_text())["observation.state"]
    assert stats["count"] == [40 + 20 + 26 + 35]


def test_min_run_is_configurable_and_runs_below_it_are_dropped(tmp_path: Path) -> None:
    src = raw_source(tmp_path / "demo" / "raw")
    job = run(tmp_path, src, "lerobot_v21", nonfinite_min_run=21)  # the 20-frame run goes too
    assert job.state == COMPLETED, job.error
    marker = QualitySplit.read(ExportPaths.of(src, "lerobot_v21").accepted)
    cut = {c["source_episode_index"]: c for c in marker.extra[RUNS_KEY]}
    assert cut[1]["runs"] == [[29, 55]] and cut[1]["dropped_runs"] == 2 and cut[1]["min_frames"] == 21
    assert job.accepted_episodes == 3 and marker.source_episode_indices == [0, 1, 3]


def test_keep_says_it_will_not_train_and_verify_accepts_only_what_is_recorded(tmp_path: Path) -> None:
    src = raw_source(tmp_path / "demo" / "raw")
    job = run(tmp_path, src, "lerobot_v3", nonfinite="keep_passed")
    assert job.state == COMPLETED, job.error
    assert job.nonfinite_kept_episodes == 2 and "will not train as is" in job.warning
    acc = ExportPaths.of(src, "lerobot_v3").accepted
    rep = verify_export(acc)
    assert rep.ok, rep.errors
    assert any("this subset will not train as is" in c for c in rep.checks), rep.checks
    assert_all_finite(acc)  # the values are kept; the statistics still only hold finite rows
    stats = json.loads((acc / "meta/stats.json").read_text())["observation.state"]
    assert stats["count"] == [40 + (FRAMES - len(BURSTS)) + 35]  # episode 2 has no finite row
    card = (acc / CARD_FILE).read_text(encoding="utf-8")
    assert "will not train as is" in card and "left out of meta/stats.json" in card


def test_a_merged_set_pools_finite_stats_and_keeps_each_runs_origin(tmp_path: Path) -> None:
    a = raw_source(tmp_path / "a" / "raw")
    b = make_dataset(tmp_path / "b" / "raw", [Ep(25), Ep(30, "red", RED, verdict="pass")], cameras=1,
                     width=32, height=24)
    set_state(b, 1, {10: np.nan})  # runs [0, 10) and [11, 30)
    for fmt in ("lerobot_v3", "lerobot_v21"):
        job = run(tmp_path, [a, b], fmt, "merged")
        assert job.state == COMPLETED, job.error
        acc = tmp_path / "merged" / "export" / fmt / "accepted"
        assert job.accepted_episodes == 4 + 3
        rep = verify_export(acc)
        assert rep.ok, rep.errors
        assert_all_finite(acc)
        marker = QualitySplit.read(acc)
        origins = [(Path(o["source_dataset"]).parent.name, o["source_episode_index"]) for o in marker.extra[ORIGINS_KEY]]
        assert origins == [("a", 0), ("a", 1), ("a", 1), ("a", 3), ("b", 0), ("b", 1), ("b", 1)]
        stats = json.loads((acc / "meta/stats.json").read_text())["observation.state"]
        assert stats["count"] == [121 + 25 + 29]


# ---- verify refuses what a trainer cannot use ------------------------------------------------------

def clean_export(tmp_path: Path, fmt: str) -> Path:
    src = make_dataset(tmp_path / "demo" / "raw", [Ep(20), Ep(22)], cameras=1, width=32, height=24)
    job = run(tmp_path, src, fmt)
    assert job.state == COMPLETED, job.error
    acc = ExportPaths.of(src, fmt).accepted
    assert verify_export(acc).ok
    return acc


def edit_json(path: Path, change: Any) -> None:
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_refuses_non_finite_or_incomplete_stats(tmp_path: Path, fmt: str) -> None:
    acc = clean_export(tmp_path, fmt)
    edit_json(acc / "meta/stats.json", lambda s: s["observation.state"]["mean"].__setitem__(0, float("nan")))
    errors = verify_export(acc).errors
    assert any("meta/stats.json: would not normalise for a trainer: observation.state: non-finite ['mean']" in e
               for e in errors), errors
    edit_json(acc / "meta/stats.json", lambda s: s["action"].pop("q99"))
    errors = verify_export(acc).errors
    assert any("action: lacks ['q99']" in e for e in errors), errors


def test_verify_refuses_unrecorded_non_finite_values_and_off_grid_timestamps(tmp_path: Path) -> None:
    acc = clean_export(tmp_path, "lerobot_v21")
    path = acc / "data/chunk-000/episode_000001.parquet"
    table = pq.read_table(path)
    i = table.schema.get_field_index("action")
    typ = table.schema.field(i).type
    vals = to_numpy(table.column(i)).reshape(table.num_rows, -1).copy()
    vals[7, 3] = np.inf
    table = table.set_column(i, table.schema.field(i),
                             pa.FixedSizeListArray.from_arrays(pa.array(vals.reshape(-1), type=typ.value_type), 6))
    j = table.schema.get_field_index("timestamp")
    ts = to_numpy(table.column(j)).copy()
    ts[5:] += 0.01  # a jump of 10 ms: frame 5 onwards off the grid
    pq.write_table(table.set_column(j, table.schema.field(j), pa.array(ts, type=pa.float32())), path)
    errors = verify_export(acc).errors
    assert any(f"{path}: episode 1: action holds 1 NaN/inf value(s) that meta/quality_split.json does not record"
               in e for e in errors), errors
    assert any(f"{path}: episode 1: timestamp of frame 5 is" in e and "off the 1/30 s grid" in e for e in errors), errors


def test_the_raw_datasets_own_statistics_are_finite(tmp_path: Path) -> None:
    """The capture writer's stats: a joint NaN in every frame and an action NaN burst."""
    from dsfactory import features, image

    from eva_export.formats.lerobot_v21.writer import DatasetWriter

    dw = DatasetWriter.open(tmp_path / "raw", fps=30, features=features(1, 32, 24), robot_type="test")
    w = dw.begin_episode("pick the cube")
    for f in range(20):
        s = state_value(0, f)
        s[0] = np.nan  # one joint never reports
        a = -state_value(0, f)
        if 5 <= f < 8:
            a[:] = np.inf
        w.add_frame({"observation.state": s, "action": a, "capture_time": 1000.0 + f / 30},
                    {"observation.images.cam0": image(0, f, 0, 32, 24)})
    w.finish()
    dw.commit(w, {"quality": "red", "quality_issues": RED})
    assert_all_finite(tmp_path / "raw")
    stats = json.loads((tmp_path / "raw/meta/stats.json").read_text())
    assert stats["observation.state"]["count"] == [0]  # no row went in: identity numbers, said by the count
    assert stats["action"]["count"] == [17] and stats["action"]["max"][0] == 0.0  # frames 5-7 left out
