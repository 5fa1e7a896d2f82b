"""A validated source's episodes as compact arrays, not a SourceEpisode object per episode.

A SourceEpisode with its three Paths, its dict of camera files and its task list is about
3.3 KB of Python objects for a two-camera episode; holding one per episode for the whole
export job made its memory grow with the episode count (139 MB at 1,000 short
episodes, 447 MB at 10,000). Here an episode of the templated v2.1 layout (its files at
``root / info.data_file(i)`` and ``root / info.video_file(key, i)``, as validation confined
them) is kept as a few array slots: its row (a reference to the row ``meta`` already holds),
row count, bytes, and indices into the distinct task lists and table shapes (one schema and
column list for every equal table, validate._Shared). The SourceEpisode is rebuilt, equal to
the one appended, when a caller asks for it. An episode of any other shape (a v3.0 slice, a
file outside the template) is kept whole.
"""

from __future__ import annotations

from abc import abstractmethod
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar, overload

import pyarrow as pa

from .records import DatasetInfo, EpisodeRow
from .source_rules import SourceEpisode

T = TypeVar("T")


class LazySequence(Sequence[T]):
    """A sequence whose items are rebuilt from compact storage on access: a subclass gives
    ``__len__`` and ``_item(n)`` (``0 <= n < len``); indexing, slices and iteration are here."""

    what = "item"  # named in the IndexError

    @abstractmethod
    def _item(self, n: int) -> T: ...

    @overload
    def __getitem__(self, n: int) -> T: ...

    @overload
    def __getitem__(self, n: slice) -> list[T]: ...

    def __getitem__(self, n: int | slice) -> T | list[T]:
        if isinstance(n, slice):
            return [self._item(k) for k in range(*n.indices(len(self)))]
        if n < 0:
            n += len(self)
        if not 0 <= n < len(self):
            raise IndexError(f"{self.what} position out of range")
        return self._item(n)

    def __iter__(self) -> Iterator[T]:
        for n in range(len(self)):
            yield self._item(n)


class EpisodeList(LazySequence[SourceEpisode]):
    """The episodes of one source in order; ``append`` as a list's, items rebuilt on access."""

    what = "episode"

    def __init__(self, root: Path, info: DatasetInfo) -> None:
        self._root = Path(root)
        self._info = info
        self._keys = tuple(info.video_keys)
        self._row_objs: list[EpisodeRow] = []  # references only: the rows live in meta.episodes
        self._nrows = array("q")
        self._bytes = array("q")
        self._task = array("l")  # index into _task_sets
        self._shape = array("l")  # index into _shapes
        self._task_sets: list[tuple[int, ...]] = []
        self._task_ids: dict[tuple[int, ...], int] = {}
        self._shapes: list[tuple[list[str], pa.Schema | None]] = []
        self._whole: dict[int, SourceEpisode] = {}  # position -> an episode not in the templated layout

    def __len__(self) -> int:
        return len(self._row_objs)

    def _templated(self, ep: SourceEpisode) -> bool:
        if type(ep) is not SourceEpisode or tuple(ep.video_paths) != self._keys:
            return False
        i = ep.index
        return ep.data_path == self._root / self._info.data_file(i) and all(
            vp == self._root / self._info.video_file(k, i) for k, vp in ep.video_paths.items())

    def _shape_of(self, ep: SourceEpisode) -> int:
        last = self._shapes[-1] if self._shapes else None
        if last is not None and last[0] is ep.columns and last[1] is ep.schema:
            return len(self._shapes) - 1  # the common case: the table shape shared with the last one
        for n, (cols, schema) in enumerate(self._shapes):
            if cols is ep.columns and schema is ep.schema:
                return n
        self._shapes.append((ep.columns, ep.schema))
        return len(self._shapes) - 1

    def append(self, ep: SourceEpisode) -> None:
        tasks = tuple(ep.task_indices)
        t = self._task_ids.setdefault(tasks, len(self._task_sets))
        if t == len(self._task_sets):
            self._task_sets.append(tasks)
        if not self._templated(ep):
            self._whole[len(self._row_objs)] = ep
            shape = -1
        else:
            shape = self._shape_of(ep)
        self._row_objs.append(ep.row)
        self._nrows.append(ep.rows)
        self._bytes.append(ep.bytes)
        self._task.append(t)
        self._shape.append(shape)

    def _item(self, n: int) -> SourceEpisode:
        whole = self._whole.get(n)
        if whole is not None:
            return whole
        row = self._row_objs[n]
        i = row.episode_index
        cols, schema = self._shapes[self._shape[n]]
        return SourceEpisode(row=row, data_path=self._root / self._info.data_file(i),
                             video_paths={k: self._root / self._info.video_file(k, i) for k in self._keys},
                             rows=self._nrows[n], task_indices=list(self._task_sets[self._task[n]]),
                             columns=cols, bytes=self._bytes[n], schema=schema)

    def __eq__(self, other: object) -> bool:  # as the list it replaces: equal items in order
        if not isinstance(other, (list, tuple, EpisodeList)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"EpisodeList({list(self)!r})"

    # ---- what callers ask of every episode, without rebuilding one ----------------------------
    def index_at(self, n: int) -> int:
        return self._row_objs[n].episode_index

    def rows_at(self, n: int) -> int:
        return self._nrows[n]

    def row_at(self, n: int) -> EpisodeRow:
        return self._row_objs[n]

    def files_total(self) -> int:
        return sum(1 + (len(w.video_paths) if (w := self._whole.get(n)) is not None else len(self._keys))
                   for n in range(len(self)))

    def bytes_total(self) -> int:
        return sum(self._bytes)


def index_at(episodes: Sequence[SourceEpisode], n: int) -> int:
    """The source episode index at position ``n`` (an EpisodeList's without rebuilding it)."""
    return episodes.index_at(n) if isinstance(episodes, EpisodeList) else episodes[n].index


def rows_at(episodes: Sequence[SourceEpisode], n: int) -> int:
    return episodes.rows_at(n) if isinstance(episodes, EpisodeList) else episodes[n].rows


def row_at(episodes: Sequence[SourceEpisode], n: int) -> EpisodeRow:
    return episodes.row_at(n) if isinstance(episodes, EpisodeList) else episodes[n].row
