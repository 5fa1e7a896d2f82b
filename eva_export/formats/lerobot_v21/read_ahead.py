"""Source validation's file reads, a few episodes ahead of its checks (validate).

Validation checks the episodes in order on one thread, and reading their files whole (the
Parquet table, every camera MP4) was most of a long episode's time there. ``ReadAhead`` reads
the next episodes' files on a small thread pool (a read and a hash release the GIL) while the
current one is checked, and hashes the camera files when the job asks for their digests (a
native pair linking them). Only the reads move: every check, and every error with its message,
stays on the validating thread in episode order. It pays for large episodes whose files are
hashed; small ones, and files nobody hashes, are read by their checks as before (measured on
two cores: see the thresholds below).

A file is read ahead only when its check would read it: the facts index is asked first, on the
validating thread (which owns its connection), and a file it proves is not read. A read that
fails, a file over its bound, or one changed since it was looked at (its identity at the check
differs) is left to the check, which reads it itself as it always did. Bounded in memory: the
reads started for episodes not yet checked hold at most ``BYTES`` (one file alone when larger)
and reach at most ``EPISODES`` ahead. The pool is shut down when the validation ends, by an
error or not, and a started episode's remaining files are not read after that.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Generic, TypeVar

from ...errors import DatasetError, UnsafeNameError
from ..common import mp4_index, video_facts
from ..common.facts_index import FileKey
from ..common.meta import DatasetMeta
from ..common.records import EpisodeRow
from ..common.table import IN_MEMORY_BYTES
from .validate_tables import TableFacts, known_table, table_key

#: Bytes read for episodes not yet checked (a single larger file is read alone): what the
#: camera files' hashing held before (video_facts.DIGESTS_PENDING_BYTES), now held here.
BYTES = 32 << 20
#: Episodes read ahead of the one being checked, at most.
EPISODES = 8
#: Reading threads (each also hashes the camera files it read when the job asks for it).
THREADS = 2
#: An episode whose reads are smaller is read by its check: handing a few small files to a
#: thread (and the GIL back and forth with it) cost more than reading them (600 x 4 frames).
SMALL_BYTES = 512 << 10
#: The same when nothing is hashed (the verifier, a job that copies nothing): a plain read from
#: the page cache is cheap on the validating thread (539 MB: 0.12 s), and on a pool thread it
#: cost about twice the CPU (fresh pages faulted) for a few ms of wall: not read ahead then.
SMALL_UNHASHED_BYTES = 1 << 62

Ident = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns), whatever its age
T = TypeVar("T")
_Wanted = tuple["Planned[TableFacts] | Planned[video_facts.VideoFacts]", Path, bool]  # (file, path, an MP4)
# what Path.is_file takes for "no such file" (Python 3.11's pathlib._IGNORED_ERRNOS)
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def regular(path: Path) -> os.stat_result | None:
    """The stat of a regular file, or None where ``Path.is_file`` is False (raising as it does)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno not in _ABSENT:
            raise
        return None
    except ValueError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def ident(st: os.stat_result) -> Ident:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def episode_paths(meta: DatasetMeta, ep: int) -> tuple[Path, dict[str, Path]]:
    """The episode's Parquet file and camera files, each confined to the dataset root."""
    try:
        return meta.data_path(ep), {key: meta.video_path(key, ep) for key in meta.info.video_keys}
    except (UnsafeNameError, ValueError) as exc:
        raise DatasetError(f"episode {ep}: {exc}") from exc


@dataclass(frozen=True)
class Read:
    """A file's every byte, and their SHA-256 (hex) when the job asked for it."""

    data: bytes
    sha256: str | None


class Planned(Generic[T]):
    """One file as the plan saw it: its identity, its facts index key (None: not kept), what
    the index proved of it (None: nothing, the check reads it) and the read started for it."""

    __slots__ = ("_job", "ident", "key", "known", "size")

    def __init__(self, st: os.stat_result, key: FileKey | None, known: T | None) -> None:
        self.ident, self.key, self.known, self.size = ident(st), key, known, st.st_size
        self._job: Future[Read | None] | None = None

    def started(self) -> bool:
        """Whether a read of it was started (and not yet given to the check)."""
        return self._job is not None

    def read(self) -> Read | None:
        """The bytes read ahead (given once); None: not read ahead, or the read failed."""
        if self._job is None:
            return None
        try:
            return self._job.result()
        except Exception:  # noqa: BLE001 - cancelled: the check reads the file itself
            return None
        finally:
            self._job = None  # the bytes are the check's now


@dataclass
class EpisodeFiles:
    """An episode's files as planned (``table``/``videos`` None: not a regular file then)."""

    data: Path
    video_paths: dict[str, Path]
    table: Planned[TableFacts] | None
    videos: dict[str, Planned[video_facts.VideoFacts] | None]
    held: int = 0  # bytes of reads started for it
    started: bool = False

    def confirm(self, table: os.stat_result, videos: dict[str, os.stat_result]) -> None:
        """Drop what the plan saw of any file whose identity is not the check's (changed since)."""
        if self.table is not None and self.table.ident != ident(table):
            self.table = None
        for key, st in videos.items():
            seen = self.videos.get(key)
            if seen is not None and seen.ident != ident(st):
                self.videos[key] = None


