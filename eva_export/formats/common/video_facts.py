"""What demuxing a camera file proved, remembered for the rest of the process.

An export job demuxes every source MP4 while validating the source, then validates each staged
subset again before publishing it. The staged camera files are hard links of the source's
(same inode), so the second pass would open and demux the very same bytes. A fact learnt about
a file is reused while the file's (device, inode, size, mtime_ns) are unchanged.

File timestamps come from a coarse kernel clock: a file rewritten within one tick of being read
can keep its mtime_ns. As in git's "racy" index rule, a fact is only kept for a file whose
mtime was already ``RACY_MARGIN_NS`` old when it was read; a fresher file is demuxed every time.

During an export job the facts go to the export root's persistent index (facts_index, set by
``use_index``): kept across runs, and not in a dict that grows with the episode count. A stored
payload that does not parse as a VideoFacts is treated as absent (the file is demuxed again).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .facts_index import FactsIndex, FileKey

#: A file modified less than this long before it was read is never remembered (see above).
RACY_MARGIN_NS = 2_000_000_000
#: Bound on remembered files (a few hundred bytes each); the table is emptied when it is full.
MAX_ENTRIES = 1 << 18



@dataclass(frozen=True)
class VideoFacts:
    """A camera file that passed check_video's demux: its size and frames, and the timing
    problems (none, or the texts) of its packets against frame i at i / fps."""

    width: int
    height: int
    frames: int
    fps: int
    timing: tuple[str, ...]

    def to_payload(self) -> str:
        return json.dumps([self.width, self.height, self.frames, self.fps, list(self.timing)])

    @staticmethod
    def from_payload(text: str) -> VideoFacts | None:
        """The facts a payload states, or None for anything not of their exact shape."""
        try:
            w, h, n, fps, timing = json.loads(text)
        except (ValueError, TypeError, RecursionError):
            return None
        ints = (w, h, n, fps)
        if not all(type(v) is int and 0 <= v < 1 << 31 for v in ints) or not isinstance(timing, list) \
                or not all(isinstance(t, str) for t in timing):
            return None
        return VideoFacts(w, h, n, fps, tuple(timing))


KIND = "mp4-demux-v1"  # what a stored row means (facts_index rows of other kinds are others')

_lock = threading.Lock()
# Outside a job: the key packed into 32 bytes and equal facts shared (most cameras of a dataset
# have the same size, frame count and no timing problem): a tuple of four ints and a VideoFacts
# per file were ~700 bytes per two-camera episode for validate_source alone.
_facts: dict[bytes, VideoFacts] = {}
_shared: dict[VideoFacts, VideoFacts] = {}
_KEY = struct.Struct("<QQQq")  # st_dev, st_ino, st_size (unsigned), st_mtime_ns
# The job's index, per thread of control: several jobs run at once in one process (the export
# service's job threads, a Ray batch's datasets), and one job leaving its block must not take
# another's index away (a module global did, and restored a closed one).
_index: contextvars.ContextVar[FactsIndex | None] = contextvars.ContextVar("eva_facts_index", default=None)


@contextlib.contextmanager
def use_index(index: FactsIndex | None) -> Iterator[None]:
    """Facts looked up in and stored to ``index`` inside the block (an export job), in this
    thread's context only."""
    token = _index.set(index)
    try:
        yield
    finally:
        _index.reset(token)


