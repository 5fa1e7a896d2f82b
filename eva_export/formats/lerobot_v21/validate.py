"""Source validation: a raw v2.1 dataset checked before anything is written.

``validate_source`` reads metadata, Parquet footers and the small index columns, demuxes every
MP4 (its timing against the table) and decodes embedded images (validate_media), so what a
consumer's reader would fail on is refused before an export starts. Each failure is a
``DatasetError`` naming the raw file and the raw episode index at fault. The episodes are
checked in order on the calling thread while the next ones' files are read on a small pool
(read_ahead): the first fault is the first episode's, whatever was read ahead.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ... import confine
from ...errors import DatasetError
from ..common import reuse
from ..common.episode_list import EpisodeList
from ..common.meta import (
    EPISODES,
    EPISODES_STATS,
    INFO,
    SHAPE_FAULT,
    TASKS,
    DatasetMeta,
    check_row_shapes,
    check_stats_shapes,
    read_meta,
)
from ..common.records import CODEBASE_V21, FORMAT_V21, EpisodeRow, EpisodeStats
from ..common.source_rules import SMALL_COLUMNS, SourceEpisode, check_columns, check_info, cut, raw_info
from ..common.stats import complete_stats
from ..common.stats_index import StatsIndex
from ..common.table import parquet_file
from ..common.facts_index import FileKey
from ..common.sidecar import SIDECAR
from ..common.source import SourceCheck
from .prove_ahead import ProveAhead
from .read_ahead import EpisodeFiles, ReadAhead, episode_paths, regular
from .validate_media import check_images, check_video
from .validate_tables import TableFacts, known_table, remember_table, table_key, table_kind

REQUIRED_COLUMNS = ("episode_index", "index")

def source_hash(root: Path) -> str:
    """Hash of the meta files that define the source state (a changed review changes it)."""
    h = hashlib.sha256()
    # the quality sidecar (quality/store.py) decides subsets too: a new check must not reuse units
    for name in (INFO, EPISODES, TASKS, EPISODES_STATS, SIDECAR):
        p = Path(root) / name
        h.update(name.encode() + b"\0")
        if p.is_file():
            with open(p, "rb") as fh:  # in blocks: episodes_stats.jsonl is ~4.6 KB per episode
                while block := fh.read(1 << 20):
                    h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def validate_source(root: Path, *, allow_empty_dataset: bool = True, as_source: bool = True,
                    codebase: str = CODEBASE_V21, camera_stats_computed: bool = False,
                    meta: DatasetMeta | None = None, tap: TableTap | None = None) -> SourceCheck:
    """Validate a raw v2.1 dataset as an export source; raise DatasetError on the first fault.

    Reads metadata, Parquet footers and the small index columns, and demuxes (never decodes)
    every MP4. Every message names the raw file and the raw episode index at fault. With
    ``as_source`` an export (anything inside an export tree or carrying quality_split.json)
    is refused; the lerobot_v21 verifier checks exported subsets with ``as_source=False``.
    A v2.0 source (formats/lerobot_v20/source.py) passes ``codebase`` "v2.0" and
    ``camera_stats_computed``: its camera statistics are computed by the split. ``meta``: the
    caller's own read_meta of ``root`` (a verifier that just read it), not parsed again.
    ``tap``: more columns read with each table's small ones, handed to its callback (a
    verifier's value checks, so each table is read once).
    """
    root = Path(root)
    if as_source:
        confine.check_is_source(root)
    for name in (EPISODES, INFO):
        if not (root / name).is_file():
            raise DatasetError(f"{root / name} is missing: {root} is not a LeRobot v2.1 dataset")
    raw = raw_info(root)
    # a source's stats rows and small tables are kept for the export job's writer (common/reuse.py)
    meta = read_meta(root, digest=True, keep_rows=as_source) if meta is None else meta
    info = meta.info
    if info.codebase_version != codebase:
        raise DatasetError(f"{root / INFO}: codebase_version is {info.codebase_version!r}, expected "
                           f"{codebase!r} (only raw v2.1 datasets are exported)")
    if info.dataset_format != FORMAT_V21:
        raise DatasetError(f"{root / INFO}: dataset_format is {info.dataset_format!r}, expected "
                           f"{FORMAT_V21!r} (an export cannot be the source of another export)")
    check_info(root, raw, info)
    if not meta.episodes and not allow_empty_dataset:
        raise DatasetError(f"{root / EPISODES} lists no episodes: nothing to export")
    seen: set[int] = set()
    for row in meta.episodes:
        if row.episode_index in seen:
            raise DatasetError(f"{root / EPISODES}: episode_index {row.episode_index} appears twice")
        seen.add(row.episode_index)
    indices = [row.episode_index for row in meta.episodes]
    if indices != list(range(len(indices))):
        top = min(max(indices, default=-1) + 1, len(indices) + 1000)  # a row may claim 10**12
        missing = sorted(set(range(top)) - seen)
        raise DatasetError(f"{root / EPISODES}: episode indices must be 0..{len(indices) - 1} in order; found "
                           f"{cut(indices)}" + (f" (missing {cut(missing)})" if missing else ""))
    _check_stray_files(root, meta)
    _check_tasks(root, meta)
    check = SourceCheck(root=root, meta=meta, source_hash=source_hash(root), episodes=EpisodeList(root, info))
    _check_episodes(check, table_kind(raw, meta, camera_stats_computed), camera_stats_computed, tap, as_source)
    # the rows of unlisted episodes (the listed ones were checked each after its own table, so a
    # declared-vs-stored mismatch names the Parquet file first); indices are 0..n-1 by now
    check_stats_shapes(meta, done=range(len(meta.episodes)))
    return check


def _check_episodes(check: SourceCheck, kind: str, camera_stats_computed: bool, tap: TableTap | None = None,
                    keep: bool = False) -> None:
    """Every episode's files, table and media, in order (``kind``: the facts-index context;
    ``keep``: small tables kept for the export job's writer)."""
    root, meta = check.root, check.meta
    task_text, task_ids = meta.task_text, meta.task_index
    offset = 0
    shared = _Shared()
    episodes = check.episodes
    assert isinstance(episodes, EpisodeList)
    stats = meta.episodes_stats
    before: int | None = None  # the bytes of the episode checked last
    # the next episodes' files read while one is checked; the last ones proven by a warm worker
    with ReadAhead(meta, kind) as ahead, ProveAhead(meta, kind if keep else "", check_table) as proofs:
        for n, row in enumerate(meta.episodes):  # episode_index == n: checked above
            proofs.apply(n)
            files = ahead.take(n, before)
            # the stats row's checks from the digest read_meta took as it parsed the row; without
            # one, the row parsed once here for both checks (it was three parses a check)
            digest = stats.digest_of(row.episode_index) if isinstance(stats, StatsIndex) else None
            ep_stats = stats.get(row.episode_index) if digest is None else None
            ep, known, tkey = _check_episode(root, meta, row, task_text, task_ids, offset, camera_stats_computed,
                                             kind, ep_stats, digest, tap, files, keep)
            if digest is not None and digest & SHAPE_FAULT:
                check_row_shapes(meta, stats[row.episode_index])  # raises, naming the row's line
            elif ep_stats is not None:
                check_row_shapes(meta, ep_stats)
            ep = shared.adopt(ep)
            if known is None:  # read (not proved by the index): its images decoded, then remembered
                check_images(meta, ep.index, ep.data_path)
                remember_table(tkey, ep, offset, kind)
            for key, vp in ep.video_paths.items():
                check_video(meta, ep.index, ep.rows, ep.data_path, key, vp,
                            files.videos.get(key) if files is not None else None)
            offset, before = offset + ep.rows, ep.bytes
            episodes.append(ep)