class ReadAhead:
    """The files of episodes ``n + 1 ..`` read while episode n is checked (``take(n)``, n in
    order); a context manager that shuts its pool down on exit."""

    def __init__(self, meta: DatasetMeta, kind: str, budget: int | None = None, window: int | None = None) -> None:
        self.meta, self.kind = meta, kind
        self.budget = BYTES if budget is None else budget
        self.window = EPISODES if window is None else window
        self.rows: list[EpisodeRow] = meta.episodes
        self.next = 0  # the first episode not planned
        self.offset = 0  # its global frame offset (the rows before it, as their checks will count them)
        self.planned: deque[EpisodeFiles | None] = deque()
        self.held = 0
        self.digest = video_facts.digests_wanted()
        self.small = SMALL_BYTES if self.digest else SMALL_UNHASHED_BYTES
        self.stop = threading.Event()
        self.pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.stop.set()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.planned.clear()

    def take(self, n: int, before: int | None = None) -> EpisodeFiles | None:
        """Episode n's files as planned, after starting the reads of the next ones (None:
        nothing planned, or its paths are refused; the check finds and reads them itself).
        ``before``: the bytes of episode n - 1. After a small episode nothing more is planned
        (the next is likely small too, and read by its check: a plan would only cost)."""
        small = before is not None and before < self.small
        if self.next == n:  # not planned ahead: planned now (read by the check), or not at all
            if small:
                self.next, self.offset = n + 1, self.offset + self.rows[n].length
                return None
            self.planned.append(self._plan())
        files = self.planned.popleft()
        if files is not None:
            self.held -= files.held
        if not small:
            self._fill(n)
        return files

    def _fill(self, n: int) -> None:
        while True:
            last = self.planned[-1] if self.planned else None
            if last is not None and not last.started and not self._start(last):
                return  # over the budget: started when the episodes before it are taken
            if self.next >= len(self.rows) or self.next > n + self.window:
                return
            self.planned.append(self._plan())

    def _plan(self) -> EpisodeFiles | None:
        """The next episode's files looked at: identities, and what the facts index proves."""
        row = self.rows[self.next]
        offset = self.offset
        self.next += 1
        self.offset += row.length
        if row.length <= 0:
            return None
        try:
            data, paths = episode_paths(self.meta, row.episode_index)
            return EpisodeFiles(data, paths, self._table(data, row, offset),
                                {key: self._video(p) for key, p in paths.items()})
        except Exception:  # noqa: BLE001 - nothing read ahead: the check meets the fault itself
            return None

    def _table(self, data: Path, row: EpisodeRow, offset: int) -> Planned[TableFacts] | None:
        st = regular(data)
        if st is None:
            return None
        key = table_key(st, self.kind)
        return Planned(st, key, known_table(key, row, offset, self.kind, self.meta))

    def _video(self, path: Path) -> Planned[video_facts.VideoFacts] | None:
        st = regular(path)
        if st is None:
            return None
        key = video_facts.key_of(st)
        return Planned(st, key, video_facts.lookup(key))

    def _start(self, files: EpisodeFiles) -> bool:
        """The reads of the files its checks would read, if the budget allows (else False: it
        is started once the episodes before it are checked)."""
        wanted = self._wanted(files)
        size = sum(planned.size for planned, _, _ in wanted)
        if size >= self.small and self.held and self.held + size > self.budget:
            return False
        files.started = True
        if size < self.small:
            return True  # read by its check
        take: list[_Wanted] = []
        total = 0
        for planned, path, mp4 in wanted:  # nothing else held: as much as the budget allows
            if total + planned.size > self.budget and take:
                break  # the rest of this episode is read by its check
            take.append((planned, path, mp4))
            total += planned.size
        if self.pool is None:
            self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="eva-read-ahead")
        for planned, path, mp4 in take:  # a file each: the two threads share a long episode's files
            planned._job = self.pool.submit(_read_one, path, planned.size, mp4, self.digest and mp4, self.stop)
        files.held, self.held = total, self.held + total
        return True

    def _wanted(self, files: EpisodeFiles) -> list[_Wanted]:
        """The files the episode's checks would read whole: not proved by the index, in bounds."""
        wanted: list[_Wanted] = []
        if files.table is not None and files.table.known is None and files.table.size <= IN_MEMORY_BYTES:
            wanted.append((files.table, files.data, False))
        fps = self.meta.info.fps
        for key, seen in files.videos.items():  # check_video reads unless the facts hold at this fps
            if seen is not None and (seen.known is None or seen.known.fps != fps) and seen.size <= mp4_index.MAX_BYTES:
                wanted.append((seen, files.video_paths[key], True))
        return wanted


def _read_one(path: Path, size: int, mp4: bool, digest: bool, stop: threading.Event) -> Read | None:
    """The file's every byte (hashed when asked); None when it cannot be read whole at its
    planned size, or the validation has ended. Never raises: the check reads such a file itself."""
    if stop.is_set():
        return None
    try:
        # the MP4 through file_bytes (as the check reads it); the table within its bound
        data = mp4_index.file_bytes(path) if mp4 else mp4_index.whole_file(path, IN_MEMORY_BYTES)
        if data is None or len(data) != size:
            return None
        return Read(data, hashlib.sha256(data).hexdigest() if digest else None)
    except Exception:  # noqa: BLE001 - left to the check, which says what is wrong
        return None
