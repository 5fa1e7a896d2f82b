"""LeRobot v3.0 source (LeRobot 0.4.x-0.6.x): episodes located inside shared files.

Validated with the v2.1 rules, episode by episode (metadata, Parquet footers, the small index
columns of each data file once, each MP4's index; nothing decoded): info.json fields and
templates, episode indices 0..N-1 in order, the global index contiguous, every referenced file
inside the dataset, column types against info.json, timestamps on the fps grid, tasks resolved
through meta/tasks.parquet, and each camera's [from_timestamp, to_timestamp) on the frame grid,
inside its MP4 and as long as the episode. Messages name the source file and source episode.

The result describes the source as a v2.1 dataset (``as_v21``) whose episodes are
``SlicedEpisode``s: the split cuts each one into real per-episode v2.1 files (Parquet rows,
MP4 by stream copy) and computes whatever statistics the episode metadata lacks. We do not own
the dataset: quality comes from the sidecar (formats/common/sidecar.py), else episodes are unrated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ... import confine
from ...errors import DatasetError
from ..common import sidecar
from ..common.meta import INFO, DatasetMeta
from ..common.records import DatasetInfo, EpisodeRow, EpisodeStats, TaskRow
from ..common.source import SlicedEpisode, SourceCheck, SourceKind, VideoSlice, codebase_version
from ..common.source_rules import GRID_TOLERANCE_S, SMALL_COLUMNS, SourceEpisode, check_columns, check_info, raw_info
from ..common.video import mp4_truncation, stream_frames
from .layout import CODEBASE_V30, TASKS_PARQUET
from .meta import (
    EpisodeLocator,
    as_v21,
    data_file,
    episode_files,
    iter_episode_rows,
    read_tasks,
    require_episode_files,
    video_file,
)


@dataclass
class _DataFile:
    path: Path
    schema: pa.Schema
    rows: int
    first_index: int
    small: pa.Table  # the SMALL_COLUMNS of the whole file (a few bytes per frame)
    size: int


@dataclass(frozen=True)
class _VideoFile:
    frames: int
    width: int
    height: int
    size: int


@dataclass
class _Files:
    """The last data file read (episodes come in file order) and every MP4 probed."""

    data: _DataFile | None = None
    videos: dict[Path, _VideoFile] = field(default_factory=dict)


class V30Source:
    kind = SourceKind.LEROBOT_V30
    owned = False

    @staticmethod
    def recognises(root: Path) -> bool:
        return codebase_version(root) == CODEBASE_V30

    def validate(self, root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
        root = Path(root)
        confine.check_is_source(root)
        raw = raw_info(root)
        try:
            info = DatasetInfo.from_dict(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"{root / INFO}: {exc}") from exc
        if info.codebase_version != CODEBASE_V30:
            raise DatasetError(f"{root / INFO}: codebase_version is {info.codebase_version!r}, expected "
                               f"{CODEBASE_V30!r}")
        check_info(root, raw, info)
        require_episode_files(root)  # before tasks: a v2.1 layout labelled v3.0 is named as such
        tasks = read_tasks(root)
        meta = DatasetMeta(root=root, info=as_v21(info), episodes=[], tasks=tasks, episodes_stats={})
        episodes: list[SourceEpisode] = []
        check = SourceCheck(root=root, meta=meta, source_hash=source_hash(root), episodes=episodes)
        verdicts = sidecar.merged(root)
        files = _Files()
        offset = 0
        for loc, st in iter_episode_rows(root, info):
            if loc.episode_index != len(meta.episodes):
                raise DatasetError(f"{loc.where}: episode indices must be 0..N-1 in order; found episode "
                                   f"{loc.episode_index} at position {len(meta.episodes)}")
            row = sidecar.apply([EpisodeRow(loc.episode_index, list(loc.tasks), loc.length)], verdicts)[0]
            episodes.append(_check_episode(root, info, meta, loc, row, offset, files))
            meta.episodes.append(row)
            meta.episodes_stats[loc.episode_index] = EpisodeStats(loc.episode_index, st.stats)
            offset += loc.length
        if not meta.episodes and not allow_empty_dataset:
            raise DatasetError(f"{root / 'meta/episodes'} lists no episodes: nothing to export")
        _check_stray_files(root, check)
        return check

    def episode_indices(self, root: Path) -> list[int]:
        return [loc.episode_index for loc, _st in iter_episode_rows(Path(root), _info(root))]

    def locate(self, root: Path) -> Iterator[SourceEpisode]:
        """Each episode's slice of its data file and camera files, from the episode metadata.
        An episode's first row in its data file is counted from the first episode listed in
        that file (LeRobot writes a file's episodes back to back); the reader checks the
        rows' episode_index, so a wrong locator is named, never read as another episode."""
        root = Path(root)
        info = _info(root)
        first_index: dict[Path, int] = {}  # data file -> global index of its first row
        for loc, _st in iter_episode_rows(root, info):
            path = data_file(root, info, loc)
            start = first_index.setdefault(path, loc.from_index)
            slices = {}
            for key in info.video_keys:
                v = loc.videos[key]
                a, b = round(v.from_timestamp * info.fps), round(v.to_timestamp * info.fps)
                slices[key] = VideoSlice(video_file(root, info, key, loc), a, max(0, b - a))
            yield SlicedEpisode(row=EpisodeRow(loc.episode_index, list(loc.tasks), loc.length), data_path=path,
                                video_paths={k: sl.path for k, sl in slices.items()}, rows=loc.length,
                                task_indices=[], columns=[], bytes=0, row_start=loc.from_index - start,
                                video_slices=slices)


def _info(root: Path) -> DatasetInfo:
    try:
        return DatasetInfo.from_dict(raw_info(Path(root)))
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{Path(root) / INFO}: {exc}") from exc


def source_hash(root: Path) -> str:
    """Hash of the files that define the source state: info, episode metadata, tasks, sidecar."""
    h = hashlib.sha256()
    names = [INFO, TASKS_PARQUET] + [str(p.relative_to(root)) for p in episode_files(root)]
    for name in names:
        p = Path(root) / name
        h.update(name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"") + b"\0")
    h.update(sidecar.sidecar_bytes(root))
    return h.hexdigest()


