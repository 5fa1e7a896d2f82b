"""One subset of the split plan as compact arrays, not a PlannedEpisode object per episode.

The plan held a PlannedEpisode (and through it a SourceEpisode) for every source episode for
the whole job: memory that grew with the episode count. A ``PlanList`` keeps, per
planned episode, which source and which position in that source's episodes it is, and its
frame offset in the subset; the task map and provenance are shared by every episode of one
source. ``plan[n]`` rebuilds the PlannedEpisode (equal to the one the list form held).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from ..formats.common.episode_list import LazySequence, index_at, row_at, rows_at
from ..formats.common.records import EpisodeRow
from ..formats.common.source import SourceCheck
from .units import PlannedEpisode


class PlanList(LazySequence[PlannedEpisode]):
    """The planned episodes of one subset in their new order (new index = position)."""

    what = "planned episode"

    def __init__(self, checks: tuple[SourceCheck, ...], subset: str) -> None:
        self.checks = checks
        self.subset = subset
        self.task_maps: list[dict[int, int]] = [{} for _ in checks]  # per source: old -> new task index
        self.provenance: list[dict[str, Any]] = [{} for _ in checks]  # per source (a named export's row fields)
        self._no = array("l")
        self._pos = array("q")
        self._offset = array("q")
        self._frames = 0

    def add(self, no: int, pos: int) -> None:
        """The episode at ``pos`` of source ``no`` planned next."""
        self._no.append(no)
        self._pos.append(pos)
        self._offset.append(self._frames)
        self._frames += rows_at(self.checks[no].episodes, pos)

    def __len__(self) -> int:
        return len(self._no)

    def _item(self, n: int) -> PlannedEpisode:
        no = self._no[n]
        return PlannedEpisode(self.checks[no].episodes[self._pos[n]], self.subset, n, self._offset[n],
                              self.task_maps[no], no, self.provenance[no])

    # ---- per-episode facts without rebuilding the episode -------------------------------------
    def source_no(self, n: int) -> int:
        return self._no[n]

    def rows_at(self, n: int) -> int:
        return rows_at(self.checks[self._no[n]].episodes, self._pos[n])

    def source_index(self, n: int) -> int:
        return index_at(self.checks[self._no[n]].episodes, self._pos[n])

    def source_row(self, n: int) -> EpisodeRow:
        return row_at(self.checks[self._no[n]].episodes, self._pos[n])

    def indices(self) -> list[int]:
        """Source episode indices in the subset's order."""
        return [self.source_index(n) for n in range(len(self))]

    @property
    def frames(self) -> int:
        return self._frames


def positions_of(subsets: Sequence[PlanList]) -> Iterator[tuple[int, int]]:
    """(subset number, position) of every planned episode in source order (source, then source
    episode index), as sorting the PlannedEpisodes by that key did."""
    import numpy as np

    total = sum(len(p) for p in subsets)
    subset = np.fromiter((s for s, p in enumerate(subsets) for _ in range(len(p))), np.int64, total)
    pos = np.fromiter((n for p in subsets for n in range(len(p))), np.int64, total)
    no = np.fromiter((p.source_no(n) for p in subsets for n in range(len(p))), np.int64, total)
    index = np.fromiter((p.source_index(n) for p in subsets for n in range(len(p))), np.int64, total)
    for k in np.lexsort((index, no)):  # stable, as sorted() is
        yield int(subset[k]), int(pos[k])
