"""A table of malformed export sources: each is refused before anything is written, with a
message naming the raw file and the raw episode index, and the published pair stays as it was.

Each case starts from a copy of a good dataset that already has a published lerobot_v21 pair
(built once per module with tests/dsfactory.py, or LeRobot's own v2.1 fixture) and breaks one
thing. The broken episode is raw episode 2, which the split would renumber to accepted
episode 1, so a message with a renumbered index or a staging path is caught.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset, replace_video

from eva_export.config import parse_config
from eva_export.errors import EvaError
from eva_export.export.runner import ExportService
from eva_export.fsutil import read_json
from eva_export.jobs import COMPLETED, FAILED

FIXTURE_V21 = Path(__file__).parent / "fixtures" / "lerobot-written" / "v21"
CAM = "observation.images.cam0"
P2 = "data/chunk-000/episode_000002.parquet"
V2 = f"videos/chunk-000/{CAM}/episode_000002.mp4"
FIX_CAM = "observation.images.cam"
FIX_P1 = "data/chunk-000/episode_000001.parquet"
FIX_V1 = f"videos/chunk-000/{FIX_CAM}/episode_000001.mp4"


# ---- mutations ------------------------------------------------------------------------------------
def edit_json(rel: str, fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        d = read_json(raw / rel)
        fn(d)
        (raw / rel).write_text(json.dumps(d))
    return apply


def info(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    return edit_json("meta/info.json", fn)


def set_info(**kw: object) -> Callable[[Path], None]:
    return info(lambda d: d.update(kw))


def edit_rows(name: str, fn: Callable[[list[dict]], list[dict]]) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        path = raw / "meta" / name
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps(r) + "\n" for r in fn(rows)))
    return apply


def episode_row(index: int, **kw: object) -> Callable[[Path], None]:
    def fn(rows: list[dict]) -> list[dict]:
        for r in rows:
            if r["episode_index"] == index:
                r.update(kw)
        return rows
    return edit_rows("episodes.jsonl", fn)


def truncate(rel: str, keep: float = 0.5) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        data = (raw / rel).read_bytes()
        (raw / rel).write_bytes(data[: int(len(data) * keep)])
    return apply


def garbage(rel: str) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        (raw / rel).write_bytes(np.random.default_rng(1).bytes(4096))
    return apply


def empty(rel: str) -> Callable[[Path], None]:
    return lambda raw: (raw / rel).write_bytes(b"")


def remove(rel: str) -> Callable[[Path], None]:
    return lambda raw: (raw / rel).unlink()


def link_out(rel: str) -> Callable[[Path], None]:
    """Replace a file by a symlink to an identical copy outside the data root."""
    def apply(raw: Path) -> None:
        outside = raw.parents[2] / "outside" / Path(rel).name
        outside.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(raw / rel, outside)
        (raw / rel).unlink()
        (raw / rel).symlink_to(outside)
    return apply


def link_meta_dir_out(raw: Path) -> None:
    outside = raw.parents[2] / "outside" / "meta"
    shutil.copytree(raw / "meta", outside)
    shutil.rmtree(raw / "meta")
    (raw / "meta").symlink_to(outside)


def rewrite_table(rel: str, fn: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        t = pq.read_table(raw / rel)
        pq.write_table(fn(t), raw / rel)
    return apply


def set_column(name: str, make: Callable[[pa.Table], pa.Array]) -> Callable[[pa.Table], pa.Table]:
    def fn(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(name)
        arr = make(t)
        return t.set_column(i, pa.field(name, arr.type), arr)
    return fn


def timestamps(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    def make(t: pa.Table) -> pa.Array:
        ts = t.column("timestamp").to_numpy().astype(np.float32).copy()
        return pa.array(fn(ts), type=pa.float32())
    return rewrite_table(P2, set_column("timestamp", make))


def at(i: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def fn(ts: np.ndarray) -> np.ndarray:
        ts[i] = value
        return ts
    return fn


def faststart(rel: str) -> Callable[[Path], None]:
    """Rewrite an MP4 with its index (moov) first, as a web-optimised copy would be."""
    def apply(raw: Path) -> None:
        tmp = raw / "faststart.tmp.mp4"
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(raw / rel), "-c", "copy", "-movflags", "faststart",
                        str(tmp)], check=True)
        os.replace(tmp, raw / rel)
    return apply


def stray(rel: str, like: str) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(raw / like, raw / rel)
    return apply


def feature(key: str, value: dict | None) -> Callable[[Path], None]:
    def fn(d: dict) -> None:
        if value is None:
            d["features"].pop(key)
        else:
            d["features"][key] = value
    return info(fn)


def both(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        for f in fns:
            f(raw)
    return apply


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Path], None]
    expect: tuple[str, ...]  # substrings of the error: the raw file and the raw episode index
    base: str = "factory"  # or "fixture" (LeRobot-written v21)


def _ep2(*extra: str) -> tuple[str, ...]:
    return ("episode 2",) + extra


INFO = "meta/info.json"
CASES = [
    # Parquet files
    Case("parquet_truncated", truncate(P2), _ep2(P2)),
    Case("parquet_garbage", garbage(P2), _ep2(P2)),
    Case("parquet_empty", empty(P2), _ep2(P2)),
    Case("parquet_missing", remove(P2), _ep2(P2, "missing")),
    Case("rows_more_than_length", episode_row(2, length=11), _ep2(P2, "length 11")),
    Case("rows_fewer_than_length", episode_row(2, length=13), _ep2(P2, "length 13")),
    Case("zero_length_row", episode_row(2, length=0), _ep2("episodes.jsonl", "empty")),
    # MP4 files
    Case("mp4_truncated", truncate(V2), _ep2(V2)),
    Case("mp4_tail_cut", truncate(V2, 0.98), _ep2(V2)),
    Case("mp4_faststart_mdat_cut", both(faststart(V2), truncate(V2, 0.9)), _ep2(V2, "needs")),
    Case("mp4_garbage", garbage(V2), _ep2(V2)),
    Case("mp4_empty", empty(V2), _ep2(V2)),
    Case("mp4_missing", remove(V2), _ep2(V2, "missing")),
    Case("mp4_fewer_frames", lambda raw: replace_video(raw, CAM, 2, 9, 32, 24), _ep2(V2, "9 frames", "12 rows")),
    Case("mp4_more_frames", lambda raw: replace_video(raw, CAM, 2, 15, 32, 24), _ep2(V2, "15 frames", "12 rows")),
    Case("mp4_wrong_size", lambda raw: replace_video(raw, CAM, 2, 12, 48, 24), _ep2(V2, "48x24", "32x24")),
    # Declared vs stored
    Case("shape_declared_wider", info(lambda d: d["features"]["observation.state"].update(shape=[7])),
         ("episode 0", "episode_000000.parquet", "observation.state", INFO)),
    Case("dtype_declared_float64", info(lambda d: d["features"]["action"].update(dtype="float64")),
         ("episode 0", "episode_000000.parquet", "action", "float64")),
    Case("strings_where_floats", rewrite_table(P2, set_column(
        "capture_time", lambda t: pa.array([str(v) for v in t.column("capture_time").to_pylist()]))),
         _ep2(P2, "capture_time", "string")),
    Case("declared_column_absent", feature("observation.extra", {"dtype": "float32", "shape": [1], "names": None}),
         ("episode 0", "episode_000000.parquet", "observation.extra")),
    Case("unsupported_dtype", info(lambda d: d["features"]["action"].update(dtype="complex128")),
         (INFO, "action")),
    Case("shape_zero", info(lambda d: d["features"]["action"].update(shape=[0])), (INFO, "action")),
    Case("video_shape_not_hwc", info(lambda d: d["features"][CAM].update(shape=[24, 32])), (INFO, CAM)),
    # Timestamps and fps
    Case("timestamp_nan", timestamps(at(3, float("nan"))), _ep2(P2, "not finite", "frame 3")),
    Case("timestamp_inf", timestamps(at(4, float("inf"))), _ep2(P2, "not finite", "frame 4")),
    Case("timestamp_off_grid", timestamps(lambda ts: ts + np.float32(0.01)), _ep2(P2, "off the 30 fps grid")),
    Case("timestamp_shuffled", timestamps(lambda ts: ts[::-1].copy()), _ep2(P2, "grid")),
    Case("fps_zero", set_info(fps=0), (INFO, "fps", "positive integer")),
    Case("fps_non_integer", set_info(fps=29.97), (INFO, "fps", "29.97")),
    Case("fps_negative", set_info(fps=-30), (INFO, "fps")),
    Case("fps_string", set_info(fps="30"), (INFO, "fps")),
    Case("chunks_size_zero", set_info(chunks_size=0), (INFO, "chunks_size")),
    Case("codebase_v3", set_info(codebase_version="v3.0"), (INFO, "codebase_version")),
    Case("info_garbage", lambda raw: (raw / INFO).write_text("{not json"), (INFO,)),
    Case("info_lacks_features", info(lambda d: d.pop("features")), (INFO, "features")),
    # Indices and tasks
    Case("duplicate_episode_row", edit_rows("episodes.jsonl", lambda r: r + [dict(r[2])]),
         ("episodes.jsonl", "episode_index 2", "twice")),
    Case("missing_episode_row", edit_rows("episodes.jsonl", lambda r: [r[0], r[2]]),
         ("episodes.jsonl", "missing [1]")),
    Case("episodes_out_of_order", edit_rows("episodes.jsonl", lambda r: [r[0], r[2], r[1]]),
         ("episodes.jsonl", "[0, 2, 1]")),
    Case("episodes_jsonl_garbage", lambda raw: (raw / "meta/episodes.jsonl").write_text("{\n"), ("episodes.jsonl",)),
    Case("episode_index_column_wrong", rewrite_table(P2, set_column(
        "episode_index", lambda t: pa.array(np.zeros(t.num_rows, np.int64)))), _ep2(P2, "episode_index")),
    Case("index_column_duplicate", rewrite_table(P2, set_column(
        "index", lambda t: pa.array(np.full(t.num_rows, 21, np.int64)))), _ep2(P2, "index column")),
    Case("frame_index_wrong", rewrite_table(P2, set_column(
        "frame_index", lambda t: pa.array(np.arange(t.num_rows, dtype=np.int64) + 1))), _ep2(P2, "frame_index")),
    Case("unknown_task_row", episode_row(2, tasks=["dance"]), _ep2("dance", "tasks.jsonl")),
    Case("unknown_task_index", rewrite_table(P2, set_column(
        "task_index", lambda t: pa.array(np.full(t.num_rows, 7, np.int64)))), _ep2(P2, "task_index 7")),
    Case("missing_video_stats", edit_rows("episodes_stats.jsonl", lambda rows: [
        {**r, "stats": {k: v for k, v in r["stats"].items() if k != CAM}} if r["episode_index"] == 2 else r
        for r in rows]), _ep2(CAM, "episodes_stats.jsonl")),
    # Path templates and keys from info.json
    Case("data_path_absolute", set_info(data_path="/tmp/data/episode_{episode_index:06d}.parquet"),
         (INFO, "data_path", "relative")),
    Case("data_path_dotdot", set_info(data_path="data/../../../episode_{episode_index:06d}.parquet"),
         (INFO, "data_path", "'..'")),
    Case("video_path_absolute", set_info(video_path="/some/{video_key}/episode_{episode_index:06d}.mp4"),
         (INFO, "video_path", "relative")),
    Case("video_path_dotdot", set_info(video_path="videos/../../{video_key}/episode_{episode_index:06d}.mp4"),
         (INFO, "video_path", "'..'")),
    Case("data_path_no_episode", set_info(data_path="data/chunk-{episode_chunk:03d}/all.parquet"),
         (INFO, "data_path", "placeholders")),
    Case("data_path_attribute", set_info(data_path="data/{episode_index.__class__}.parquet"), (INFO, "data_path")),
    Case("data_path_not_parquet", set_info(data_path="data/chunk-{episode_chunk:03d}/e_{episode_index:06d}.mcap"),
         (INFO, "data_path", ".parquet")),
    Case("video_key_traversal", feature("../../evil", {"dtype": "video", "shape": [24, 32, 3], "names": None}),
         (INFO, "../../evil")),
    # Symlinks out of the dataset
    Case("parquet_symlinked_out", link_out(P2), _ep2(P2, "outside")),
    Case("mp4_symlinked_out", link_out(V2), _ep2(V2, "outside")),
    Case("info_symlinked_out", link_out(INFO), (INFO, "outside")),
    Case("episodes_symlinked_out", link_out("meta/episodes.jsonl"), ("episodes.jsonl", "outside")),
    Case("meta_dir_symlinked_out", link_meta_dir_out, (INFO, "outside")),
    # Stray files (an interrupted capture)
    Case("stray_parquet", stray("data/chunk-000/episode_000009.parquet", P2),
         ("episode_000009.parquet", "episodes.jsonl", "To recover")),
    Case("stray_mp4", stray(f"videos/chunk-000/{CAM}/episode_000007.mp4", V2),
         ("episode_000007.mp4", "raw/.orphans", "To recover")),
    # Derived from LeRobot's own v2.1 output (av1 video, no quality fields)
    Case("fixture_mp4_truncated", truncate(FIX_V1), ("episode 1", FIX_V1), "fixture"),
    Case("fixture_mp4_garbage", garbage(FIX_V1), ("episode 1", FIX_V1), "fixture"),
    Case("fixture_fps_non_integer", set_info(fps=29.97), (INFO, "29.97"), "fixture"),
    Case("fixture_video_path_absolute", set_info(video_path="/etc/{video_key}/e_{episode_index:06d}.mp4"),
         (INFO, "video_path"), "fixture"),
    Case("fixture_stray_file", stray("data/chunk-000/episode_000005.parquet", FIX_P1),
         ("episode_000005.parquet", "To recover"), "fixture"),
    Case("fixture_nan_timestamp", rewrite_table(FIX_P1, set_column(
        "timestamp", lambda t: pa.array([float("nan")] * t.num_rows, pa.float32()))),
         ("episode 1", FIX_P1, "not finite"), "fixture"),
    Case("fixture_task_unknown", episode_row(1, tasks=["juggle"]), ("episode 1", "juggle"), "fixture"),
]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)


# ---- the published baseline ---------------------------------------------------------------------
def _service(log_dir: Path) -> ExportService:
    return ExportService(parse_config({"collection": {"log_dir": str(log_dir)}}), background=False, recover=False)


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per base, a log dir whose raw dataset exported cleanly (the pair is published)."""
    out = {}
    base = tmp_path_factory.mktemp("baseline")
    log = base / "factory" / "logs"
    make_dataset(log / "demo" / "raw", [Ep(frames=10), Ep(frames=11, quality="red"), Ep(frames=12),
                                        Ep(frames=13, quality="red")], cameras=1, width=32, height=24)
    out["factory"] = log
    log = base / "fixture" / "logs"
    shutil.copytree(FIXTURE_V21, log / "demo" / "raw")
    out["fixture"] = log
    for name, log in out.items():
        job = _service(log).run(log / "demo" / "raw", "lerobot_v21")
        assert job.state == COMPLETED, f"{name}: {job.error}"
        pair = log / "demo" / "export" / "lerobot_v21"
        modes = {p.stat().st_mode & 0o777 for p in pair.rglob("*") if p.is_file()}
        assert modes == {0o644}, f"{name}: meta and data files differ in mode: {sorted(map(oct, modes))}"
    return out


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under root (hidden ones included): size, mtime and inode."""
    snap = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath) / n
            st = p.lstat()
            snap[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return snap


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_source_is_refused(case: Case, baselines: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "logs"
    shutil.copytree(baselines[case.base], log, symlinks=True)
    raw = log / "demo" / "raw"
    export = log / "demo" / "export"
    case.mutate(raw)
    before_export, before_raw = snapshot(export), snapshot(raw)
    svc = _service(log)
    try:
        job = svc.run(raw, "lerobot_v21")
        assert job.state == FAILED, f"{case.name} was exported"
        error = job.error
    except EvaError as exc:  # refused at the request (before any job): also fine
        error = str(exc)
    assert snapshot(export) == before_export, "the published pair (or its staging) changed"
    assert snapshot(raw) == before_raw, "validation wrote into the source"
    for want in case.expect:
        assert want in error, f"{case.name}: {want!r} not in {error!r}"
    assert ".staging" not in error and "/export/" not in error
    if "episode 2" in case.expect:
        assert "episode 1" not in error  # never the renumbered index
    assert len(error) < 2000


def test_an_export_is_not_a_source(baselines: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "logs"
    shutil.copytree(baselines["factory"], log, symlinks=True)
    export = log / "demo" / "export"
    before = snapshot(export)
    svc = _service(log)
    copied = log / "copied"
    shutil.copytree(export / "lerobot_v21" / "accepted", copied)
    for src in (export / "lerobot_v21" / "rejected", export / "lerobot_v21", copied):
        with pytest.raises(EvaError, match="not a source"):
            svc.run(src, "lerobot_v21")
    assert snapshot(export) == before
    assert not (export / "lerobot_v21" / "rejected_export").exists() and not (log / "copied_export").exists()


def test_good_sources_still_export(baselines: dict[str, Path], tmp_path: Path) -> None:
    """The checks refuse faults, not LeRobot's own output nor ours (a rerun completes)."""
    for name, base in baselines.items():
        log = tmp_path / name
        shutil.copytree(base, log, symlinks=True)
        job = _service(log).run(log / "demo" / "raw", "lerobot_v21")
        assert job.state == COMPLETED, f"{name}: {job.error}"
        pair = log / "demo" / "export" / "lerobot_v21"
        modes = {p.stat().st_mode & 0o777 for p in pair.rglob("*") if p.is_file()}
        assert modes == {0o644}, f"{name}: meta and data files differ in mode: {sorted(map(oct, modes))}"
