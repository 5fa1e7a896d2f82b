"""Statistics an export writes: per episode (source values, missing columns computed) and for the
whole dataset (aggregated)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from numpy.typing import NDArray

from ...fsutil import read_json
from ..common import stats as stats_mod
from ..common.meta import STATS, DatasetMeta
from ..common.records import EpisodeRow, EpisodeStats
from .subset import column_numpy


def dataset_stats(meta: DatasetMeta, extra: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Dataset statistics for every feature, aggregated from the per-episode statistics.

    ``extra`` holds statistics computed during export for episodes whose source lacked them.
    """
    per = []
    for ep in meta.episodes:
        st = dict(meta.episodes_stats[ep.episode_index].stats) if ep.episode_index in meta.episodes_stats else {}
        st.update((extra or {}).get(ep.episode_index, {}))
        per.append(st)
    out = stats_mod.aggregate(per)
    if (meta.root / STATS).is_file():  # keep anything the source knew that we could not recompute
        for key, value in read_json(meta.root / STATS).items():
            out.setdefault(key, value)
    return out

_UNREAD: Any = object()  # "not given": read the episode's row from meta.episodes_stats


def source_stats(meta: DatasetMeta, ep: EpisodeRow) -> EpisodeStats | None:
    """The episode's row of episodes_stats.jsonl (parsed on each call: callers keep it)."""
    return meta.episodes_stats.get(ep.episode_index)


def episode_stats(meta: DatasetMeta, ep: EpisodeRow, table: pa.Table,
                  row: EpisodeStats | None = _UNREAD) -> dict[str, Any]:
    """The episode's statistics: from episodes_stats.jsonl (``row``, when the caller read it
    already), table columns filled in when missing."""
    # a copy per feature (only keys are added here); the values are read, never changed
    row = source_stats(meta, ep) if row is _UNREAD else row
    src = row.stats if row is not None else {}
    st: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in src.items()}
    for name in table.column_names:
        if name not in st and name in meta.info.features and not meta.info.features[name].is_visual:
            st[name] = stats_mod.column_stats(column_numpy(table, name))
    return st

def missing_image_stats(meta: DatasetMeta, ep: EpisodeRow, row: EpisodeStats | None = _UNREAD) -> list[str]:
    """Cameras (video or image-in-Parquet) whose statistics the source did not record."""
    have = source_stats(meta, ep) if row is _UNREAD else row
    return [k for k in meta.info.visual_keys if have is None or k not in have.stats]

def image_stats_of(frames: Iterator[NDArray[Any]]) -> dict[str, Any]:
    st = stats_mod.ImageStats()
    for f in frames:
        st.add(f)
    return st.to_dict()
