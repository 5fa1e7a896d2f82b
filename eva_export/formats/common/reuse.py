"""What validation read, kept for the job's second reader of the same unchanged file.

An export job reads each source episode twice: validation checks it, then the writer (the
split's units, the direct v3 writer) reads it again to copy it. While ``keeping()`` is active,
validation keeps what it already has in hand for that second read, and the reader takes it
once (the entry leaves then):

- a small camera MP4's box parse (mp4_index.parse), answered to the v3 probe's
  ``mp4_index.samples`` of the same file's bytes, read again unchanged;
- a small episode table, read whole instead of only its small columns, answered to the
  reader's ``take_table`` of the same unchanged file (keyed by the stat taken before the read,
  as video_facts keys its facts, and too-fresh files never kept);
- an episodes_stats.jsonl row as read_meta parsed it (stats_index.StatsIndex asks ``admit``).

Memory is bounded by ``BUDGETS`` (estimated bytes of each kind), whatever the episode count or
length: an entry is admitted only while its kind has room, never evicting (validation and the
writers go through the episodes in order, so the first entries kept are the first asked for).
Each kind has its own budget: read_meta parses every stats row before any table is read, and
would otherwise take all the room. Everything kept is dropped when the last job keeping leaves.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from .facts_index import FileKey
from .video_facts import key_of

PARSE, TABLE, ROW = "parse", "table", "row"
BUDGETS = {PARSE: 4 << 20, TABLE: 16 << 20, ROW: 16 << 20}  # estimated bytes kept of each kind
#: A small table's memory beyond its buffers, per column (measured: an 8-column 4-row table of
#: 380 bytes of data held 28 KB of process memory: wrappers, schema, arrays, allocator slabs)
TABLE_COLUMN_BYTES = 3584
MAX_FILE = 1 << 20  # the v3 probe keeps the packets of files up to this size (probe.KEEP_FILE_BYTES)
MAX_TABLE_FILE = 1 << 20  # tables read whole for the second reader up to this size on disk

_lock = threading.Lock()
_users = 0
_parse_users = 0  # jobs whose writer probes the MP4s again (the direct v3 job)
_table_users = 0  # jobs whose writer reads the tables in this process
# (kind, file) -> (what was kept, its estimated bytes, its admission ticket)
_entries: dict[tuple[str, FileKey], tuple[Any, int, int]] = {}
_used = dict.fromkeys(BUDGETS, 0)
_generation = 1  # bumped when everything kept is dropped: a late release is not counted then
_last = threading.local()  # this thread's last MP4 read: .key, .data


@contextlib.contextmanager
def keeping(parses: bool = False, tables: bool = True) -> Iterator[None]:
    """Keep validation's reads for a second reader while active (nested and concurrent jobs
    share them): statistics rows; tables unless ``tables`` is False (the writer reads them in
    worker processes); MP4 parses too with ``parses``. Everything kept is dropped when the last
    user leaves."""
    global _users, _parse_users, _table_users, _generation
    with _lock:
        _users += 1
        _parse_users += int(parses)
        _table_users += int(tables)
    try:
        yield
    finally:
        _last.key = _last.data = None  # this thread's last read is not held past the job
        with _lock:
            _users -= 1
            _parse_users -= int(parses)
            _table_users -= int(tables)
            if _users == 0:
                _entries.clear()
                _used.update(dict.fromkeys(_used, 0))
                _generation += 1


def active() -> bool:
    return _users > 0


def admit(kind: str, size: int) -> int:
    """Room for ``size`` more estimated bytes of ``kind`` while a job keeps: taken from its
    budget, and the ticket to ``release`` them with; 0 when there is no room."""
    with _lock:
        if not _users or _used[kind] + size > BUDGETS[kind]:
            return 0
        _used[kind] += size
        return _generation


def release(kind: str, size: int, ticket: int) -> None:
    """``size`` bytes of ``kind`` admitted with ``ticket`` handed out or dropped by their holder
    (not counted when the job that admitted them has ended)."""
    with _lock:
        if ticket == _generation:
            _used[kind] -= size


def _put(kind: str, key: FileKey, value: Any, size: int) -> None:
    """Keep ``value`` of ``key`` (replacing an earlier one of the same file) if ``kind`` has room."""
    if ticket := admit(kind, size):
        with _lock:
            old = _entries.pop((kind, key), None)
            _entries[(kind, key)] = (value, size, ticket)
        if old is not None:
            release(kind, old[1], old[2])


def _pop(kind: str, key: FileKey) -> Any:
    """What is kept of ``key`` (None: nothing), out of the keeping and the budget."""
    with _lock:
        found = _entries.pop((kind, key), None)
    if found is None:
        return None
    release(kind, found[1], found[2])
    return found[0]


def held(kind: str) -> int:
    """How many entries of ``kind`` are kept now."""
    with _lock:
        return sum(k == kind for k, _ in _entries)


# ---- MP4 box parses ---------------------------------------------------------------------------
def read_done(st: os.stat_result, data: bytes) -> None:
    """``data`` was read whole from the file whose stat before the read was ``st``."""
    key = key_of(st) if _parse_users and len(data) == st.st_size and len(data) <= MAX_FILE else None
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
    key = _of(data)
    if key is None:
        return None, None
    found = _pop(PARSE, key)
    return (key, None) if found is None else (None, found)


def keep(key: FileKey | None, parsed: Any, frames: int) -> None:
    """Keep ``parsed`` (of ``frames`` samples) for ``key``'s second reader, if there is room."""
    if key is None:
        return
    _put(PARSE, key, parsed, 512 + 160 * frames)  # the sample tables' tuples and ints, roughly


# ---- episode tables ---------------------------------------------------------------------------
def wants_table(st: os.stat_result) -> FileKey | None:
    """The key to keep the table of the file stated ``st`` under, if it is worth reading whole
    for a second reader now (a job keeps, the file is small and not too fresh); else None."""
    if not _table_users or st.st_size > MAX_TABLE_FILE:
        return None
    return key_of(st)


def table_bytes(table: pa.Table) -> int:
    """A kept table's estimated share of the process's memory."""
    return int(table.nbytes) + TABLE_COLUMN_BYTES * int(table.num_columns)


def keep_table(key: FileKey | None, table: pa.Table) -> None:
    if key is None:
        return
    _put(TABLE, key, table, table_bytes(table))


def take_table(path: Path) -> pa.Table | None:
    """The table validation kept for the file at ``path`` if it is still the file it read."""
    if not _used[TABLE]:  # nothing kept: no stat
        return None
    try:
        key = key_of(os.stat(path))
    except OSError:
        return None
    return None if key is None else _pop(TABLE, key)