def _check_episode(root: Path, info: DatasetInfo, meta: DatasetMeta, loc: EpisodeLocator, row: EpisodeRow,
                   offset: int, files: _Files) -> SlicedEpisode:
    e, n = loc.episode_index, loc.length
    if n <= 0:
        raise DatasetError(f"{loc.where}: episode {e} is empty (length {n})")
    if (loc.from_index, loc.to_index) != (offset, offset + n):
        raise DatasetError(f"{loc.where}: episode {e}: dataset_from_index..dataset_to_index is "
                           f"{loc.from_index}..{loc.to_index}, expected {offset}..{offset + n} (length {n}, "
                           "global index contiguous)")
    task_ids = {t.task: t.task_index for t in meta.tasks}
    for task in loc.tasks:
        if task not in task_ids:
            raise DatasetError(f"episode {e}: task {task!r} is not in {root / TASKS_PARQUET}")
    df = _data_file(root, info, loc, files)
    start = loc.from_index - df.first_index
    if start < 0 or start + n > df.rows:
        raise DatasetError(f"episode {e}: {df.path} holds global rows {df.first_index}..{df.first_index + df.rows - 1}; "
                           f"rows {loc.from_index}..{loc.to_index - 1} are not all in it")
    small = df.small.slice(start, n)
    ep = SlicedEpisode(row=row, data_path=df.path, video_paths={}, rows=n, task_indices=[],
                       columns=list(df.schema.names), bytes=df.size * n // max(1, df.rows), schema=df.schema,
                       row_start=start)
    check_columns(root, meta, ep, offset, small)  # the v2.1 rules, on the episode's slice
    ep.task_indices = _task_indices(ep, small, meta.tasks, task_ids, root)
    for key in info.video_keys:
        path, sl, vf = _check_video(root, info, loc, key, files)
        ep.video_paths[key] = path
        ep.video_slices[key] = sl
        ep.bytes += vf.size * n // max(1, vf.frames)
    return ep


def _task_indices(ep: SlicedEpisode, small: pa.Table, tasks: list[TaskRow], task_ids: dict[str, int],
                  root: Path) -> list[int]:
    if "task_index" not in small.column_names:
        return sorted({task_ids[t] for t in ep.row.tasks})
    known = {t.task_index for t in tasks}
    values = sorted(int(t) for t in np.unique(small.column("task_index").to_numpy()))
    for t in values:
        if t not in known:
            raise DatasetError(f"episode {ep.index}: task_index {t} in {ep.data_path} does not resolve through "
                               f"{root / TASKS_PARQUET}")
    return values