@dataclass(frozen=True)
class TableTap:
    """Columns read with each episode's small ones, and what sees them (episode, file, table)
    once the table passed its checks."""

    columns: tuple[str, ...]
    seen: Callable[[int, Path, pa.Table], None]


class _Shared:
    """One schema and column list for every episode whose table has the same ones: a pyarrow
    schema per episode (metadata included) made validation's memory grow with the episode
    count. Each episode's own schema is still checked; only the copy kept is shared."""

    def __init__(self) -> None:
        self.schema: pa.Schema | None = None
        self.columns: list[str] = []

    def adopt(self, ep: SourceEpisode) -> SourceEpisode:
        if ep.schema is None and ep.columns == self.columns:  # proved by the index: no schema read
            ep.columns = self.columns
            return ep
        if self.schema is None or ep.schema is None or not ep.schema.equals(self.schema, check_metadata=True):
            self.schema, self.columns = ep.schema, ep.columns  # the first, or a table unlike it
        elif ep.columns == self.columns:
            ep.schema, ep.columns = self.schema, self.columns
        return ep


def _check_tasks(root: Path, meta: DatasetMeta) -> None:
    """Each task_index names one task and each task one index: a reader building the map
    either way would otherwise give an episode another episode's task."""
    by_index: dict[int, str] = {}
    by_text: dict[str, int] = {}
    for t in meta.tasks:
        if t.task_index in by_index:
            raise DatasetError(f"{root / TASKS}: task_index {t.task_index} appears twice ({by_index[t.task_index]!r} "
                               f"and {t.task!r}); give each task its own index")
        if t.task in by_text:
            raise DatasetError(f"{root / TASKS}: task {t.task!r} appears twice (task_index {by_text[t.task]} "
                               f"and {t.task_index}); list each task once")
        by_index[t.task_index], by_text[t.task] = t.task, t.task_index


