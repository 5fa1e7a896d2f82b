"""The one-file-per-episode formats (hdf5, mcap): their info.json, file paths and the resumable
per-episode loop that writes them."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ... import pool
from ...errors import ExportError
from ...fsutil import atomic_write_json, fsync_dir, storage_guard
from ...jsonbound import int_like
from ...manifest import record_written
from ..common.exporter import Progress
from ..common.meta import EPISODES, INFO, DatasetMeta
from ..common.records import DatasetInfo, EpisodeRow
from ..common.written import WrittenFile
from .subset import copy_common_meta, load_source, read_episode_table, write_quality_split

WriteEpisode = Callable[[Path, DatasetMeta, EpisodeRow, pa.Table], str | None]  # -> SHA-256 of the file or None
EPISODE_CHUNK_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}"

def embedded_info(info: DatasetInfo, dataset_format: str, extension: str) -> dict[str, Any]:
    """info.json of a format that carries images inside its episode files (HDF5, MCAP)."""
    d: dict[str, Any] = info.to_dict()  # features as dicts, edited in place
    for feat in d["features"].values():
        if feat["dtype"] == "video":
            feat["dtype"] = "image"
            feat.pop("info", None)
    d["total_videos"] = 0
    d.pop("video_path", None)
    d["data_path"] = EPISODE_CHUNK_PATH + "." + extension
    d["embedded_images"] = True
    d["dataset_format"] = dataset_format
    return d

def episode_file(info: Mapping[str, object], episode_index: int) -> str:
    chunks = int_like(info.get("chunks_size") or 1000)
    return str(info["data_path"]).format(episode_chunk=episode_index // chunks, episode_index=episode_index)

def to_plain(value: Any) -> Any:
    """numpy scalars/arrays to Python values, recursively (for MessagePack and JSON)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value

_META_CACHE: dict[tuple[str, int, int], DatasetMeta] = {}


def _unit_meta(src: Path) -> DatasetMeta:
    """The source's metadata in a worker process, read once per subset (not once per episode)."""
    st = (src / EPISODES).stat()
    key = (str(src), st.st_mtime_ns, st.st_size)
    if key not in _META_CACHE:
        _META_CACHE.clear()  # one subset at a time: keep memory flat
        _META_CACHE[key] = load_source(src)
    return _META_CACHE[key]


def _row_of(meta: DatasetMeta, episode_index: int) -> EpisodeRow | None:
    """The episode's row: at its own position in a renumbered subset (a scan of every row per
    unit was quadratic in the episode count), else found by a scan."""
    rows = meta.episodes
    if 0 <= episode_index < len(rows) and rows[episode_index].episode_index == episode_index:
        return rows[episode_index]
    return next((e for e in rows if e.episode_index == episode_index), None)


def episode_file_unit(src: Path, path: Path, episode_index: int, first_index: int,
                      write_episode: WriteEpisode, meta: DatasetMeta | None = None) -> WrittenFile:
    """One episode file (a unit of eva_export.pool): written as ``.partial``, renamed into place.

    Runs in the exporting process (``meta`` given) or in a worker process (``meta`` None:
    read from ``src``); returns the file's size and the digest ``write_episode`` took of it.
    """
    meta = meta if meta is not None else _unit_meta(src)
    ep = _row_of(meta, episode_index)
    if ep is None:
        raise ExportError(f"episode {episode_index}: not in {src / EPISODES}")
    table = read_episode_table(meta, ep, first_index=first_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.unlink(missing_ok=True)
    try:
        with storage_guard(tmp, f"episode {episode_index}: writing"):  # ENOSPC/EIO: a failed job naming the file
            digest = write_episode(tmp, meta, ep, table)
            os.replace(tmp, path)
            fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return WrittenFile(path.stat().st_size, digest)


class _EpisodeUnits(pool.LazyUnits):
    """The episode units still to write, each made when the pool takes it: a Unit with its
    Path, name and arguments per episode was held for the whole export."""

    def __init__(self, src: Path, out: Path, info: dict[str, object], write_episode: WriteEpisode,
                 meta: DatasetMeta | None) -> None:
        # ``meta`` when serial: the metadata handed over instead of reread by a worker
        self.src, self.out, self.info, self.write_episode, self.meta = src, out, info, write_episode, meta
        self.todo = array("q")  # (episode_index, first index) of each unit, flat

    def add(self, episode_index: int, first: int) -> None:
        self.todo.extend((episode_index, first))

    def __len__(self) -> int:
        return len(self.todo) // 2

    def unit(self, k: int) -> pool.Unit:
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError("unit position out of range")
        ep, first = self.todo[2 * k], self.todo[2 * k + 1]
        path = self.out / episode_file(self.info, ep)
        return pool.Unit(f"episode {ep}", episode_file_unit, (self.src, path, ep, first, self.write_episode, self.meta))


def _done(progress: Progress, path: Path, episode_index: int, written: WrittenFile) -> None:
    """A unit finished (here or in a worker): its digest for the manifest, then progress."""
    if written.sha256 is not None:
        record_written(path, written.sha256)
    progress.on_episode(episode_index, written.size)


def export_episode_files(
    src: Path,
    out: Path,
    progress: Progress,
    dataset_format: str,
    extension: str,
    write_episode: WriteEpisode,
    is_complete: Callable[[Path, DatasetMeta, EpisodeRow], bool],
) -> list[int]:
    """The loop of the one-file-per-episode formats (hdf5, mcap); returns the resumed episodes.

    Each episode is written under a hidden ``.partial`` name and renamed into place once
    closed, so a file that exists is a finished episode (``write_episode`` returns the SHA-256 of
    the bytes it wrote, or None; a digest goes to ``manifest.record_written``): a rerun after a kill checks it with
    ``is_complete`` and keeps it. The episodes left run as eva_export.pool units (worker
    processes when a pool is active: ``write_episode`` must then be picklable, e.g. a bound
    method of the exporter). The common meta files and the marker are written last.
    """
    meta = load_source(src)
    out.mkdir(parents=True, exist_ok=True)
    info = embedded_info(meta.info, dataset_format, extension)
    resumed: list[int] = []
    units = _EpisodeUnits(src, out, info, write_episode, meta if pool.active() is None else None)
    offset = 0
    for ep in meta.episodes:
        first = offset
        offset += ep.length
        path = out / episode_file(info, ep.episode_index)
        if path.is_file() and is_complete(path, meta, ep):
            resumed.append(ep.episode_index)
            progress.on_episode(ep.episode_index, 0)
            continue
        units.add(ep.episode_index, first)
    pool.run_units(units, lambda u, written: _done(progress, u.args[1], u.args[2], written))
    copy_common_meta(src, out)
    atomic_write_json(out / INFO, info)
    write_quality_split(src, out, dataset_format)
    return resumed
