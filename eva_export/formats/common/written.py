"""SHA-256 of an output file computed from the bytes its exporter wrote, so the
manifest need not read the file back.

An MCAP file is written front to back by our own writer: hashing its appends is the digest.
An HDF5 file is not: h5py writes its metadata where and when it likes (the superblock again at
close). ``RegionHasher`` covers that case: the exporter writes the large data regions itself,
in increasing file order, and hashes those bytes as it writes them; the library's bytes between
them (small) are read back from the file as the hash reaches them and kept. When the file is
closed, the kept bytes are read again and compared, the tail is hashed from the final file,
and any library write that touched a data region voids the digest. A void digest is ``None``:
the manifest then hashes the file itself, as before.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

_SYNC_FILE_RANGE_WRITE = 2
_writeback: Callable[[int, int, int, int], int] | bool | None = False  # False: not looked up yet


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Have the kernel start writing ``nbytes`` at ``offset`` to the disk now, without waiting
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; nothing elsewhere).

    An episode file fits under the dirty-page limits, so otherwise nothing reaches the disk
    before the final fdatasync and the disk idles while frames decode: ``dd conv=fdatasync``
    pays the same wait, but with nothing to overlap it with. Not a durability step: the
    fdatasync still decides that.
    """
    global _writeback
    if _writeback is False:
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _writeback = fn
        except (OSError, AttributeError):
            _writeback = None
    if callable(_writeback):
        _writeback(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # a failure only loses the overlap


_T = TypeVar("_T")


class StepThread(Generic[_T]):
    """``step(item)`` for every item put, in order, on a thread of its own, at most ``depth``
    items behind the caller: the exporters' writes (page cache, dirty-page throttling) and their
    hashing release the GIL, so they overlap with the caller filling the next item.

    A step that raises (ENOSPC, EIO) is raised in the caller by the next ``put`` or ``drain``,
    once; the steps after it are dropped, since the caller discards the file. ``close`` always
    (it joins the thread), after ``drain`` when the file is to be kept.
    """

    def __init__(self, step: Callable[[_T], None], name: str, depth: int) -> None:
        self._step = step
        self._q: queue.Queue[tuple[_T] | None] = queue.Queue(maxsize=depth)  # None: the end
        self._error: BaseException | None = None  # raised once, by the next put or drain
        self._failed = False  # stays set: no step runs after a failed one
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if not self._failed:
                    self._step(item[0])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self._error, self._failed = exc, True
            finally:
                self._q.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def put(self, item: _T) -> None:
        self._raise()
        self._q.put((item,))

    def drain(self) -> None:
        """Every step put so far has run."""
        self._q.join()
        self._raise()

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()


_IOV_MAX = 1024  # Linux's limit on buffers per pwritev call


def pwritev_all(fd: int, views: list[Any], offset: int) -> None:
    """``views`` written at ``offset``; a short write (rare on files) is continued."""
    views = [memoryview(v).cast("B") for v in views]
    while views:
        n = os.pwritev(fd, views[:_IOV_MAX], offset)
        if n <= 0:
            raise OSError(f"pwritev wrote {n} bytes at {offset}")
        offset += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


DIRECT_ALIGN = 4096  # O_DIRECT: offsets, lengths and buffers on page boundaries (file systems need <= this)


def open_direct(path: str | None) -> int | None:
    """A second, write-only descriptor of ``path`` that bypasses the page cache (Linux
    ``O_DIRECT``), or None where there is none (another OS, tmpfs and the like refuse it)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or not path:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None


class DirectWrites:
    """A file's descriptor and its ``open_direct`` twin: aligned writes go past the page cache
    until the file system refuses one (EINVAL: buffered from then on); the buffered path starts
    the writeback of what it wrote. Used from one thread at a time."""

    def __init__(self, fd: int, path: str | None) -> None:
        self.fd = fd
        self.direct = open_direct(path)

    def write(self, views: list[Any], offset: int, n: int) -> None:
        """``n`` bytes of page-aligned ``views`` at an aligned ``offset``."""
        if self.direct is not None:
            try:
                pwritev_all(self.direct, views, offset)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # ENOSPC, EIO: the file fails, as it would buffered
                    raise
                self.close()  # this file system takes no such write
        self.buffered(views, offset, n)

    def buffered(self, views: list[Any], offset: int, n: int) -> None:
        pwritev_all(self.fd, views, offset)
        start_writeback(self.fd, offset, n)

    def close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None


class DirectAppender:
    """The bytes of a file written front to back, sent to the disk without the page cache.

    They are gathered into page-aligned buffers (three, reused in turn) and each full one is
    written on a thread of its own (``StepThread``: the caller stages and hashes the next block
    meanwhile) through ``open_direct``'s descriptor. The last part block (``finish``) goes
    through ``fd`` as an ordinary write; so does everything once the file system refused an
    aligned write (EINVAL), and, unstaged, everything when there is no direct descriptor. Raw
    frames are written once and never read here again: the page-cache path (a copy into it,
    dirty-page throttling, writeback) cost 2.5-6 kernel CPU-s per 2.2 GB on this loaded machine
    against 0.1-0.15 direct, 7.7-12.4 s against 1.4-1.7 s of wall time, ``fdatasync`` included.
    A failed write is raised by the next ``write`` or by ``finish``; ``close`` always.
    """

    BLOCK = 4 << 20
    STAGES = 3  # one filling, one queued, one being written (the thread's queue holds one)

    def __init__(self, fd: int, path: str | None) -> None:
        self._fd = fd
        self._out = DirectWrites(fd, path)
        self._pos = 0  # file offset of the filling stage's first byte (bytes handed on before it)
        self._started = 0  # bytes whose writeback was started (unstaged path)
        self._fill = 0  # bytes in the filling stage
        self._turn = 0  # index of the filling stage
        self._stages: list[Any] = []
        self._writes: StepThread[tuple[Any, int]] | None = None
        if self._out.direct is not None:
            # anonymous maps are page-aligned; numpy copies into them without the GIL
            self._stages = [np.frombuffer(mmap.mmap(-1, self.BLOCK), np.uint8) for _ in range(self.STAGES)]
            self._writes = StepThread(self._write_block, "direct-writes", 1)

    def _write_block(self, item: tuple[Any, int]) -> None:
        """On the writes thread: one full stage at its offset."""
        stage, pos = item
        self._out.write([stage], pos, stage.nbytes)

    def write(self, views: list[Any]) -> None:
        if self._writes is None:
            pwritev_all(self._fd, views, self._pos)
            self._pos += sum(memoryview(v).nbytes for v in views)
            if self._pos - self._started >= self.BLOCK:
                start_writeback(self._fd, self._started, self._pos - self._started)
                self._started = self._pos
            return
        for v in views:
            a = np.frombuffer(v, np.uint8)
            while a.size:
                k = min(a.size, self.BLOCK - self._fill)
                self._stages[self._turn][self._fill:self._fill + k] = a[:k]
                self._fill += k
                a = a[k:]
                if self._fill == self.BLOCK:
                    # the queue holds one: once this put returns, the stage after it is written
                    self._writes.put((self._stages[self._turn], self._pos))
                    self._pos += self.BLOCK
                    self._fill, self._turn = 0, (self._turn + 1) % self.STAGES

    def finish(self) -> None:
        """Every block written, then the last part block through the ordinary descriptor."""
        if self._writes is not None:
            self._writes.drain()
            if self._fill:
                pwritev_all(self._fd, [self._stages[self._turn][:self._fill]], self._pos)
                self._pos += self._fill
                self._fill = 0

    def close(self) -> None:
        if self._writes is not None:
            self._writes.close()
        self._out.close()


@dataclass(frozen=True)
class WrittenFile:
    """One finished output file of a per-episode unit: its size and, when the writer could
    hash it while writing, the SHA-256 of its bytes (lowercase hex)."""

    size: int
    sha256: str | None


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        b = os.pread(fd, n, offset)
        if not b:
            break
        parts.append(b)
        n -= len(b)
        offset += len(b)
    return b"".join(parts)


class RegionHasher:
    """Sequential SHA-256 of a file whose data regions the caller writes, in file order."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._h = hashlib.sha256()
        self._pos = 0  # bytes hashed so far: the file's prefix [0, pos)
        self._gaps: list[tuple[int, bytes]] = []  # library bytes hashed from the file, kept to recheck
        self._data: list[tuple[int, int]] = []  # [start, end) of regions hashed from our own writes
        self.void = ""  # why the digest cannot be trusted ("" while it can)

    def data(self, offset: int, views: list[Any]) -> None:
        """The caller is about to write ``views`` (contiguous buffers) at ``offset``: hash the
        library's bytes up to there from the file, then ``views``."""
        if offset < self._pos:
            self.void = self.void or f"a data region at {offset} is behind the hashed prefix {self._pos}"
            return
        if self.void:
            return
        if offset > self._pos:
            gap = _pread_all(self._fd, offset - self._pos, self._pos)
            if len(gap) != offset - self._pos:
                self.void = f"the file ends before {offset}"
                return
            self._gaps.append((self._pos, gap))
            self._h.update(gap)
        n = 0
        for v in views:
            self._h.update(v)
            n += memoryview(v).nbytes
        if self._data and self._data[-1][1] == offset:
            self._data[-1] = (self._data[-1][0], offset + n)
        else:
            self._data.append((offset, offset + n))
        self._pos = offset + n

    def finish(self, library_writes: list[tuple[int, int]]) -> str | None:
        """The digest of the closed file, or None. ``library_writes``: (offset, length) of every
        write the library made after the first data region was hashed."""
        if self.void:
            return None
        for off, length in library_writes:
            if any(off < end and start < off + length for start, end in self._data):
                self.void = f"the library wrote {length} bytes at {off}, inside a data region"
                return None
        for off, kept in self._gaps:  # the library may have rewritten them (the superblock at close)
            if _pread_all(self._fd, len(kept), off) != kept:
                self.void = f"the library's bytes at {off} changed after they were hashed"
                return None
        size = os.fstat(self._fd).st_size
        if size < self._pos:
            self.void = f"the file was cut to {size} bytes"
            return None
        h, pos = self._h.copy(), self._pos
        while pos < size:  # the library's tail: its last metadata, small
            tail = _pread_all(self._fd, min(size - pos, 1 << 20), pos)
            if not tail:
                return None
            h.update(tail)
            pos += len(tail)
        return h.hexdigest()