def _check_stray_files(root: Path, meta: DatasetMeta) -> None:
    """Files under data/ or videos/ that no episodes.jsonl row names (an interrupted capture)."""
    listed = _Listed(meta)
    stray = []
    for top in ("data", "videos"):
        base = root / top
        if base.is_dir():
            # the strays alone sorted (the first named as before), not every file's Path at once
            # (files and symlinks, a symlinked directory too: not descended into, as rglob did)
            stray += sorted(rel for dirpath, dirs, names in os.walk(base)
                            for n in names + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
                            if (rel := os.path.relpath(os.path.join(dirpath, n), root)) not in listed)
    if stray:
        raise DatasetError(f"{root}: {len(stray)} file(s) under data/ or videos/ belong to no episode in "
                           f"{EPISODES} (e.g. {stray[0]}), left by an interrupted capture or copied in. "
                           f"To recover: start the capture node on this dataset (it moves stray files to "
                           f"raw/.orphans/), or move them out of data/ and videos/ yourself, then export again")


class _Listed:
    """The files episodes.jsonl names, as a sorted array of their str hashes and (episode,
    file) codes: a set of every path string was ~400 bytes per episode, held while the trees
    were walked. A hash match is confirmed by the path rebuilt from its code."""

    def __init__(self, meta: DatasetMeta) -> None:
        info = self.info = meta.info
        self.keys = list(info.video_keys)
        self.rows = meta.episodes
        per = 1 + len(self.keys)
        hashes = np.empty(len(self.rows) * per, dtype=np.int64)
        for n, row in enumerate(self.rows):  # the order the set was built in (the first fault raised first)
            hashes[n * per] = hash(info.data_file(row.episode_index))
        for n, row in enumerate(self.rows):
            for j, k in enumerate(self.keys, 1):
                hashes[n * per + j] = hash(info.video_file(k, row.episode_index))
        self.codes = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.codes]

    def _path(self, code: int) -> str:
        n, j = divmod(code, 1 + len(self.keys))
        ep = self.rows[n].episode_index
        return self.info.data_file(ep) if j == 0 else self.info.video_file(self.keys[j - 1], ep)

    def __contains__(self, rel: str) -> bool:
        h = hash(rel)
        lo, hi = (int(np.searchsorted(self.hashes, h, side=side)) for side in ("left", "right"))
        return any(self._path(int(c)) == rel for c in self.codes[lo:hi])


def _episode_tasks(root: Path, row: EpisodeRow, data: Path, task_values: Any, task_text: dict[int, str],
                   task_ids: dict[str, int]) -> list[int]:
    """The episode's task indices, each resolving through tasks.jsonl."""
    ep = row.episode_index
    for task in row.tasks:
        if task not in task_ids:
            raise DatasetError(f"episode {ep}: task {task!r} is not in {root / TASKS}")
    if task_values is None:
        return sorted({task_ids[t] for t in row.tasks})
    tasks = sorted(int(t) for t in np.unique(task_values))
    for t in tasks:
        if t not in task_text:
            raise DatasetError(f"episode {ep}: task_index {t} in {data} does not resolve through {root / TASKS}")
    return tasks


