"""Wait until no other apt/dpkg process holds the package locks (used by tools/setup.sh).

    python3 tools/apt_lock.py [--timeout SECONDS]

Runs with the system python3, before the venv exists. apt and dpkg take fcntl write locks on
the files below; unattended upgrades on a robot hold them for minutes. This waits (bounded),
says who holds the lock, and exits 1 when the wait runs out. apt-get then runs with
-o DPkg::Lock::Timeout for whatever starts in between.
``EVA_APT_LOCKS`` (colon-separated paths) replaces the list, for the test.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import struct
import sys
import time

LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock",
         "/var/cache/apt/archives/lock")


# struct flock on Linux (x86_64, aarch64): l_type, l_whence, l_start, l_len, l_pid, padding
FLOCK = "hhqqi4x"


def holder(path: str) -> str | None:
    """'pid N (command)' of the process holding ``path``'s lock, or None when it is free.

    F_GETLK asks without taking the lock, so the probe never makes apt itself fail.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # missing or not ours to open: apt itself will say so
    try:
        probe = struct.pack(FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        l_type, _, _, _, pid = struct.unpack(FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    finally:
        os.close(fd)
    if l_type == fcntl.F_UNLCK:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd or '?'})"


def wait(paths: list[str], timeout: float, poll: float = 1.0) -> str | None:
    """None once every lock is free; else the last holder when ``timeout`` ran out."""
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        busy = [(p, h) for p in paths if (h := holder(p)) is not None]
        if not busy:
            return None
        path, who = busy[0]
        if time.monotonic() >= deadline:
            return f"{path} is held by {who}"
        if who != said:
            print(f"[setup] waiting for {path}: held by {who} (up to {timeout:.0f} s)", flush=True)
            said = who
        time.sleep(poll)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    env = os.environ.get("EVA_APT_LOCKS", "")
    paths = env.split(":") if env else list(LOCKS)
    busy = wait(paths, args.timeout, poll=0.1 if env else 1.0)
    if busy:
        print(f"[setup] ERROR: gave up after {args.timeout:.0f} s: {busy}; wait for it to finish "
              "(or stop it) and run tools/setup.sh again", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
