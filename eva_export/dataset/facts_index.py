"""What validation proved about a file, kept across runs: a small SQLite file keyed by identity.

A verified export validates its source (every table read, every MP4 demuxed), then validates
each staged subset again before publishing; the staged camera files are hard links of the
source's (same inode). Each fact is stored under the file's (st_dev, st_ino, st_size,
st_mtime_ns) and a kind, so the second pass, and a rerun on the unchanged source, cost one
``stat`` and one lookup per file instead of an open and a demux (issue 28).

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

FileKey = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)

_TABLE = ("CREATE TABLE IF NOT EXISTS facts (dev INTEGER, ino INTEGER, size INTEGER, mtime INTEGER, "
          "kind TEXT, payload TEXT, PRIMARY KEY (dev, ino, size, mtime, kind)) WITHOUT ROWID")


class FactsIndex:
    """The index in ``root`` (a directory); thread-safe (one connection behind a lock)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)  # the service's jobs directory
        self.path = self.root / INDEX_NAME
        self._lock = threading.Lock()
        self._pending = 0
        self._db: sqlite3.Connection | None = None
        if not _safe_place(self.root, self.path):
            log.warning("%s is not a plain file inside %s: the export runs without its facts index",
                        self.path, self.root)
            return
        self._db = self._open(first=True)

    def _open(self, first: bool) -> sqlite3.Connection | None:
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(str(self.path), timeout=1.0, check_same_thread=False, isolation_level="DEFERRED")
            # A cache, not a record: no fsync per commit (a damaged file is replaced on open, a
            # row is only found by its file's exact identity).
            db.execute("PRAGMA synchronous = OFF")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                db.execute("DROP TABLE IF EXISTS facts")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute(_TABLE)
            db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM facts LIMIT 1)").fetchone()
            db.commit()
            return db
        except sqlite3.Error as exc:
            if not first:
                log.warning("%s: unusable (%s): the export runs without its facts index", self.path, exc)
                return None
            log.warning("%s: unreadable (%s): replaced by an empty index", self.path, exc)
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # checked above: a plain file of ours, inside the root
            return self._open(first=False)

    @property
    def active(self) -> bool:
        return self._db is not None

    def get(self, key: FileKey | None, kind: str) -> str | None:
        """The payload stored for exactly this file identity and kind, or None."""
        if key is None or self._db is None:
            return None
        with self._lock:
            try:
                row = self._db.execute("SELECT payload FROM facts WHERE dev=? AND ino=? AND size=? AND mtime=? "
                                       "AND kind=?", (*key, kind)).fetchone()
            except (sqlite3.Error, OverflowError):
                return None  # a damaged page (or a key outside SQLite's int64): recomputed
        if row is None or not isinstance(row[0], str) or len(row[0]) > PAYLOAD_MAX:
            return None
        return row[0]

    def put(self, key: FileKey | None, kind: str, payload: str) -> None:
        if key is None or self._db is None or len(payload) > PAYLOAD_MAX:
            return
        with self._lock:
            try:
                self._db.execute("INSERT OR REPLACE INTO facts VALUES (?, ?, ?, ?, ?, ?)", (*key, kind, payload))
                self._pending += 1
                if self._pending >= COMMIT_EVERY:
                    self._db.commit()
                    self._pending = 0
            except (sqlite3.Error, OverflowError) as exc:  # locked by another job, disk full: not kept
                log.debug("%s: fact not kept (%s)", self.path, exc)

    def close(self) -> None:
        with self._lock:
            if self._db is None:
                return
            try:
                self._db.commit()
            except sqlite3.Error as exc:
                log.debug("%s: last facts not kept (%s)", self.path, exc)
            self._db.close()
            self._db = None


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

