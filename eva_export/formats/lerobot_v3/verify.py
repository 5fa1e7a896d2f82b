"""LeRobot v3.0 verifier: what LeRobot 0.4's reader relies on, checked on the files.

Episode metadata in order with contiguous global ranges; data shards whose ``index`` column
is the global row position; for every camera MP4, decode times strictly increasing, frames on
the fps grid (LeRobot's 1e-4 s tolerance), a stated duration covering the episodes'
``to_timestamp`` and frame counts matching the rows; every embedded image decoding to its
declared shape; tasks.parquet mapping indices and strings one to one.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ...errors import ExportError, VideoError
from ..common.checks import ExportInfo, check_image_rows, check_sample, check_totals, start_report
from ..common.exporter import VerifyReport
from ..common.images import decode_png
from ..common.records import DatasetInfo
from ..common.train_checks import ValueCheck, check_stats
from ..lerobot_v21.subset import column_numpy, state_action_keys
from .layout import CODEBASE_V30, EPISODES_DIR, EPISODES_GLOB, FORMAT, TASKS_PARQUET
from .timing import shard_timing_problems

LOCATOR_COLUMNS = ("episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                   "dataset_from_index", "dataset_to_index")


def read_columns(path: Path, columns: list[str] | None = None, optional: tuple[str, ...] = ()) -> pa.Table:
    """``columns`` of a Parquet file (all when None), plus those of ``optional`` it holds. Not
    pq.read_table: its dataset layer imports pyarrow.compute (0.2-0.4 s of a verify that reads a
    few small files) and resolves the path's filesystem on every call."""
    with pa.OSFile(str(path)) as fh, pq.ParquetFile(fh) as pf:  # never over a Python file object
        if columns is not None:
            columns = [*columns, *(c for c in optional if c in pf.schema_arrow.names and c not in columns)]
            lacking = [c for c in columns if c not in pf.schema_arrow.names]
            if lacking:
                raise pa.ArrowInvalid(f"{path.name} lacks the columns {lacking}")
        return pf.read(columns=columns)


def read_episodes_meta(root: Path, columns: list[str] | None = None) -> pa.Table:
    """meta/episodes (every file, in order); ``columns``: only these (a file lacking one is an error
    naming it and the columns)."""
    files = sorted((root / EPISODES_DIR).glob(EPISODES_GLOB))
    if not files:
        raise ValueError(f"{root}: no meta/episodes/chunk-*/file-*.parquet")
    return pa.concat_tables([read_columns(f, columns) for f in files], promote_options="permissive")


def decode_frame_at(path: Path, frame_number: int, fps: int) -> NDArray[np.uint8]:
    """Decode the frame shown at ``frame_number / fps`` seconds of an MP4 (seek, then decode)."""
    import av  # only the reading spot checks decode: the rest of verification reads boxes

    target = Fraction(frame_number, fps)
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        tb = s.time_base or Fraction(1, fps)
        c.seek(int(target / tb), stream=s, backward=True, any_frame=False)
        for frame in c.decode(s):
            if frame.pts is None:
                continue
            t = Fraction(frame.pts) * tb
            if abs(t - target) < Fraction(1, 10000):
                return cast("NDArray[np.uint8]", frame.to_ndarray(format="rgb24"))  # rgb24: 8 bits per channel
            if t > target:
                break
    raise VideoError(f"{path}: no frame at {float(target):.4f} s (frame {frame_number})")


