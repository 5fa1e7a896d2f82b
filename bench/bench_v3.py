#!/usr/bin/env python3
"""lerobot_v3 export against LeRobot 0.4.4's converter: whole processes, interleaved pairs.

    python bench/bench_v3.py [--quick] [--rounds N] [--keep DIR]

Two shapes of the same kind of raw v2.1 dataset (all episodes accepted):

* long: 20 episodes x 300 frames, 2 cameras 640x480 (bench_formats.build_dataset; --quick 6 x 120);
* short: 1000 episodes x 4 frames, one 64x48 camera (50 from bench_parallel.short_source, tiled
  with bench_split.tile; --quick 300).

Each round runs, one after the other, three whole processes (imports included):

* the conversion LeRobot's converter does: ``LeRobotV3Exporter().export`` of the native v2.1
  subset, then its verifier (what the export job runs for each staged subset);
* the whole verified job ``python -m eva_export.cli export RAW --format lerobot_v3`` (validate
  the raw source, quality split, convert, verify, publish);
* LeRobot 0.4.4's ``convert_dataset_v21_to_v30`` on a copy of the same episodes (in
  /tmp/lerobot044's venv; bench_parallel.LEROBOT_SNIPPET).
 Wall time and peak RSS come from wait4 on each
process (ru_maxrss covers its reaped children). Medians over the rounds, the ratio as the median of
the rounds' pairs; the load average is printed with every goal line. Writes bench/out/v3.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(HERE)]

GOAL = 0.2


def timed_process(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one whole process, from wait4."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return dt, usage.ru_maxrss / 1024


def ours(raw: Path) -> tuple[float, float]:
    from eva_export.export.paths import export_root

    shutil.rmtree(export_root(raw), ignore_errors=True)
    shutil.rmtree(raw.parent.parent / ".jobs", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = timed_process([sys.executable, "-m", "eva_export.cli", "export", str(raw), "--format", "lerobot_v3"],
                        env, REPO)
    assert (export_root(raw) / "lerobot_v3" / "accepted" / "meta" / "info.json").is_file()
    return res


CONVERT = """
import sys
from eva_export.formats.lerobot_v3 import LeRobotV3Exporter
ex = LeRobotV3Exporter()
ex.export(sys.argv[1], sys.argv[2])
report = ex.verify(sys.argv[2])
sys.exit(0 if report.ok else f"verify: {report.errors[:3]}")
"""


def ours_convert(subset: Path, work: Path) -> tuple[float, float]:
    """The conversion the converter does (v2.1 subset in, verified v3 out), as its own process."""
    out = work / "v3out"
    shutil.rmtree(out, ignore_errors=True)
    try:
        return timed_process([sys.executable, "-c", CONVERT, str(subset), str(out)],
                             dict(os.environ, PYTHONPATH=str(REPO)), REPO)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def theirs(subset: Path, work: Path) -> tuple[float, float] | None:
    from bench_parallel import LEROBOT_PY, LEROBOT_SNIPPET, lerobot_copy

    if not LEROBOT_PY.is_file():
        return None
    base, env = lerobot_copy(subset, work)
    try:
        return timed_process([str(LEROBOT_PY), "-c", LEROBOT_SNIPPET, str(base)], env, work)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def build(work: Path, quick: bool) -> dict[str, tuple[Path, Path]]:
    """{shape: (raw source, native subset copy for the converter)}; reused when already built."""
    from bench_formats import build_dataset
    from bench_parallel import as_subset, short_source
    from bench_split import tile

    def make_short(raw: Path) -> Path:  # 50 written by the project's writer, tiled (real copies)
        short_source(raw.parent / "seed", 50)
        tile(raw.parent / "seed", raw, n_short // 50)
        shutil.rmtree(raw.parent / "seed")
        return as_subset(raw)

    episodes, frames = (6, 120) if quick else (20, 300)
    n_short = 300 if quick else 1000
    out = {}
    for shape, make in ((f"{episodes} long episodes ({frames} frames, 2 cams 640x480)",
                         lambda p: build_dataset(p, episodes, frames)),
                        (f"{n_short} episodes x 4 frames", make_short)):
        home = work / ("long" if "long" in shape else "short") / f"{episodes if 'long' in shape else n_short}"
        raw, subset = home / "ds" / "raw", home / "subset"
        if not (subset / "meta" / "info.json").is_file():
            shutil.rmtree(home, ignore_errors=True)
            make(raw)
            shutil.copytree(raw, subset)
            (raw / "meta" / "quality_split.json").unlink()
        out[shape] = (raw, subset)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 x 120 long episodes, 300 short ones, 3 rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="build (or reuse) the sources here, keep them")
    ap.add_argument("--only", choices=("long", "short"), default=None)
    ap.add_argument("--out", type=Path, default=HERE / "out/v3.json")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="eva_bench_v3_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "rounds": a.rounds}
    lines = []
    try:
        for shape, (raw, subset) in build(work, a.quick).items():
            if a.only and a.only not in shape:
                continue
            load0 = os.getloadavg()[0]
            runs: dict[str, list[tuple[float, float]]] = {"job": [], "convert": [], "lerobot": []}
            for _ in range(max(1, a.rounds)):  # interleaved: one of each per round
                runs["job"].append(ours(raw))
                runs["convert"].append(ours_convert(subset, work))
                t = theirs(subset, work)
                if t is not None:
                    runs["lerobot"].append(t)
            load1 = os.getloadavg()[0]
            row: dict[str, Any] = {k: {"s": [r[0] for r in v], "rss_mib": [r[1] for r in v]} for k, v in runs.items()}
            row["load"] = [load0, load1]
            med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
                   for k, v in runs.items() if v}
            load = f"load {load0:.1f}-{load1:.1f}"
            for k, label in (("convert", "lerobot_v3 conversion + verify (v2.1 subset in)"),
                             ("job", "whole export job (validate, split, convert, verify, publish)")):
                o_s, o_m = med[k]
                line = f"| {label}, {shape} | {o_s:.2f} s, {o_m:.0f} MiB |"
                if "lerobot" in med:
                    t_s, t_m = med["lerobot"]
                    # each round's pair ran back to back under the same load: its ratio is the measure
                    pair = statistics.median(o[0] / t[0] for o, t in zip(runs[k], runs["lerobot"], strict=False))
                    row[f"{k}_ratio"] = pair
                    line += (f" {t_s:.2f} s, {t_m:.0f} MiB | {pair:.2f}x wall (median of the pairs), "
                             f"{o_m / t_m:.2f}x memory | {load} |")
                    verdict = "met" if pair <= GOAL else "NOT met"
                    goal = (f"goal v3 <= {GOAL}x converter ({k}, {shape}): {verdict} ({pair:.2f}x; "
                            f"load average {load0:.1f}-{load1:.1f})")
                else:
                    line += " n/a | n/a | |"
                    goal = f"goal v3 <= {GOAL}x converter ({k}, {shape}): not measured (no /tmp/lerobot044)"
                lines.append((line, goal))
            results[shape] = row
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2))
    print(f"cpus {os.cpu_count()}; medians of {a.rounds} interleaved rounds (whole processes, wait4)")
    print("\n| eva_export, shape | wall, peak RSS | LeRobot 0.4.4 converter | ratio | load |\n|---|---|---|---|---|")
    for line, _ in lines:
        print(line)
    print()
    for _, goal in lines:
        print(goal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
