"""Reading a LeRobot v3.0 dataset's meta/ directory: info, tasks.parquet and the episode rows
of meta/episodes/chunk-*/file-*.parquet (locators and per-episode statistics).

Facts of the layout (LeRobot 0.4.x-0.6.x): an episode row carries episode_index, tasks, length,
data/chunk_index, data/file_index, dataset_from_index, dataset_to_index (global frame range
[from, to)), per camera videos/<key>/chunk_index, file_index, from_timestamp, to_timestamp
(seconds inside that MP4), optionally stats/<feature>/<stat>. tasks.parquet holds task_index
with the task string as the pandas index.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ... import confine
from ...errors import DatasetError, UnsafeNameError
from ..common.records import DATA_PATH_V21, VIDEO_PATH_V21, DatasetInfo, EpisodeStats, TaskRow
from .layout import EPISODES_DIR, EPISODES_GLOB, TASKS_PARQUET, V3_ONLY_INFO

_ROW_COLUMNS = ("episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                "dataset_from_index", "dataset_to_index")
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


@dataclass(frozen=True)
class VideoLocator:
    chunk_index: int
    file_index: int
    from_timestamp: float
    to_timestamp: float


@dataclass(frozen=True)
class EpisodeLocator:
    """One row of the episode metadata: where the episode's rows and frames are."""

    episode_index: int
    tasks: tuple[str, ...]
    length: int
    data_chunk: int
    data_file: int
    from_index: int
    to_index: int
    videos: dict[str, VideoLocator]
    where: Path  # the episodes Parquet file that holds the row (named in messages)


def as_v21(info: DatasetInfo) -> DatasetInfo:
    """The v2.1 description of the same features: what the split writes for each subset."""
    extra = {k: v for k, v in info.extra.items() if k not in V3_ONLY_INFO}
    return DatasetInfo(codebase_version="v2.1", robot_type=info.robot_type, fps=info.fps,
                       features=dict(info.features), chunks_size=info.chunks_size, data_path=DATA_PATH_V21,
                       video_path=VIDEO_PATH_V21 if info.video_keys else None, extra=extra)


def episode_files(root: Path) -> list[Path]:
    """The episode metadata files in (chunk, file) order, each confined to the dataset."""
    base = Path(root) / EPISODES_DIR
    files = sorted(base.glob(EPISODES_GLOB)) if base.is_dir() else []
    for f in files:
        confine.confined(Path(root), str(f.relative_to(root)), "episode metadata file")
    return files


def require_episode_files(root: Path) -> list[Path]:
    """The episode metadata files; none means info.json's version does not match the layout."""
    files = episode_files(root)
    if not files:
        hint = " (meta/episodes.jsonl is there: a v2.1 layout)" if (Path(root) / "meta/episodes.jsonl").is_file() else ""
        raise DatasetError(f"{Path(root) / 'meta/info.json'}: codebase_version is 'v3.0' but "
                           f"{Path(root) / EPISODES_DIR} holds no chunk-*/file-*.parquet episode metadata{hint}")
    return files


def read_tasks(root: Path) -> list[TaskRow]:
    path = Path(root) / TASKS_PARQUET
    if not path.is_file():
        raise DatasetError(f"{path} is missing: a LeRobot v3.0 dataset lists its tasks there")
    confine.confined(Path(root), TASKS_PARQUET, "meta file")
    try:
        with pq.ParquetFile(path) as pf:
            table = pf.read()
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: unreadable ({exc})") from exc
    text_col = "task" if "task" in table.column_names else _pandas_index(table)
    if "task_index" not in table.column_names or text_col is None:
        raise DatasetError(f"{path}: expected a task_index column and the task text (column or pandas index "
                           f"'task'), found {table.column_names}")
    rows = []
    for n, (idx, text) in enumerate(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist(),
                                        strict=True)):
        try:  # the same exact types and text bound as a tasks.jsonl row
            rows.append(TaskRow.from_dict({"task_index": idx, "task": text}))
        except ValueError as exc:
            raise DatasetError(f"{path}: task row {n}: {exc}") from None
    if len({t.task_index for t in rows}) != len(rows) or len({t.task for t in rows}) != len(rows):
        raise DatasetError(f"{path}: a task_index or a task text appears twice")
    return rows


