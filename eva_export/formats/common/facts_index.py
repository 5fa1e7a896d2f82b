"""What validation proved about a file, kept across runs: a small SQLite file keyed by identity.

A verified export validates its source (every table read, every MP4 demuxed), then validates
each staged subset again before publishing; the staged camera files are hard links of the
source's (same inode). Each fact is stored under the file's (st_dev, st_ino, st_size,
st_mtime_ns) and a kind, so the second pass, and a rerun on the unchanged source, cost one
``stat`` and one lookup per file instead of an open and a demux.

The index is hostile input like any file on disk: it holds no paths (nothing read from it can
name a file), a row is only ever found by its exact key, a payload that does not parse as its
kind's record is recomputed (video_facts, validate), and a corrupt or foreign file is replaced.
It lives in the export service's jobs directory, not in a dataset's export tree (a refused
source leaves its export tree untouched); its own path must be a plain file there (a symlink
or a hard link is refused, and the job then runs without it). Memory stays flat in the episode count: rows live in SQLite's
bounded page cache, not in a dict.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: The index file's name in the export service's jobs directory (beside the job records).
INDEX_NAME = ".facts-index.sqlite"
#: Bumped when a payload's meaning changes: an index of another version is emptied.
SCHEMA_VERSION = 1
#: Longest payload read back (a VideoFacts is under 200 bytes; a larger one is not ours).
PAYLOAD_MAX = 16 << 10
#: Writes kept in the open transaction before a commit (one commit per row was the cost).
COMMIT_EVERY = 512
#: An index file larger than this is emptied when a job opens it: rows hold no paths, so the
#: rows of files long deleted cannot be told apart, and a cache must not grow without bound
#: (a row is ~100 bytes: some two million files' facts).
MAX_BYTES = 256 << 20

#: SQLite page cache of a connection, in KiB.
CACHE_KIB = 512

FileKey = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)

_TABLE = ("CREATE TABLE IF NOT EXISTS facts (dev INTEGER, ino INTEGER, size INTEGER, mtime INTEGER, "
          "kind TEXT, payload TEXT, PRIMARY KEY (dev, ino, size, mtime, kind)) WITHOUT ROWID")


class _Connection:
    """One SQLite connection to an index file, shared by every FactsIndex of this process on
    that file (jobs running at once: the service's job threads, a Ray batch's datasets). Two
    connections of one process would lock each other out: a job's open write transaction
    (COMMIT_EVERY rows) made the other job's writes wait and fail."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.lock = threading.Lock()
        self.users = 0
        self.pending = 0


_shared: dict[str, _Connection] = {}
_shared_lock = threading.Lock()
#: SQLite result codes of a file that is not a usable database (replaced), as opposed to one
#: that is busy or locked by another process (then the job runs without the index: never
#: unlink a file another process is using).
_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class FactsIndex:
    """The index in ``root`` (a directory); thread-safe (one connection per file and process,
    behind a lock)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)  # the service's jobs directory
        self.path = self.root / INDEX_NAME
        self._conn: _Connection | None = None
        self._key = ""
        if not _safe_place(self.root, self.path):
            log.warning("%s is not a plain file inside %s: the export runs without its facts index",
                        self.path, self.root)
            return
        key = os.path.realpath(self.path)
        with _shared_lock:
            conn = _shared.get(key)
            if conn is None:
                db = self._open(first=True)
                if db is None:
                    return
                conn = _shared[key] = _Connection(db)
            conn.users += 1
            self._conn, self._key = conn, key

    def _open(self, first: bool) -> sqlite3.Connection | None:
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(str(self.path), timeout=5.0, check_same_thread=False, isolation_level="DEFERRED")
            # A cache, not a record: no fsync per commit (a damaged file is replaced on open, a
            # row is only found by its file's exact identity).
            db.execute("PRAGMA synchronous = OFF")
            # a page cache of 512 KiB, not SQLite's 2 MiB: the file grows ~1 KB per episode, so
            # the default cache grew with the episode count up to 2 MiB; lookups are
            # by key and inserts near the end of the B-tree, whose inner pages stay cached
            db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            too_large = _too_large(self.path)
            if version != SCHEMA_VERSION or too_large:
                db.execute("DROP TABLE IF EXISTS facts")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                if too_large:
                    db.commit()
                    db.execute("VACUUM")  # the freed pages returned: the file shrinks
            db.execute(_TABLE)
            db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM facts LIMIT 1)").fetchone()
            db.commit()
            db.execute("PRAGMA busy_timeout = 200")  # after the open: a busy row write is skipped, not waited for
            return db
        except sqlite3.Error as exc:
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            damaged = getattr(exc, "sqlite_errorcode", None) in _DAMAGED
            if not first or not damaged:
                log.warning("%s: unusable (%s): the export runs without its facts index", self.path, exc)
                return None
            log.warning("%s: unreadable (%s): replaced by an empty index", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # checked above: a plain file of ours, inside the root
            return self._open(first=False)

    @property
    def active(self) -> bool:
        return self._conn is not None

    def get(self, key: FileKey | None, kind: str) -> str | None:
        """The payload stored for exactly this file identity and kind, or None."""
        conn = self._conn
        if key is None or conn is None:
            return None
        with conn.lock:
            try:
                row = conn.db.execute("SELECT payload FROM facts WHERE dev=? AND ino=? AND size=? AND mtime=? "
                                      "AND kind=?", (*key, kind)).fetchone()
            except (sqlite3.Error, OverflowError):
                return None  # a damaged page (or a key outside SQLite's int64): recomputed
        if row is None or not isinstance(row[0], str) or len(row[0]) > PAYLOAD_MAX:
            return None
        return row[0]

    def put(self, key: FileKey | None, kind: str, payload: str) -> None:
        conn = self._conn
        if key is None or conn is None or len(payload) > PAYLOAD_MAX:
            return
        with conn.lock:
            try:
                conn.db.execute("INSERT OR REPLACE INTO facts VALUES (?, ?, ?, ?, ?, ?)", (*key, kind, payload))
                conn.pending += 1
                if conn.pending >= COMMIT_EVERY:
                    conn.db.commit()
                    conn.pending = 0
            except (sqlite3.Error, OverflowError) as exc:  # locked by another process, disk full: not kept
                log.debug("%s: fact not kept (%s)", self.path, exc)

    def close(self) -> None:
        """This job's facts committed; the connection closed when no other job uses it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with _shared_lock, conn.lock:
            try:
                conn.db.commit()
                conn.pending = 0
            except sqlite3.Error as exc:
                log.debug("%s: last facts not kept (%s)", self.path, exc)
            conn.users -= 1
            if conn.users == 0:
                _shared.pop(self._key, None)
                conn.db.close()


def _too_large(path: Path) -> bool:
    try:
        big = os.stat(path).st_size > MAX_BYTES
    except OSError:
        return False
    if big:
        log.info("%s: over %d bytes: emptied (the facts are recomputed as files are read)", path, MAX_BYTES)
    return big


def _safe_place(root: Path, path: Path) -> bool:
    """The index file is absent or a regular file (not a symlink), and root is a directory."""
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            return False
    except OSError:
        return False
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1

