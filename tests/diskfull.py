"""A small real filesystem (tmpfs) for disk-full tests, filled to a known free amount; and whether
a directory's file system takes O_DIRECT (the raw-frame writers' direct path)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

PAGE = 4096


def direct_supported(d: Path) -> bool:
    """True when a file in ``d`` can be opened O_DIRECT (tmpfs and the like refuse it)."""
    try:
        os.close(os.open(d / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_mib`` at ``path`` (the tests run as root), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(fs: Path, leave: int = 0) -> Path:
    """Take all but ``leave`` bytes (rounded down to pages) with one filler file; returns it."""
    filler = fs / f".filler-{len(list(fs.glob('.filler-*')))}"
    with open(filler, "wb") as fh:
        for _ in range(5):  # a writer on the same mount may take space between measure and fill
            take = free_bytes(fs) - leave
            if take <= 0:
                break
            try:
                os.posix_fallocate(fh.fileno(), 0, fh.seek(0, os.SEEK_END) + take - take % PAGE)
                break
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    left = free_bytes(fs)
    assert abs(left - leave) <= PAGE, f"could not fill {fs} to {leave} bytes free ({left} left)"
    return filler


def unfill(fs: Path) -> None:
    for p in fs.glob(".filler-*"):
        p.unlink()
