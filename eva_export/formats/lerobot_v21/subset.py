"""The input of every exporter: a staged native v2.1 subset, read and checked, and the meta
files and quality marker an export carries over from it."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ...errors import DatasetError, ExportError
from ...fsutil import atomic_write_json
from ..common.meta import EPISODES, EPISODES_STATS, INFO, STATS, TASKS, DatasetMeta, read_meta
from ..common.records import CODEBASE_V21, FORMAT_V21, QUALITY_SPLIT_FILE, DatasetInfo, EpisodeRow, QualitySplit
from ..common.table import read_parquet

COMMON_META = (EPISODES, TASKS, EPISODES_STATS, STATS)

def load_source(native_subset: Path) -> DatasetMeta:
    """Read a staged native subset, refusing anything that is not a v2.1 split subset."""
    root = Path(native_subset)
    try:
        meta = read_meta(root)
    except DatasetError as exc:
        raise ExportError(f"source {root}: {exc}") from exc
    info = meta.info
    if info.codebase_version != CODEBASE_V21 or info.dataset_format != FORMAT_V21:
        raise ExportError(f"source {root}: codebase_version {info.codebase_version!r} / dataset_format "
                          f"{info.dataset_format!r}; exporters read only LeRobot v2.1 (lerobot_v21) subsets")
    if not (root / QUALITY_SPLIT_FILE).is_file():
        raise ExportError(f"source {root}: {QUALITY_SPLIT_FILE} is missing; export a quality-split subset, "
                          "not a raw directory")
    seen: set[int] = set()
    for ep in meta.episodes:
        if ep.episode_index in seen:
            raise ExportError(f"source {root}: episode {ep.episode_index} is listed twice")
        seen.add(ep.episode_index)
        if ep.length <= 0:
            raise ExportError(f"source {root}: episode {ep.episode_index} is empty (length {ep.length})")
    return meta

def read_episode_table(meta: DatasetMeta, ep: EpisodeRow, first_index: int | None = None) -> pa.Table:
    """Read one source episode table and check it against its episode row (rows, indices)."""
    path = meta.data_path(ep.episode_index)
    if not path.is_file():
        raise ExportError(f"episode {ep.episode_index}: {path} is missing")
    try:
        table = read_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise ExportError(f"episode {ep.episode_index}: cannot read {path} ({exc})") from exc
    if table.num_rows != ep.length:
        raise ExportError(f"episode {ep.episode_index}: {path.name} has {table.num_rows} rows, "
                          f"episodes.jsonl says length {ep.length}")
    for col in ("episode_index", "index"):
        if col not in table.column_names:
            raise ExportError(f"episode {ep.episode_index}: {path.name} lacks the {col!r} column")
    epi = column_numpy(table, "episode_index")
    if not np.all(epi == ep.episode_index):
        raise ExportError(f"episode {ep.episode_index}: {path.name} has episode_index values "
                          f"{sorted(set(epi.tolist()))[:5]}, expected {ep.episode_index} (renumbered subset)")
    if first_index is not None:
        idx = column_numpy(table, "index")
        if not np.array_equal(idx, np.arange(first_index, first_index + table.num_rows)):
            raise ExportError(f"episode {ep.episode_index}: global index column is not contiguous from "
                              f"{first_index} (the subset must be renumbered)")
    return table

def column_numpy(table: pa.Table, name: str) -> NDArray[Any]:
    from ..common.table import to_numpy
    return to_numpy(table.column(name))

def state_action_keys(info: DatasetInfo) -> tuple[str | None, str | None]:
    """The feature names a consumer would call state and action."""
    keys = [k for k, f in info.features.items() if not f.is_visual]
    state = "observation.state" if "observation.state" in keys else next((k for k in keys if "state" in k), None)
    action = "action" if "action" in keys else next((k for k in keys if "action" in k), None)
    return state, action

def copy_common_meta(src: Path, out: Path) -> None:
    """Copy episodes.jsonl, tasks.jsonl, episodes_stats.jsonl and stats.json when present."""
    for rel in COMMON_META:
        if (src / rel).is_file():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, out / rel)

def write_quality_split(src: Path, out: Path, dataset_format: str, extra: dict[str, Any] | None = None) -> QualitySplit:
    """Copy meta/quality_split.json with dataset_format set to this exporter's name (and
    ``extra`` keys added), then the dataset card rendered from the records now in ``out``.

    Every exporter calls this last, once info.json and episodes.jsonl are in place, so every
    format carries a card that matches its own records (formats/common/card.py).
    """
    from ..common.card import write_card

    try:
        qs = QualitySplit.read(src)
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"{src / QUALITY_SPLIT_FILE}: unreadable ({exc})") from exc
    qs = dataclasses.replace(qs, dataset_format=dataset_format, extra={**qs.extra, **(extra or {})})
    qs.write(out)
    try:
        write_card(out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{out}: cannot write the dataset card from its records ({exc})") from exc
    return qs

def write_info(out: Path, info: dict[str, Any]) -> None:
    atomic_write_json(out / INFO, info)

def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