def _data_file(root: Path, info: DatasetInfo, loc: EpisodeLocator, files: _Files) -> _DataFile:
    path = data_file(root, info, loc)
    if files.data is not None and files.data.path == path:
        return files.data
    e = loc.episode_index
    if not path.is_file():
        raise DatasetError(f"episode {e}: Parquet file {path} is missing")
    try:
        with pq.ParquetFile(path) as pf:
            schema = pf.schema_arrow
            small = pf.read(columns=[c for c in SMALL_COLUMNS if c in schema.names])
            rows = pf.metadata.num_rows
    except Exception as exc:  # noqa: BLE001 - any Arrow error means an unreadable table
        raise DatasetError(f"episode {e}: cannot read {path}: {exc}") from exc
    for col in ("episode_index", "index"):
        if col not in schema.names:
            raise DatasetError(f"episode {e}: {path} has no {col!r} column")
    missing = [k for k in info.table_keys if k not in schema.names]
    if missing:
        raise DatasetError(f"episode {e}: {path} lacks the columns {missing} declared in info.json")
    first = int(small.column("index")[0].as_py()) if rows else 0
    files.data = _DataFile(path, schema, rows, first, small, path.stat().st_size)
    return files.data


def _probe(path: Path, key: str, e: int) -> _VideoFile:
    why = mp4_truncation(path)
    if why:
        raise DatasetError(f"episode {e}: {path} ({key}) is not a complete MP4 (truncated, empty or garbage: {why})")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DatasetError(f"episode {e}: {path} ({key}) has no video stream")
            s = container.streams.video[0]
            return _VideoFile(stream_frames(container, s), s.codec_context.width, s.codec_context.height,
                              path.stat().st_size)
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - any demuxer error means an unreadable file
        raise DatasetError(f"episode {e}: {path} ({key}) is not a readable MP4: {exc}") from exc


def _check_video(root: Path, info: DatasetInfo, loc: EpisodeLocator, key: str,
                 files: _Files) -> tuple[Path, VideoSlice, _VideoFile]:
    """The camera's [from, to) on the frame grid, inside its MP4, as long as the episode."""
    e, n, fps = loc.episode_index, loc.length, info.fps
    v = loc.videos[key]
    path = video_file(root, info, key, loc)
    if not path.is_file():
        raise DatasetError(f"episode {e}: camera file {path} ({key}) is missing")
    vf = files.videos.get(path) or _probe(path, key, e)
    files.videos[path] = vf
    feat = info.features[key]
    if (vf.height, vf.width) != tuple(feat.shape[:2]):
        raise DatasetError(f"episode {e}: {path} ({key}) is {vf.width}x{vf.height}, but {root / INFO} declares "
                           f"{feat.shape[1]}x{feat.shape[0]}")
    a, b = round(v.from_timestamp * fps), round(v.to_timestamp * fps)
    for name, t, k in (("from_timestamp", v.from_timestamp, a), ("to_timestamp", v.to_timestamp, b)):
        if abs(t - k / fps) > GRID_TOLERANCE_S:
            raise DatasetError(f"{loc.where}: episode {e}: videos/{key}/{name} {t} s is off the {fps} fps frame grid")
    if b - a != n:
        raise DatasetError(f"{loc.where}: episode {e}: videos/{key} from_timestamp {v.from_timestamp} s .. "
                           f"to_timestamp {v.to_timestamp} s spans {b - a} frames, the episode has {n} rows")
    if b > vf.frames:
        raise DatasetError(f"{loc.where}: episode {e}: videos/{key}/to_timestamp {v.to_timestamp} s is past the end "
                           f"of {path} ({vf.frames} frames = {vf.frames / fps:g} s at {fps} fps)")
    return path, VideoSlice(path, a, n), vf


def _check_stray_files(root: Path, check: SourceCheck) -> None:
    """Files under data/ or videos/ that no episode row references (copied in, or a broken
    conversion): refused like a v2.1 source's stray files."""
    listed = {e.data_path for e in check.episodes} | {p for e in check.episodes for p in e.video_paths.values()}
    stray = []
    for top in ("data", "videos"):
        base = root / top
        if base.is_dir():
            stray += [p for p in sorted(base.rglob("*")) if (p.is_file() or p.is_symlink()) and p not in listed]
    if stray:
        raise DatasetError(f"{root}: {len(stray)} file(s) under data/ or videos/ belong to no episode of "
                           f"{root / 'meta/episodes'} (e.g. {stray[0].relative_to(root)}); move them out, then "
                           "export again")