def file_key(path: Path) -> FileKey | None:
    """The file's identity now, or None when it is too fresh to be remembered (or unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return key_of(st)


def key_of(st: os.stat_result) -> FileKey | None:
    """``file_key`` of a stat just taken (None when the file is too fresh to be remembered)."""
    if st.st_mtime_ns > time.time_ns() - RACY_MARGIN_NS:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def lookup(key: FileKey | None) -> VideoFacts | None:
    if key is None:
        return None
    index = _index.get()
    if index is not None and index.active:
        payload = index.get(key, KIND)
        return VideoFacts.from_payload(payload) if payload is not None else None
    with _lock:
        return _facts.get(_KEY.pack(*key))


def remember(key: FileKey | None, facts: VideoFacts) -> None:
    """Keep ``facts`` for the file whose identity was ``key`` before it was read."""
    if key is None:
        return
    index = _index.get()
    if index is not None and index.active:
        index.put(key, KIND, facts.to_payload())
        return
    with _lock:
        if len(_facts) >= MAX_ENTRIES:
            _facts.clear()
            _shared.clear()
        _facts[_KEY.pack(*key)] = _shared.setdefault(facts, facts)


def forget_all() -> None:
    """Drop every remembered fact (tests; a caller that distrusts the file system's mtimes)."""
    with _lock:
        _facts.clear()
        _shared.clear()


def index_active() -> bool:
    index = _index.get()
    return index is not None and index.active


def index_get(key: FileKey, kind: str) -> str | None:
    """A payload of another kind (validate_tables) from the job's index, if one is in use."""
    index = _index.get()
    return index.get(key, kind) if index is not None else None


def index_put(key: FileKey, kind: str, payload: str) -> None:
    index = _index.get()
    if index is not None:
        index.put(key, kind, payload)


SHA256_KIND = "sha256"


def known_sha256(path: Path, compute: Callable[[Path], str]) -> str:
    """The file's SHA-256 from the job's index when its identity is unchanged (a hard link of a
    source file hashed by an earlier run), else ``compute``d and kept. The identity is taken
    before the read, and a stored value that is not 64 lowercase hex digits is not used."""
    key = file_key(path) if index_active() else None
    if key is not None:
        known = index_get(key, SHA256_KIND)
        if known is not None and len(known) == 64 and all(c in "0123456789abcdef" for c in known):
            return known
    digest = compute(path)
    if key is not None:
        index_put(key, SHA256_KIND, digest)
    return digest


#: Bytes of camera files a job holds for hashing at once (one larger file is held alone).
DIGESTS_PENDING_BYTES = 32 << 20
#: Threads hashing them (hashlib releases the GIL: on another core than validation).
DIGEST_THREADS = 2
#: A file smaller than this is hashed in the reading thread (a hand-off costs more than its hash).
DIGEST_INLINE_BYTES = 1 << 20


class _Digests:
    """SHA-256 of source camera files from the bytes validation already read (the content
    manifest of a pair that links them then reads none of them again), hashed on one thread
    beside validation (hashlib releases the GIL), each stored in the job's index under the
    identity the file had before it was read."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="eva-digest")
        self.pending: list[tuple[FileKey, int, Any]] = []
        self.held = 0

    def add(self, key: FileKey, data: bytes) -> None:
        if len(data) < DIGEST_INLINE_BYTES:
            index_put(key, SHA256_KIND, hashlib.sha256(data).hexdigest())
            return
        while self.pending and self.held + len(data) > DIGESTS_PENDING_BYTES:
            self._store_first()
        self.held += len(data)
        self.pending.append((key, len(data), self.pool.submit(lambda: hashlib.sha256(data).hexdigest())))

    def _store_first(self) -> None:
        key, size, fut = self.pending.pop(0)
        self.held -= size
        index_put(key, SHA256_KIND, fut.result())

    def finish(self) -> None:
        try:
            while self.pending:
                self._store_first()
        finally:
            self.pool.shutdown(cancel_futures=True)


_digests: contextvars.ContextVar[_Digests | None] = contextvars.ContextVar("eva_source_digests", default=None)


@contextlib.contextmanager
def digests_of_reads(on: bool = True) -> Iterator[None]:
    """Inside the block (an export job that links the source's camera files), validation's
    reads of whole camera files also give their SHA-256 to the job's index; ``on`` False: none."""
    if not on or not index_active():
        yield
        return
    digests = _Digests()
    token = _digests.set(digests)
    try:
        yield
        digests.finish()
    finally:
        _digests.reset(token)
        digests.pool.shutdown(cancel_futures=True)


def digest_read(key: FileKey | None, data: bytes) -> None:
    """``data``, every byte of the file whose identity was ``key`` before it was read, hashed
    for the job's index when a ``digests_of_reads`` block asks for it."""
    digests = _digests.get()
    if digests is not None and key is not None:
        digests.add(key, data)


def digests_wanted() -> bool:
    """Whether a ``digests_of_reads`` block asks for the SHA-256 of camera files read here (a
    reader on another thread hashes what it reads, and ``digest_known`` stores it)."""
    return _digests.get() is not None


def digest_known(key: FileKey | None, sha256: str) -> None:
    """``digest_read`` of a file hashed where it was read: its SHA-256 (hex) stored as given."""
    if _digests.get() is not None and key is not None:
        index_put(key, SHA256_KIND, sha256)
