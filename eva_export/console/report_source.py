"""What the health report reads, for every source kind (formats/common/source.py's seam).

A v2.1 dataset's rows are its own; a v3.0 or v2.0 source's rows come from its metadata with the
sidecar's fields (meta/eva_quality.jsonl: ``eva-export check`` and ``review``) on top, so what
nobody rated stays unrated. The vector columns come from the episode's own Parquet file or its
slice of a shared v3.0 file. Read only: nothing here writes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError
from ..formats.common import sidecar
from ..formats.common.meta import read_info
from ..formats.common.records import DatasetInfo, EpisodeRow
from ..formats.common.source_rules import SourceEpisode
from ..formats.sources import open_source
from . import data


@dataclass(frozen=True)
class ReportSource:
    root: Path
    kind: str  # a registered source kind (formats/sources.py)
    info: DatasetInfo
    located: tuple[SourceEpisode, ...]

    @property
    def episodes(self) -> list[EpisodeRow]:
        return [e.row for e in self.located]


def read_report_source(root: Path) -> ReportSource:
    """The episodes of the dataset at ``root`` (any kind), each row as the split would rate it."""
    source = open_source(root)
    info = read_info(root)
    located = list(source.locate(root))
    if not source.owned:  # the sidecar is where a foreign source's quality and verdicts live
        rows = sidecar.apply([e.row for e in located], sidecar.merged(root))
        located = [dataclasses.replace(e, row=r) for e, r in zip(located, rows, strict=True)]
    return ReportSource(Path(root), source.kind, info, tuple(located))


def episode_arrays(src: ReportSource, ep: SourceEpisode) -> dict[str, Any]:
    """The plotted vector features of one episode as float64 arrays (frames x elements)."""
    wanted = [k for k in data.PLOT_FEATURES if k in src.info.features]
    table = ep.read_table(wanted)  # raises DatasetError naming the episode and its file
    try:
        out: dict[str, Any] = {}
        for key in wanted:
            col = table.column(key).combine_chunks()
            arr = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
            out[key] = arr.reshape(-1, int(np.prod(src.info.features[key].shape)) or 1)
    except Exception as exc:  # noqa: BLE001 - pyarrow and numpy raise several types for a damaged file
        raise DatasetError(f"episode {ep.index}: {ep.data_path}: cannot read ({exc})") from exc
    return out
