"""A small MP4's box parse, kept for the job's second reader of the same unchanged file.

The direct lerobot_v3 job parses each camera MP4 twice: validation checks its frames and
timing (mp4_index.parse), then the writer's probe copies its packets (mp4_index.samples). While
``keeping()`` is active, a parse of a file read by ``mp4_index.file_bytes`` (identity taken
from the stat before the read, as video_facts does) is kept, and the next ``samples`` of the
same file's bytes, read again unchanged, is answered from it once (the entry leaves then).

Memory is bounded by ``BUDGET`` estimated bytes, whatever the episode count or length: an
entry is admitted only while there is room, never evicting (both readers go through the
episodes in order, so the first files kept are the first asked for again). Only files of at
most ``MAX_FILE`` bytes take part: the last one read by each thread is held until its parse.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from .facts_index import FileKey
from .video_facts import key_of

BUDGET = 4 << 20  # estimated bytes of kept parses
MAX_FILE = 1 << 20  # the v3 probe keeps the packets of files up to this size (probe.KEEP_FILE_BYTES)

_lock = threading.Lock()
_users = 0
_kept: dict[FileKey, tuple[Any, int]] = {}  # parse, its estimated bytes
_used = 0
_last = threading.local()  # this thread's last read: .key, .data


@contextlib.contextmanager
def keeping(on: bool = True) -> Iterator[None]:
    """Keep parses for a second reader while active (nested and concurrent jobs share them);
    everything kept is dropped when the last user leaves."""
    global _users, _used
    if not on:
        yield
        return
    with _lock:
        _users += 1
    try:
        yield
    finally:
        _last.key = _last.data = None  # this thread's last read is not held past the job
        with _lock:
            _users -= 1
            if _users == 0:
                _kept.clear()
                _used = 0


def read_done(st: os.stat_result, data: bytes) -> None:
    """``data`` was read whole from the file whose stat before the read was ``st``."""
    key = key_of(st) if _users and len(data) == st.st_size and len(data) <= MAX_FILE else None
    _last.key, _last.data = (key, data) if key is not None else (None, None)


def _of(data: bytes) -> FileKey | None:
    """The identity of the file ``data`` was read from, if this thread's last read."""
    if getattr(_last, "data", None) is not data:
        return None
    key: FileKey | None = _last.key
    _last.key = _last.data = None
    return key


def taken(data: bytes) -> tuple[FileKey | None, Any]:
    """(the file's identity, its kept parse or None) for ``data`` just read by this thread."""
    global _used
    key = _of(data)
    if key is None:
        return None, None
    with _lock:
        found = _kept.pop(key, None)
        if found is None:
            return key, None
        _used -= found[1]
        return None, found[0]


def keep(key: FileKey | None, parsed: Any, frames: int) -> None:
    """Keep ``parsed`` (of ``frames`` samples) for ``key``'s second reader, if there is room."""
    global _used
    if key is None:
        return
    size = 512 + 160 * frames  # the sample tables' tuples and ints, roughly
    with _lock:
        if _users and _used + size <= BUDGET and key not in _kept:
            _kept[key] = (parsed, size)
            _used += size