def _pandas_index(table: pa.Table) -> str | None:
    """The column pandas stored the index in (LeRobot: the task string, named 'task')."""
    meta = table.schema.pandas_metadata or {}
    cols = [c for c in meta.get("index_columns", []) if isinstance(c, str) and c in table.column_names]
    return cols[0] if cols and pa.types.is_string(table.schema.field(cols[0]).type) else None


def _int(row: dict[str, Any], col: str, where: Path, ep: object) -> int:
    v = row.get(col)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise DatasetError(f"{where}: episode {ep}: {col} is {v!r}, expected a non-negative integer")
    return v


def _seconds(row: dict[str, Any], col: str, where: Path, ep: int) -> float:
    v = row.get(col)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise DatasetError(f"{where}: episode {ep}: {col} is {v!r}, expected a finite time >= 0 s")
    return float(v)


def _locator(row: dict[str, Any], where: Path, video_keys: list[str]) -> EpisodeLocator:
    ep = _int(row, "episode_index", where, row.get("episode_index"))
    tasks = row.get("tasks")
    if isinstance(tasks, str):
        tasks = [tasks]
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise DatasetError(f"{where}: episode {ep}: tasks is {tasks!r}, expected a list of task texts")
    videos = {}
    for key in video_keys:
        p = f"videos/{key}/"
        videos[key] = VideoLocator(_int(row, p + "chunk_index", where, ep), _int(row, p + "file_index", where, ep),
                                   _seconds(row, p + "from_timestamp", where, ep),
                                   _seconds(row, p + "to_timestamp", where, ep))
    return EpisodeLocator(ep, tuple(tasks), _int(row, "length", where, ep), _int(row, "data/chunk_index", where, ep),
                          _int(row, "data/file_index", where, ep), _int(row, "dataset_from_index", where, ep),
                          _int(row, "dataset_to_index", where, ep), videos, where)


def _stats(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """stats/<feature>/<stat> columns -> {feature: {stat: value}}; a feature with a null
    statistic is left out (the split computes it)."""
    out: dict[str, dict[str, Any]] = {}
    nulls: set[str] = set()
    for col, value in row.items():
        if not col.startswith("stats/"):
            continue
        feature, _, stat = col[len("stats/"):].rpartition("/")
        if value is None:
            nulls.add(feature)
        out.setdefault(feature, {})[stat] = value
    return {k: v for k, v in out.items() if k not in nulls}


def iter_episode_rows(root: Path, info: DatasetInfo) -> Iterator[tuple[EpisodeLocator, EpisodeStats]]:
    """Every episode row of every metadata file, in file order (one record batch at a time)."""
    files = require_episode_files(root)
    wanted = list(_ROW_COLUMNS) + [f"videos/{k}/{c}" for k in info.video_keys for c in _VIDEO_COLUMNS]
    for path in files:
        try:
            with pq.ParquetFile(path) as pf:
                names = pf.schema_arrow.names
                missing = [c for c in wanted if c not in names]
                if missing:
                    raise DatasetError(f"{path}: lacks the episode metadata columns {missing}")
                cols = wanted + [c for c in names if c.startswith("stats/")]
                for batch in pf.iter_batches(batch_size=256, columns=cols):
                    for row in batch.to_pylist():
                        loc = _locator(row, path, info.video_keys)
                        yield loc, EpisodeStats(loc.episode_index, _stats(row))
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"{path}: unreadable ({exc})") from exc


def data_file(root: Path, info: DatasetInfo, loc: EpisodeLocator) -> Path:
    rel = info.data_path.format(chunk_index=loc.data_chunk, file_index=loc.data_file)
    return _confined(root, rel, "data file", loc)


def video_file(root: Path, info: DatasetInfo, key: str, loc: EpisodeLocator) -> Path:
    assert info.video_path is not None  # a video key implies a checked video_path
    v = loc.videos[key]
    rel = info.video_path.format(video_key=key, chunk_index=v.chunk_index, file_index=v.file_index)
    return _confined(root, rel, "video file", loc)


def _confined(root: Path, rel: str, what: str, loc: EpisodeLocator) -> Path:
    try:
        return confine.confined(Path(root), rel, what)
    except UnsafeNameError as exc:
        raise DatasetError(f"episode {loc.episode_index}: {exc}") from exc
