"""meta/episodes_stats.jsonl as an index of line offsets, not a dict of parsed rows.

A parsed stats row is about 30 KB of Python floats and lists for a two-camera episode (its
JSON line is 4.6 KB), so holding every row made a source's memory grow with its episode count
(issue 28). ``read_meta`` still parses and checks every line once (every fault is found where
it was before, naming ``path:line``); the index keeps each episode's byte offset and line
number and parses the line again when a caller asks for it. The file's identity (device,
inode, size, mtime_ns) is recorded: a file changed after it was indexed is refused with a
DatasetError instead of being read at stale offsets. A mutation (the capture writer's) loads
every row into memory first and the index becomes a plain dict from then on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from ..errors import DatasetError
from ..fsutil import read_jsonl_line
from .records import EpisodeStats

Stamp = tuple[int, int, int, int]


def _stamp(path: Path) -> Stamp:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class StatsIndex(MutableMapping[int, EpisodeStats]):
    """episode_index -> EpisodeStats, read on demand from the indexed file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._where: dict[int, tuple[int, int]] = {}  # episode -> (byte offset, line number)
        self._stamp: Stamp | None = None
        self._held: dict[int, EpisodeStats] | None = None if path is not None else {}

    @classmethod
    def of_file(cls, path: Path) -> StatsIndex:
        """An empty index of ``path``, its identity taken before the caller's scan (``note``)."""
        index = cls(path)
        index._stamp = _stamp(path)
        return index

    def note(self, row: EpisodeStats, offset: int, lineno: int) -> None:
        """The row parsed at ``offset``; a later duplicate of an episode wins, as in a dict."""
        self._where[row.episode_index] = (offset, lineno)

    def line_of(self, episode: int) -> int:
        """The row's line in the file (0 when held in memory only)."""
        return self._where.get(episode, (0, 0))[1] if self._held is None else 0

    def _read(self, episode: int) -> EpisodeStats:
        assert self.path is not None and self._stamp is not None
        offset, lineno = self._where[episode]
        try:
            if _stamp(self.path) != self._stamp:
                raise DatasetError(f"{self.path} changed after it was read (another writer?); run again")
            row = EpisodeStats.from_dict(read_jsonl_line(self.path, offset, lineno))
        except OSError as exc:
            raise DatasetError(f"{self.path}: unreadable ({exc.strerror or exc})") from None
        except (ValueError, KeyError, TypeError) as exc:  # it parsed when indexed: the file changed
            raise DatasetError(f"{self.path}:{lineno}: malformed row on reread ({exc})") from None
        if row.episode_index != episode:
            raise DatasetError(f"{self.path}:{lineno}: holds episode {row.episode_index} on reread, "
                               f"expected {episode} (the file changed after it was read)")
        return row

    def _hold(self) -> dict[int, EpisodeStats]:
        if self._held is None:
            self._held = {e: self._read(e) for e in self._where}
            self._where = {}
        return self._held

    def __getitem__(self, episode: int) -> EpisodeStats:
        if self._held is not None:
            return self._held[episode]
        if episode not in self._where:
            raise KeyError(episode)
        return self._read(episode)

    def __contains__(self, episode: object) -> bool:
        return episode in (self._held if self._held is not None else self._where)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._held if self._held is not None else self._where))

    def __len__(self) -> int:
        return len(self._held if self._held is not None else self._where)

    def __setitem__(self, episode: int, stats: EpisodeStats) -> None:
        self._hold()[episode] = stats

    def __delitem__(self, episode: int) -> None:
        del self._hold()[episode]
