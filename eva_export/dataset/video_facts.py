"""What demuxing a camera file proved, remembered for the rest of the process.

An export job demuxes every source MP4 while validating the source, then validates each staged
subset again before publishing it. The staged camera files are hard links of the source's
(same inode), so the second pass would open and demux the very same bytes. A fact learnt about
a file is reused while the file's (device, inode, size, mtime_ns) are unchanged.

File timestamps come from a coarse kernel clock: a file rewritten within one tick of being read
can keep its mtime_ns. As in git's "racy" index rule, a fact is only kept for a file whose
mtime was already ``RACY_MARGIN_NS`` old when it was read; a fresher file is demuxed every time.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: A file modified less than this long before it was read is never remembered (see above).
RACY_MARGIN_NS = 2_000_000_000
#: Bound on remembered files (a few hundred bytes each); the table is emptied when it is full.
MAX_ENTRIES = 1 << 18

FileKey = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)


@dataclass(frozen=True)
class VideoFacts:
    """A camera file that passed check_video's demux: its size and frames, and the timing
    problems (none, or the texts) of its packets against frame i at i / fps."""

    width: int
    height: int
    frames: int
    fps: int
    timing: tuple[str, ...]


_lock = threading.Lock()
_facts: dict[FileKey, VideoFacts] = {}


def file_key(path: Path) -> FileKey | None:
    """The file's identity now, or None when it is too fresh to be remembered (or unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_mtime_ns > time.time_ns() - RACY_MARGIN_NS:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def lookup(key: FileKey | None) -> VideoFacts | None:
    if key is None:
        return None
    with _lock:
        return _facts.get(key)


def remember(key: FileKey | None, facts: VideoFacts) -> None:
    """Keep ``facts`` for the file whose identity was ``key`` before it was read."""
    if key is None:
        return
    with _lock:
        if len(_facts) >= MAX_ENTRIES:
            _facts.clear()
        _facts[key] = facts


def forget_all() -> None:
    """Drop every remembered fact (tests; a caller that distrusts the file system's mtimes)."""
    with _lock:
        _facts.clear()
