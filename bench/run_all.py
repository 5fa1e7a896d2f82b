"""Run every benchmark and write one table: bench/RESULTS.md (also printed).

Each bench script prints its own Markdown table, measured against an anchor in the same
run (plain copy, decode-only, OpenSSH's sftp client...). This collects them under one
heading with the date and the machine they were measured on.

    make bench            # full sizes
    make bench QUICK=1    # shorter runs where a bench supports --quick
    python bench/run_all.py bench_upload.py bench_ingest.py   # only these
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = ["bench_capture.py", "bench_split.py", "bench_formats.py", "bench_upload.py", "bench_store.py",
           "bench_ingest.py", "bench_parallel.py", "bench_episodes.py", "bench_rawformats.py",
           # The memory goal: 10,000 short episodes against 1,000 (QUICK: 1,000 vs 100).
           "bench_episodes.py --memory --sizes 1000,10000", "bench_v3.py"]
QUICK_ARGS = {"bench_episodes.py --memory --sizes 1000,10000": ["--memory", "--sizes", "100,1000"]}


HISTORY = "\n## History\n"  # RESULTS.md from this heading on is history, kept across runs

def machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), {mem_gb:.0f} GiB RAM, Python {platform.python_version()}"


def main() -> int:
    quick = "--quick" in sys.argv[1:] or os.environ.get("QUICK") == "1"
    env = dict(os.environ)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.setdefault("ROS_DOMAIN_ID", str(150 + os.getpid() % 80))
    parts = [f"# Benchmarks\n\nMeasured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}.\n"]
    failed = []
    goals: list[str] = []
    only = [a for a in sys.argv[1:] if not a.startswith("-")]  # e.g. run_all.py bench_upload.py
    for name in BENCHES:
        if only and name.split()[0] not in only:
            continue
        script_name, *args = name.split()
        script = HERE / script_name
        if not script.exists():
            parts.append(f"## {name}\n\n(not present)\n")
            continue
        cmd = [sys.executable, str(script)] + (QUICK_ARGS.get(name, ["--quick"]) if quick else args)
        print(f"== {' '.join(cmd)}", flush=True)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=HERE.parent, capture_output=True, text=True)
        took = time.monotonic() - t0
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr[-4000:])
        table = [ln for ln in proc.stdout.splitlines() if ln.startswith(("|", "#", "median", "best-of")) or "goal" in ln]
        status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        if proc.returncode != 0:
            failed.append(name)
        load = f"load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end"
        parts.append(f"## {name} ({status}, {took:.0f} s, {load})\n\n" + "\n".join(table) + "\n")
        # Every bench prints its verdicts as lines starting with "goal"; one list makes the run's
        # met / NOT met readable at a glance, each beside the bench and the load it ran under.
        goals += [f"| {name} | {ln.strip()} | {load0:.1f} |" for ln in proc.stdout.splitlines()
                  if ln.lstrip().lower().startswith("goal") or (ln.startswith("ratio") and "goal" in ln)]
    if goals:
        parts.insert(1, "## Goals\n\n| bench | verdict (anchor measured in the same run) | load at start |\n"
                        "|---|---|---|\n" + "\n".join(goals) + "\n")
    out = HERE / "RESULTS.md"
    out.write_text("\n".join(parts) + kept_history(out), encoding="utf-8")
    print(f"\nwrote {out}")
    return 1 if failed else 0


def kept_history(results: Path) -> str:
    """The hand-kept history section of the last RESULTS.md, which a new run keeps."""
    old = results.read_text(encoding="utf-8") if results.exists() else ""
    return "\n" + old[old.index(HISTORY):].lstrip("\n") if HISTORY in old else ""


if __name__ == "__main__":
    sys.exit(main())
