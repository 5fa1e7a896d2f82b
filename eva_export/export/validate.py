"""Source validation (before anything is written) and a native v2.1 subset check.

``validate_source`` reads only metadata, Parquet footers and the ``task_index`` column, so it
is cheap enough to run before every export. Each failure is a ``DatasetError`` naming the file
or episode at fault.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ..errors import DatasetError, EvaError
from ..dataset.meta import EPISODES, EPISODES_STATS, INFO, TASKS, DatasetMeta, read_meta
from ..dataset.records import CODEBASE_V21, FORMAT_V21, EpisodeRow
from ..dataset.stats import STAT_KEYS
from ..dataset.video import count_frames
from .records import QualitySplit

REQUIRED_COLUMNS = ("episode_index", "index")


@dataclass
class SourceEpisode:
    """One validated source episode and the files that carry it."""

    row: EpisodeRow
    data_path: Path
    video_paths: dict[str, Path]
    rows: int
    task_indices: list[int]  # distinct task_index values of its table (or of its row's tasks)
    columns: list[str]
    bytes: int

    @property
    def index(self) -> int:
        return self.row.episode_index


@dataclass
class SourceCheck:
    """What validation learned about a source: enough to plan the split without rereading."""

    root: Path
    meta: DatasetMeta
    source_hash: str
    episodes: list[SourceEpisode] = field(default_factory=list)

    @property
    def files_total(self) -> int:
        return sum(1 + len(e.video_paths) for e in self.episodes)

    @property
    def bytes_total(self) -> int:
        return sum(e.bytes for e in self.episodes)


def source_hash(root: Path) -> str:
    """Hash of the meta files that define the source state (a changed review changes it)."""
    h = hashlib.sha256()
    for name in (INFO, EPISODES, TASKS, EPISODES_STATS):
        p = Path(root) / name
        h.update(name.encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def validate_source(root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
    """Validate a raw v2.1 dataset as an export source; raise DatasetError on the first fault."""
    root = Path(root)
    for name in (EPISODES, INFO):
        if not (root / name).is_file():
            raise DatasetError(f"{root / name} is missing: {root} is not a LeRobot v2.1 dataset")
    meta = read_meta(root)
    info = meta.info
    if info.codebase_version != CODEBASE_V21:
        raise DatasetError(f"{root / INFO}: codebase_version is {info.codebase_version!r}, expected "
                           f"{CODEBASE_V21!r} (only raw v2.1 datasets are exported)")
    if info.dataset_format != FORMAT_V21:
        raise DatasetError(f"{root / INFO}: dataset_format is {info.dataset_format!r}, expected "
                           f"{FORMAT_V21!r} (an export cannot be the source of another export)")
    if not meta.episodes and not allow_empty_dataset:
        raise DatasetError(f"{root / EPISODES} lists no episodes: nothing to export")
    seen: set[int] = set()
    for row in meta.episodes:
        if row.episode_index in seen:
            raise DatasetError(f"{root / EPISODES}: episode_index {row.episode_index} appears twice")
        seen.add(row.episode_index)
    task_text = meta.task_text
    task_ids = meta.task_index
    check = SourceCheck(root=root, meta=meta, source_hash=source_hash(root))
    for row in meta.episodes:
        check.episodes.append(_check_episode(root, meta, row, task_text, task_ids))
    return check


def _check_episode(root: Path, meta: DatasetMeta, row: EpisodeRow, task_text: dict[int, str],
                   task_ids: dict[str, int]) -> SourceEpisode:
    info = meta.info
    ep = row.episode_index
    if row.length <= 0:
        raise DatasetError(f"{root / EPISODES}: episode {ep} is empty (length {row.length}); "
                           f"remove it from episodes.jsonl before exporting")
    data = meta.data_path(ep)
    if not data.is_file():
        raise DatasetError(f"episode {ep}: Parquet file {data} is missing")
    videos = {}
    for key in info.video_keys:
        vp = meta.video_path(key, ep)
        if not vp.is_file():
            raise DatasetError(f"episode {ep}: camera file {vp} ({key}) is missing")
        videos[key] = vp
    try:
        with pq.ParquetFile(data) as pf:
            columns = list(pf.schema_arrow.names)
            nrows = pf.metadata.num_rows
            task_values = pf.read(columns=["task_index"]).column("task_index").to_numpy() \
                if "task_index" in columns else None
    except Exception as exc:  # noqa: BLE001 - any Arrow error means an unreadable table
        raise DatasetError(f"episode {ep}: cannot read {data}: {exc}") from exc
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            raise DatasetError(f"episode {ep}: {data} has no {col!r} column")
    missing = [k for k in info.table_keys if k not in columns]
    if missing:
        raise DatasetError(f"episode {ep}: {data} lacks the columns {missing} declared in info.json")
    if nrows == 0:
        raise DatasetError(f"episode {ep}: {data} has zero rows (empty episode)")
    if nrows != row.length:
        raise DatasetError(f"episode {ep}: {data} has {nrows} rows but episodes.jsonl says length {row.length}")
    for task in row.tasks:
        if task not in task_ids:
            raise DatasetError(f"episode {ep}: task {task!r} is not in {root / TASKS}")
    if task_values is not None:
        tasks = sorted(int(t) for t in np.unique(task_values))
        for t in tasks:
            if t not in task_text:
                raise DatasetError(f"episode {ep}: task_index {t} in {data} does not resolve through "
                                   f"{root / TASKS}")
    else:
        tasks = sorted({task_ids[t] for t in row.tasks})
    ep_stats = meta.episodes_stats.get(ep)
    have = ep_stats.stats if ep_stats is not None else {}
    for key, feat in info.features.items():
        st = have.get(key)
        if isinstance(st, dict) and all(k in st for k in STAT_KEYS):
            continue
        if not feat.is_visual and key in columns:
            continue  # computed from the table during the split
        raise DatasetError(f"episode {ep}: no statistics for {key!r}: absent from {root / EPISODES_STATS} "
                           f"and not a table column")
    size = data.stat().st_size + sum(v.stat().st_size for v in videos.values())
    return SourceEpisode(row=row, data_path=data, video_paths=videos, rows=nrows, task_indices=tasks,
                         columns=columns, bytes=size)


def validate_dataset(root: Path) -> SourceCheck:
    """Validate any raw v2.1 dataset (e.g. after a capture crash); raises DatasetError."""
    return validate_source(root, allow_empty_dataset=True)


@dataclass
class NativeReport:
    path: str
    checks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    episodes: int = 0
    frames: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


def verify_native(root: Path, count_video_frames: bool = True) -> NativeReport:
    """Check an exported native v2.1 subset against its own metadata.

    Marker readable; source-level validation; indices 0..N-1; Parquet episode_index and global
    index contiguous; info.json totals; every MP4 frame count equals its Parquet row count.
    """
    root = Path(root)
    rep = NativeReport(path=str(root))
    try:
        marker = QualitySplit.read(root)
        rep.checks.append(f"quality_split.json: subset {marker.subset}, format {marker.dataset_format}, "
                          f"source episodes {marker.source_episode_indices}")
    except (OSError, ValueError, TypeError) as exc:
        rep.errors.append(f"{root}/meta/quality_split.json unreadable: {exc}")
        return rep
    try:
        check = validate_source(root)
    except EvaError as exc:
        rep.errors.append(str(exc))
        return rep
    info = check.meta.info
    rep.episodes = len(check.episodes)
    rep.frames = sum(e.rows for e in check.episodes)
    if [e.index for e in check.episodes] != list(range(len(check.episodes))):
        rep.errors.append(f"episode indices {[e.index for e in check.episodes]} are not 0..N-1")
    if len(marker.source_episode_indices) != len(check.episodes):
        rep.errors.append("quality_split.json source_episode_indices does not match the episode count")
    if info.total_episodes != rep.episodes or info.total_frames != rep.frames:
        rep.errors.append(f"info.json totals {info.total_episodes} episodes / {info.total_frames} frames, "
                          f"found {rep.episodes} / {rep.frames}")
    offset = 0
    for e in check.episodes:
        with pq.ParquetFile(e.data_path) as pf:
            t = pf.read(columns=["episode_index", "index"])
        epi = t.column("episode_index").to_numpy()
        idx = t.column("index").to_numpy()
        if not (epi == e.index).all():
            rep.errors.append(f"{e.data_path}: episode_index column is not {e.index}")
        if not np.array_equal(idx, np.arange(offset, offset + e.rows)):
            rep.errors.append(f"{e.data_path}: index column is not {offset}..{offset + e.rows - 1}")
        offset += e.rows
        if count_video_frames:
            for key, vp in e.video_paths.items():
                n = count_frames(vp)
                if n != e.rows:
                    rep.errors.append(f"{vp}: {n} frames, table has {e.rows} rows")
    if rep.ok:
        rep.checks.append(f"{rep.episodes} episodes, {rep.frames} frames: indices contiguous, "
                          f"{'video frame counts match rows, ' if count_video_frames else ''}totals match")
    return rep

