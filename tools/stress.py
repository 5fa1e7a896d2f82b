"""The timing-sensitive tests, many times, beside a busy process pinned to one core: `make stress`.

    .venv/bin/python tools/stress.py [--runs 20] [--only upload_resume,console] [--out FILE]

Each group is one pytest invocation per run (a fresh process, as CI runs it); a run passes when
pytest exits 0. While it runs, a CPU hog (`while True: pass`) is pinned to CPU 0, so the tests
share that core with a process that never yields. The ``demo`` group runs `make demo`'s
tools/demo.py (which checks its own scenario: every take's quality and review by the index STOP
returned) and, beside the hog, a disk writer (`dd ... conv=fdatasync` in a loop), the robot
computer busy writing to disk. Prints a Markdown table of pass counts and writes it to --out
(default build/stress.md). Not part of `make test`: 20 runs take long.
Every pytest run picks its own ROS_DOMAIN_ID (tests/conftest.py) and keeps DDS on loopback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {
    "upload_resume": ["tests/test_upload_resume.py"],
    "upload_node": ["tests/test_upload_node.py"],
    "upload_openssh": ["tests/test_upload_openssh.py", "tests/test_upload_core.py"],
    "capture_kill": ["tests/test_capture_kill.py"],
    "capture_timing": ["tests/test_capture_timing.py"],
    "capture_faults": ["tests/test_capture_faults.py"],
    # the save worker held so takes queue; a deaf first start replaced (eva_export/faults.py points)
    "capture_backlog": ["tests/test_capture_backlog.py", "tests/test_capture_heal.py"],
    "export_kill": ["tests/test_export_kill.py", "tests/test_v3_direct_kill.py"],
    "console": ["tests/test_console.py"],
    # Ray batch: several datasets in flight in one driver share the facts index (CI run C).
    "batch": ["tests/test_batch.py"],
    "demo": ["tools/demo.py"],
}
#: Groups that are a script, not pytest, run beside a disk writer as well as the hog.
SCRIPT_GROUPS = {"demo"}
#: The disk writer: 2 GB written and flushed (fdatasync), again and again.
DISK_WRITER = "while :; do dd if=/dev/zero of='{path}' bs=4M count=500 conv=fdatasync 2>/dev/null; done"
# export_kill: each run kills 24 exports by default (~8 min on 2 busy cores); under stress a
# run kills STRESS_KILL_TRIALS (8) with its own seed, so 20 runs are 160 different kill points
# instead of the same 24 twenty times.
KILL_TRIALS = os.environ.get("STRESS_KILL_TRIALS", "8")


def group_env(group: str, run: int) -> dict[str, str]:
    if group == "export_kill":
        return {"EVA_KILL_TRIALS": KILL_TRIALS, "EVA_KILL_SEED": str(1000 + run)}
    return {}


def start_hog() -> subprocess.Popen[bytes]:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(hog.pid, {0})
    return hog


def start_disk_writer(path: Path) -> subprocess.Popen[bytes]:
    """A shell looping dd (its own session, so the whole group is stopped with it)."""
    return subprocess.Popen(["sh", "-c", DISK_WRITER.format(path=path)], start_new_session=True)


def stop_disk_writer(writer: subprocess.Popen[bytes] | None, path: Path) -> None:
    if writer is not None:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    path.unlink(missing_ok=True)


def run_group(paths: list[str], log: Path, extra: dict[str, str], script: bool = False) -> tuple[bool, float]:
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", **extra}
    env.pop("EVA_TEST_DOMAIN_ID", None)  # each run derives its own domain id from its pid
    out = log.with_suffix(".out")
    cmd = [sys.executable, *paths, "--out", str(out)] if script else \
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        fh.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(paths)} {extra} ====\n".encode())
        fh.flush()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    if script and rc == 0:
        shutil.rmtree(out, ignore_errors=True)  # a failed run's output stays for a look
    elif script and out.exists():
        out.rename(out.with_name(f"{out.name}-failed-{time.strftime('%H%M%S')}"))
    return rc == 0, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("--out", default=str(ROOT / "build" / "stress.md"))
    args = ap.parse_args()
    groups = [g for g in GROUPS if not args.only or g in args.only.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = ["| group | passed | runs | median s | load (1 min) |", "|---|---|---|---|---|"]
    # SIGTERM (a stopped stress run) ends through the finally below, so the hog goes with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hog = start_hog()
    failed = False
    try:
        for group in groups:
            log = out.with_name(f"stress-{group}.log")
            log.unlink(missing_ok=True)
            results = []
            script = group in SCRIPT_GROUPS
            disk = out.with_name("stress-disk-writer.bin")
            writer = start_disk_writer(disk) if script else None
            try:
                for i in range(args.runs):
                    ok, secs = run_group(GROUPS[group], log, group_env(group, i), script)
                    results.append((ok, secs))
                    print(f"[stress] {group} run {i + 1}/{args.runs}: {'pass' if ok else 'FAIL'} "
                          f"({secs:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
            finally:
                stop_disk_writer(writer, disk)
            passed = sum(ok for ok, _ in results)
            failed |= passed != args.runs
            median = sorted(s for _, s in results)[len(results) // 2]
            rows.append(f"| {group} | {passed} | {args.runs} | {median:.0f} | {os.getloadavg()[0]:.1f} |")
    finally:
        hog.kill()
        hog.wait()
    table = "\n".join(rows) + "\n"
    out.write_text(table, encoding="utf-8")
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