def verify_v3(root: Path) -> VerifyReport:
    report, info = start_report(root, FORMAT)
    if info is None:
        return report
    if info.raw.get("codebase_version") != CODEBASE_V30:
        report.errors.append(f"info.json codebase_version {info.raw.get('codebase_version')!r}, expected v3.0")
    for key in ("total_videos", "total_chunks"):
        if key in info.raw:
            report.errors.append(f"info.json has {key}, which LeRobot v3.0 dropped")
    fps = info.fps
    video_keys = info.keys_of("video")
    cols = [*LOCATOR_COLUMNS, *(f"videos/{k}/{c}" for k in video_keys
                                for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"))]
    try:  # the locators only: the stats and source fields are not what a reader locates by
        eps = read_episodes_meta(root, cols).to_pylist()
    except (ValueError, OSError, pa.ArrowException) as exc:
        report.errors.append(str(exc))
        return report
    n_err = len(report.errors)
    # episode order and global ranges
    expect_from = 0
    data_files: dict[tuple[int, int], list[dict[str, Any]]] = {}
    video_files: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for pos, e in enumerate(eps):
        if e["episode_index"] != pos:
            report.errors.append(f"episode metadata row {pos} has episode_index {e['episode_index']}")
        if e["dataset_from_index"] != expect_from or e["dataset_to_index"] - e["dataset_from_index"] != e["length"]:
            report.errors.append(f"episode {pos}: range [{e['dataset_from_index']}, {e['dataset_to_index']}) is not "
                                 f"contiguous from {expect_from} with length {e['length']}")
        expect_from = e["dataset_to_index"]
        data_files.setdefault((e["data/chunk_index"], e["data/file_index"]), []).append(e)
        for key in video_keys:
            video_files.setdefault((key, e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"]), []).append(e)
    check_totals(report, info, len(eps), expect_from, "the episode metadata")
    _check_data_shards(report, root, info, data_files)
    for (key, chunk, file), members in sorted(video_files.items()):
        path = root / info.video_path.format(video_key=key, chunk_index=chunk, file_index=file)
        _check_video_shard(report, root, path, key, members, fps)
    _check_image_rows(report, root, info, data_files)
    if len(report.errors) == n_err:
        report.checks.append(f"locators: {len(eps)} episodes contiguous, {len(data_files)} data shard(s) with "
                             f"matching index, {len(video_files)} video shard(s) whose frame counts match the "
                             "from/to timestamps")
    _check_tasks(report, root, info, eps)
    check_stats(report, root, info, empty=not eps)
    _real_read(report, root, info, eps, data_files)
    return report


def _check_video_shard(report: VerifyReport, root: Path, path: Path, key: str, members: list[dict[str, Any]],
                       fps: int) -> None:
    """Locator timestamps from frame counts; the MP4's own timing as a consumer's lookup reads it."""
    frames = 0
    for e in members:
        f0, f1 = e[f"videos/{key}/from_timestamp"], e[f"videos/{key}/to_timestamp"]
        if abs(f0 - frames / fps) > 1e-6 or abs(f1 - (frames + e["length"]) / fps) > 1e-6:
            report.errors.append(f"episode {e['episode_index']} {key}: timestamps [{f0}, {f1}] but the shard holds "
                                 f"{frames} frames before it and the episode has {e['length']}")
        frames += e["length"]
    try:
        problems = shard_timing_problems(path, fps, frames)
    except (VideoError, OSError) as exc:
        report.errors.append(f"{path.relative_to(root)}: {exc}")
        return
    eps = [m["episode_index"] for m in members]
    for p in problems:
        report.errors.append(f"{path.relative_to(root)} (episodes {eps[0]}..{eps[-1]}, ending at "
                             f"{members[-1][f'videos/{key}/to_timestamp']:.4f} s): {p}")


def _check_image_rows(report: VerifyReport, root: Path, info: ExportInfo,
                      data_files: dict[tuple[int, int], list[dict[str, Any]]]) -> None:
    """Every embedded image decodes to its declared shape (LeRobot decodes each one it serves)."""
    shapes = info.shapes_of("image")
    if not shapes:
        return
    before = len(report.errors)
    for (chunk, file) in sorted(data_files):
        path = root / info.data_path.format(chunk_index=chunk, file_index=file)
        try:
            t = read_columns(path, [*shapes, "episode_index"])
        except (OSError, pa.ArrowException) as exc:
            report.errors.append(f"{path}: unreadable ({exc})")
            continue
        check_image_rows(report, t, shapes, str(path.relative_to(root)))
    if len(report.errors) == before:
        report.checks.append(f"every embedded image of {len(shapes)} camera(s) decodes to its declared shape")


def _check_tasks(report: VerifyReport, root: Path, info: ExportInfo, eps: list[dict[str, Any]]) -> None:
    """tasks.parquet maps indices and strings one to one and holds every episode's task."""
    try:
        tt = read_columns(root / TASKS_PARQUET)
    except (OSError, pa.ArrowException) as exc:
        report.errors.append(f"{TASKS_PARQUET}: unreadable ({exc})")
        return
    if tt.num_rows != info.raw.get("total_tasks") or "task_index" not in tt.column_names:
        report.errors.append(f"{TASKS_PARQUET}: {tt.num_rows} rows / columns {tt.column_names}, "
                             f"total_tasks {info.raw.get('total_tasks')}")
        return
    names = [c for c in tt.column_names if c != "task_index"]
    texts = [str(v) for v in tt.column(names[0]).to_pylist()] if names else []
    idx = tt.column("task_index").to_pylist()
    if len(set(idx)) != len(idx) or len(set(texts)) != len(texts):
        report.errors.append(f"{TASKS_PARQUET}: task_index values {idx} and tasks {texts} are not one to one")
        return
    unknown = sorted({t for e in eps for t in (e.get("tasks") or []) if t not in texts})
    if unknown:
        report.errors.append(f"{TASKS_PARQUET}: episodes name tasks it does not hold: {unknown[:5]}")
        return
    report.checks.append(f"{TASKS_PARQUET}: {tt.num_rows} task(s), indices and strings one to one")


def _check_data_shards(report: VerifyReport, root: Path, info: ExportInfo,
                       data_files: dict[tuple[int, int], list[dict[str, Any]]]) -> None:
    """Row counts, the global index and episode_index of every data shard; every episode's
    float features and timestamps (train_checks)."""
    data_rows = 0
    values = ValueCheck(root, info)
    for (chunk, file), members in sorted(data_files.items()):
        path = root / info.data_path.format(chunk_index=chunk, file_index=file)
        try:
            t = read_columns(path, ["index", "episode_index"], (*values.floats, "timestamp"))
        except (OSError, pa.ArrowException) as exc:
            report.errors.append(f"{path}: unreadable ({exc})")
            continue
        data_rows += t.num_rows
        lo, hi = members[0]["dataset_from_index"], members[-1]["dataset_to_index"]
        idx = t.column("index").to_numpy()
        if t.num_rows != hi - lo or not np.array_equal(idx, np.arange(lo, hi)):
            report.errors.append(f"{path.name} (chunk {chunk}): {t.num_rows} rows, index does not run {lo}..{hi - 1}")
            continue
        epi = t.column("episode_index").to_numpy()
        for e in members:
            part = epi[e["dataset_from_index"] - lo:e["dataset_to_index"] - lo]
            if not np.all(part == e["episode_index"]):
                report.errors.append(f"{path.name}: rows of episode {e['episode_index']} carry other episode_index")
            rows = t.slice(e["dataset_from_index"] - lo, e["length"])
            values.episode(str(path), e["episode_index"], {k: column_numpy(rows, k) for k in rows.column_names
                                                           if k not in ("index", "episode_index")})
    values.finish(report)
    if data_rows != info.total_frames:
        report.errors.append(f"data shards hold {data_rows} rows, info.json total_frames {info.total_frames}")


def _real_read(report: VerifyReport, root: Path, info: ExportInfo, eps: list[dict[str, Any]],
               data_files: dict[tuple[int, int], list[dict[str, Any]]]) -> None:
    """One state, action and frame of episode 0, found through its locator as LeRobot finds it."""
    fps = info.fps
    video_keys = info.keys_of("video")
    if eps:
        e = eps[0]
        feats = DatasetInfo.from_dict(info.raw)
        state_key, action_key = state_action_keys(feats)
        path = root / info.data_path.format(chunk_index=e["data/chunk_index"], file_index=e["data/file_index"])
        state = action = frame = None
        try:
            t = read_columns(path, [k for k in (state_key, action_key) if k])
            first = data_files[(e["data/chunk_index"], e["data/file_index"])][0]["dataset_from_index"]
            r = e["dataset_from_index"] - first
            state = column_numpy(t, state_key)[r] if state_key else None
            action = column_numpy(t, action_key)[r] if action_key else None
            image_keys = info.keys_of("image")
            if not video_keys and image_keys:
                col = read_columns(path, [image_keys[0]]).column(image_keys[0])[r].as_py()
                frame = decode_png(col["bytes"], f"{path.name} row {r}")
            elif video_keys:
                k = video_keys[0]
                vpath = root / info.video_path.format(video_key=k, chunk_index=e[f"videos/{k}/chunk_index"],
                                                              file_index=e[f"videos/{k}/file_index"])
                frame = decode_frame_at(vpath, round(e[f"videos/{k}/from_timestamp"] * fps), fps)
        except (OSError, pa.ArrowException, VideoError, KeyError, TypeError, ExportError) as exc:
            report.errors.append(f"real read failed: {exc}")
        check_sample(report, state, action, frame, "episode 0 via the locator (pyarrow + PyAV)")
    else:
        check_sample(report, None, None, None, "the episode metadata", empty=True)
