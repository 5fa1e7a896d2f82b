"""The one-file-per-episode formats (hdf5, mcap): their info.json, file paths and the resumable
per-episode loop that writes them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..dataset.meta import INFO, DatasetMeta
from ..dataset.records import DatasetInfo, EpisodeRow
from ..fsutil import atomic_write_json, fsync_dir
from .base import Progress
from .source import copy_common_meta, load_source, read_episode_table, write_quality_split

EPISODE_CHUNK_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}"

def embedded_info(info: DatasetInfo, dataset_format: str, extension: str) -> dict[str, Any]:
    """info.json of a format that carries images inside its episode files (HDF5, MCAP)."""
    d = info.to_dict()
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

def episode_file(info: dict[str, Any], episode_index: int) -> str:
    chunks = int(info.get("chunks_size") or 1000)
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

def export_episode_files(
    src: Path,
    out: Path,
    progress: Progress,
    dataset_format: str,
    extension: str,
    write_episode: Callable[[Path, DatasetMeta, EpisodeRow, pa.Table], None],
    is_complete: Callable[[Path, DatasetMeta, EpisodeRow], bool],
) -> list[int]:
    """The loop of the one-file-per-episode formats (hdf5, mcap); returns the resumed episodes.

    Each episode is written under a hidden ``.partial`` name and renamed into place once
    closed, so a file that exists is a finished episode: a rerun after a kill checks it with
    ``is_complete`` and keeps it. The common meta files and the marker are written last.
    """
    meta = load_source(src)
    out.mkdir(parents=True, exist_ok=True)
    info = embedded_info(meta.info, dataset_format, extension)
    resumed: list[int] = []
    offset = 0
    for ep in meta.episodes:
        table = read_episode_table(meta, ep, first_index=offset)
        offset += ep.length
        path = out / episode_file(info, ep.episode_index)
        if path.is_file() and is_complete(path, meta, ep):
            resumed.append(ep.episode_index)
            progress.on_episode(ep.episode_index, 0)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.unlink(missing_ok=True)
        try:
            write_episode(tmp, meta, ep, table)
            os.replace(tmp, path)
            fsync_dir(path.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        progress.on_episode(ep.episode_index, path.stat().st_size)
    copy_common_meta(src, out)
    atomic_write_json(out / INFO, info)
    write_quality_split(src, out, dataset_format)
    return resumed
