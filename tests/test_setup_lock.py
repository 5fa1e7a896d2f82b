"""tools/setup.sh waits out another apt/dpkg holding the package locks (tools/apt_lock.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX)  # the fcntl write lock apt and dpkg take
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
"""


def _holder(lock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _wait(lock: Path, timeout: float) -> subprocess.Popen[str]:
    return subprocess.Popen(["python3", str(ROOT / "tools/apt_lock.py"), "--timeout", str(timeout)],
                            env={**os.environ, "EVA_APT_LOCKS": str(lock)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_waits_for_the_holder_and_names_it(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    holder = _holder(lock)
    waiter = _wait(lock, 120)
    assert waiter.stdout is not None
    line = waiter.stdout.readline()  # printed while the lock is still held
    assert f"held by pid {holder.pid}" in line and str(lock) in line
    assert waiter.poll() is None  # still waiting
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(30)
    _out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err


def test_gives_up_after_the_timeout_with_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    holder = _holder(lock)
    try:
        _out, err = _wait(lock, 0.3).communicate(timeout=60)
        assert f"gave up after 0 s: {lock} is held by pid {holder.pid}" in err
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)


def test_free_locks_pass_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.touch()
    proc = _wait(lock, 0.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "" and err == ""


def test_setup_waits_before_apt_and_tells_non_root_the_command() -> None:
    setup = (ROOT / "tools/setup.sh").read_text(encoding="utf-8")
    assert setup.index("tools/apt_lock.py") < setup.index("apt-get \"${APT_WAIT[@]}\" update")
    assert "DPkg::Lock::Timeout" in setup
    assert "sudo apt-get install -y --no-install-recommends ${missing[*]}" in setup
