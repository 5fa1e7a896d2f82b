"""meta/episodes_stats.jsonl as an index of line offsets, not a dict of parsed rows.

A parsed stats row is about 30 KB of Python floats and lists for a two-camera episode (its
JSON line is 4.6 KB), so holding every row made a source's memory grow with its episode count.
``read_meta`` still parses and checks every line once (every fault is found where
it was before, naming ``path:line``); the index keeps each episode's byte span and line number
and parses the line again when a caller asks for it.

The file stays open while the index lives, and lines are read from that open file: a writer
replacing the file (the capture node's atomic rewrite when it commits an episode during an
export) leaves this snapshot readable, as the dict of rows was. A file changed in place (its
size or mtime no longer the indexed one) is refused with a DatasetError naming it. A mutation
(the capture writer's) loads every row into memory first, and so does pickling.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from ...errors import DatasetError
from ...fsutil import iter_jsonl_spans, jsonl_object
from . import reuse
from .records import EpisodeStats

#: Estimated bytes of a parsed row per byte of its line (floats and lists: 28 KB for 4.5 KB)
ROW_BYTES_PER_LINE_BYTE = 7


class StatsIndex(MutableMapping[int, EpisodeStats]):
    """episode_index -> EpisodeStats, parsed on demand from the indexed (open) file."""

    def __init__(self, digest: Callable[[EpisodeStats], int] | None = None, keep: bool = False) -> None:
        self.path: Path | None = None
        # what a caller asks of every row, taken from the scan's parse (meta.stats_digest)
        self._digest = digest
        self._digests = array("q")
        self._fh: Any = None  # the open file the spans point into
        self._stamp: tuple[int, int] = (0, 0)
        # episode -> slot in three flat arrays (offset, length, line): a tuple of three ints per
        # episode was ~250 bytes of objects; the dict keeps the file's episode order
        self._where: dict[int, int] = {}
        self._spans = array("q")  # offset, length, line of slot n at 3n, 3n+1, 3n+2
        self._held: dict[int, EpisodeStats] | None = {}  # rows in memory (no file, or after a change)
        # ``keep``: rows as the scan parsed them, for an export job's one reader of each (within
        # reuse.py's budget, while a job keeps); a source's index, not a verifier's
        self._keep = keep
        self._kept: dict[int, tuple[EpisodeStats, int, int]] = {}

    def scan(self, path: Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, object]]]:
        """Open ``path`` and yield (line, object) of every row; the caller parses each and
        hands it to ``note``. Read errors surface as OSError, content errors as ValueError
        (a line over ``limit`` bytes too)."""
        self.path, self._held = path, None
        self._fh = open(path, "rb")  # noqa: SIM115 - held open for the index's lifetime
        st = os.fstat(self._fh.fileno())
        self._stamp = (st.st_size, st.st_mtime_ns)
        self._line: tuple[int, int] = (0, 0)
        for lineno, offset, length, obj in iter_jsonl_spans(path, self._fh, limit):
            self._line = (offset, length)
            yield lineno, obj

    def note(self, row: EpisodeStats, lineno: int) -> None:
        """The row of the line just scanned; a later duplicate of an episode wins, as in a dict."""
        slot = self._where.setdefault(row.episode_index, len(self._spans) // 3)
        digest = self._digest(row) if self._digest is not None else 0
        if slot * 3 == len(self._spans):
            self._spans.extend((*self._line, lineno))
            self._digests.append(digest)
        else:
            self._spans[3 * slot:3 * slot + 3] = array("q", (*self._line, lineno))
            self._digests[slot] = digest
        if self._keep:
            self._take(row.episode_index)  # a later duplicate wins
            size = ROW_BYTES_PER_LINE_BYTE * self._line[1]
            if ticket := reuse.admit(reuse.ROW, size):
                self._kept[row.episode_index] = (row, size, ticket)

    def _take(self, episode: int) -> EpisodeStats | None:
        """The episode's kept row, out of the keeping (its bytes back to reuse.py's budget)."""
        kept = self._kept.pop(episode, None)
        if kept is None:
            return None
        reuse.release(reuse.ROW, kept[1], kept[2])
        return kept[0]

    def digest_of(self, episode: int) -> int | None:
        """The digest of the episode's row as scanned (None: no digest taken, no such row, or
        the rows are held in memory after a change)."""
        if self._digest is None or self._held is not None or episode not in self._where:
            return None
        return self._digests[self._where[episode]]

    def _span(self, episode: int) -> tuple[int, int, int]:
        n = 3 * self._where[episode]
        return self._spans[n], self._spans[n + 1], self._spans[n + 2]

    def line_of(self, episode: int) -> int:
        """The row's line in the file (0 when held in memory only)."""
        return self._span(episode)[2] if self._held is None and episode in self._where else 0

    def _read(self, episode: int) -> EpisodeStats:
        assert self.path is not None and self._fh is not None
        offset, length, lineno = self._span(episode)
        try:
            st = os.fstat(self._fh.fileno())
            if (st.st_size, st.st_mtime_ns) != self._stamp:
                raise DatasetError(f"{self.path} was changed in place after it was read; run again")
            kept = self._take(episode)
            if kept is not None:  # the file is still the one scanned: its row as parsed then
                return kept
            raw = os.pread(self._fh.fileno(), length, offset)
            obj = jsonl_object(self.path, raw, lineno)
            if obj is None:
                raise ValueError("blank on reread")
            row = EpisodeStats.from_dict(obj)
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
            self._where, self._spans, self._digests = {}, array("q"), array("q")
            self.close()
        return self._held

    def close(self) -> None:
        for episode in list(self._kept):
            self._take(episode)
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict[str, object]:
        held = dict(self._held) if self._held is not None else {e: self._read(e) for e in self._where}
        return {"path": self.path, "held": held}  # rows, not the file handle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.path, self._held = state["path"], state["held"]

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