def _check_episode(root: Path, meta: DatasetMeta, row: EpisodeRow, task_text: dict[int, str],
                   task_ids: dict[str, int], offset: int = 0, camera_stats_computed: bool = False,
                   kind: str = "", ep_stats: EpisodeStats | None = None, digest: int | None = None,
                   tap: TableTap | None = None, files: EpisodeFiles | None = None, keep: bool = False
                   ) -> tuple[SourceEpisode, TableFacts | None, FileKey | None]:
    """The episode's files and table checked; with the facts the index proved (None: read).
    ``files``: its paths as the read-ahead confined them, and what it looked up and read."""
    ep = row.episode_index
    if row.length <= 0:
        raise DatasetError(f"{root / EPISODES}: episode {ep} is empty (length {row.length}); "
                           f"remove it from episodes.jsonl before exporting")
    data, video_paths = (files.data, files.video_paths) if files is not None else episode_paths(meta, ep)
    data_st = regular(data)
    if data_st is None:
        raise DatasetError(f"episode {ep}: Parquet file {data} is missing")
    videos, sts = {}, {}
    for key, vp in video_paths.items():
        if (st := regular(vp)) is None:
            raise DatasetError(f"episode {ep}: camera file {vp} ({key}) is missing")
        videos[key], sts[key] = vp, st
    if files is not None:
        files.confirm(data_st, sts)  # a file changed since it was looked up: looked up again
    seen = files.table if files is not None else None
    if seen is not None:
        tkey, known = seen.key, seen.known
    else:  # the identity before the read: a file changed after it is not remembered
        tkey = table_key(data_st, kind)
        known = known_table(tkey, row, offset, kind, meta)
    if known is not None:
        nrows, columns, tasks, schema = known.rows, known.columns, known.tasks, None
    else:
        ahead = seen.read() if seen is not None else None
        nrows, columns, tasks, schema = check_table(root, meta, row, data, videos, task_text, task_ids, offset,
                                                     tap, ahead.data if ahead is not None else None,
                                                     reuse.wants_table(data_st) if keep else None)
    _check_stats_present(root, meta, ep, columns, camera_stats_computed, ep_stats, digest)
    size = data_st.st_size + sum(st.st_size for st in sts.values())
    return SourceEpisode(row=row, data_path=data, video_paths=videos, rows=nrows, task_indices=tasks,
                         columns=columns, bytes=size, schema=schema), known, tkey


def check_table(root: Path, meta: DatasetMeta, row: EpisodeRow, data: Path, videos: dict[str, Path],
                 task_text: dict[int, str], task_ids: dict[str, int], offset: int, tap: TableTap | None = None,
                 whole: bytes | None = None, keep: FileKey | None = None) -> tuple[int, list[str], list[int], pa.Schema]:
    """The episode's Parquet footer and small columns read and checked against the row
    (``whole``: the file's every byte, read ahead; ``keep``: every column read, and the table
    kept under that key for the job's writer once it passed its checks)."""
    info, ep = meta.info, row.episode_index
    try:
        with parquet_file(data, whole) as pf:  # a small file parsed in memory
            schema = pf.schema_arrow
            columns = list(schema.names)
            nrows = pf.metadata.num_rows
            # One read of the small columns every check needs (not the vectors or images).
            extra = [c for c in tap.columns if c in columns and c not in SMALL_COLUMNS] if tap is not None else []
            wanted = [c for c in SMALL_COLUMNS if c in columns] + extra
            table = pf.read(use_threads=False) if keep is not None else None
            small = table.select(wanted) if table is not None else pf.read(columns=wanted, use_threads=False)
            task_values = small.column("task_index").to_numpy() if "task_index" in columns else None
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
    tasks = _episode_tasks(root, row, data, task_values, task_text, task_ids)
    check_columns(root, meta, SourceEpisode(row, data, videos, nrows, tasks, columns, 0, schema), offset, small)
    if tap is not None:
        tap.seen(ep, data, small)
    if table is not None:
        reuse.keep_table(keep, table)
    return nrows, columns, tasks, schema


def _check_stats_present(root: Path, meta: DatasetMeta, ep: int, columns: list[str],
                         camera_stats_computed: bool, ep_stats: EpisodeStats | None,
                         digest: int | None = None) -> None:
    """Every feature has statistics, or is computed by the split; ``digest``: read_meta's
    stats_digest of the row (bit i: feature i complete), instead of the row."""
    have = ep_stats.stats if ep_stats is not None else {}
    for i, (key, feat) in enumerate(meta.info.features.items()):
        if digest is not None:
            if digest >> i & 1:
                continue
        elif complete_stats(have.get(key)):
            continue
        if (not feat.is_visual and key in columns) or (camera_stats_computed and feat.dtype == "video"):
            continue  # computed from the table (or the decoded video) during the split
        raise DatasetError(f"episode {ep}: no statistics for {key!r}: absent from {root / EPISODES_STATS} "
                           f"and not a table column")


def validate_dataset(root: Path) -> SourceCheck:
    """Validate any raw v2.1 dataset (e.g. after a capture crash); raises DatasetError."""
    return validate_source(root, allow_empty_dataset=True, as_source=False)

