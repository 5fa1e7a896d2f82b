#!/usr/bin/env python3
"""lerobot_v3 export against LeRobot 0.4.4's converter: whole processes, interleaved pairs.

    python bench/bench_v3.py [--quick] [--rounds N] [--keep DIR] [--baseline OTHER_CHECKOUT]

Two shapes of raw v2.1 dataset (the long one all accepted, a quarter of the short one rejected):

* long: 20 episodes x 300 frames, 2 cameras 640x480 (bench_formats.build_dataset; --quick 6 x 120);
* short: 600 episodes x 4 frames, 2 cameras 320x240 (50 from bench_split.build_source, textured
  frames, a quarter of them red, tiled with bench_split.tile; --quick 300).

Each round runs, one after the other, four whole processes (imports included):

* the conversion LeRobot's converter does: ``LeRobotV3Exporter().export`` of the native v2.1
  subset, then its verifier (what the export job runs for each staged subset);
* the whole verified job ``python -m eva_export.cli export RAW --format lerobot_v3`` (validate
  the raw source, quality split, convert, verify, publish) as a first export: the data root's
  jobs directory removed, so validation reads every file (the goal row);
* the same job again, the facts index of the first kept (a rerun on the unchanged source:
  what validation proved about each unchanged file is not read again);
* LeRobot 0.4.4's ``convert_dataset_v21_to_v30`` on a copy of the same episodes (in
  /tmp/lerobot044's venv; bench_parallel.LEROBOT_SNIPPET).

Wall time, CPU seconds (user + system, children included) and peak RSS come from wait4 on each
process (ru_maxrss covers its reaped children). Medians over the rounds, the ratio as the median of
the rounds' pairs; the load average is printed with every goal line. Writes bench/out/v3.json.

Bytecode: an installed package (pip, colcon) is byte-compiled at install, as LeRobot's venv is;
this checkout is not, and with PYTHONDONTWRITEBYTECODE set every process would compile its
modules again (0.1-0.3 s of each run). The checkouts are byte-compiled once, in place (their
__pycache__ folders are git-ignored), so both sides start as installs do.

``--baseline DIR``: the job and the conversion also run from another checkout (e.g. the main
branch) in the same rounds, interleaved, so a change is measured against its parent under the
same load.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(HERE)]

from bench_split import timed  # noqa: E402  (the wait4 launcher both benches time processes with)

GOAL = 0.2


Timing = tuple[float, float, float]  # wall s, peak RSS MiB, CPU s


def precompile(repos: list[Path]) -> None:
    """Byte-compile every module of ``repos`` into their __pycache__ (git-ignored), as an install
    does. Not PYTHONPYCACHEPREFIX: with it set, the site-packages' own caches are ignored too."""
    for repo in repos:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "eva_export")], check=True,
                       stdout=subprocess.DEVNULL)


def ours(raw: Path, env: dict[str, str], repo: Path = REPO, first: bool = True) -> Timing:
    """The job; ``first``: a first export (the data root's jobs directory, and with it the facts
    index of what validation proved about each file, removed), else a rerun on the unchanged
    source (the facts index the previous run left)."""
    from eva_export.export.paths import export_root

    shutil.rmtree(export_root(raw), ignore_errors=True)
    if first:
        shutil.rmtree(raw.parent / ".jobs", ignore_errors=True)  # export.jobs_dir's default: <data root>/.jobs
    res = timed([sys.executable, "-m", "eva_export.cli", "export", str(raw), "--format", "lerobot_v3"],
                        dict(env, PYTHONPATH=str(repo)), repo)
    assert (export_root(raw) / "lerobot_v3" / "accepted" / "meta" / "info.json").is_file()
    return res


CONVERT = """
import sys
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter
ex = LeRobotV3Exporter()
ex.export(sys.argv[1], sys.argv[2])
report = ex.verify(sys.argv[2])
sys.exit(0 if report.ok else f"verify: {report.errors[:3]}")
"""


def ours_convert(subset: Path, work: Path, env: dict[str, str], repo: Path = REPO) -> Timing:
    """The conversion the converter does (v2.1 subset in, verified v3 out), as its own process."""
    out = work / "v3out"
    shutil.rmtree(out, ignore_errors=True)
    try:
        return timed([sys.executable, "-c", CONVERT, str(subset), str(out)],
                             dict(env, PYTHONPATH=str(repo)), repo)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def theirs(subset: Path, work: Path) -> Timing | None:
    from bench_parallel import LEROBOT_PY, LEROBOT_SNIPPET, lerobot_copy

    if not LEROBOT_PY.is_file():
        return None
    base, env = lerobot_copy(subset, work)
    try:
        return timed([str(LEROBOT_PY), "-c", LEROBOT_SNIPPET, str(base)], env, work)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def build(work: Path, quick: bool) -> dict[str, tuple[Path, Path]]:
    """{shape: (raw source, native subset copy for the converter)}; reused when already built."""
    from bench_formats import build_dataset
    from bench_parallel import as_subset
    from bench_split import build_source, tile

    def make_short(raw: Path) -> Path:  # 50 written by the project's writer, tiled (real copies)
        build_source(raw.parent / "seed", 50, 4, 320, 240)
        tile(raw.parent / "seed", raw, n_short // 50)
        shutil.rmtree(raw.parent / "seed")
        return as_subset(raw)

    episodes, frames = (6, 120) if quick else (20, 300)
    n_short = 300 if quick else 600
    out = {}
    for shape, make in ((f"{episodes} long episodes ({frames} frames, 2 cams 640x480)",
                         lambda p: build_dataset(p, episodes, frames)),
                        (f"{n_short} episodes x 4 frames, 2 cams 320x240", make_short)):
        home = work / ("long" if "long" in shape else "short") / f"{episodes if 'long' in shape else n_short}"
        raw, subset = home / "ds" / "raw", home / "subset"
        if not (subset / "meta" / "info.json").is_file():
            shutil.rmtree(home, ignore_errors=True)
            make(raw)
            shutil.copytree(raw, subset)
            (raw / "meta" / "quality_split.json").unlink()
        out[shape] = (raw, subset)
    return out


ROWS = (("convert", "lerobot_v3 conversion + verify (v2.1 subset in)"),
        ("job", "whole export job, first export (validate, split, convert, verify, publish)"),
        ("rerun", "the same job again on the unchanged source (facts index kept)"))


def one_shape(raw: Path, subset: Path, work: Path, env: dict[str, str], rounds: int,
              baseline: Path | None) -> dict[str, list[Timing]]:
    """Interleaved rounds: each round runs every process once, back to back."""
    runs: dict[str, list[Timing]] = {k: [] for k in ("job", "rerun", "convert", "lerobot", "job_base",
                                                       "rerun_base", "convert_base")}
    for _ in range(max(1, rounds)):
        runs["job"].append(ours(raw, env))
        runs["rerun"].append(ours(raw, env, first=False))
        if baseline is not None:
            runs["job_base"].append(ours(raw, env, baseline))
            runs["rerun_base"].append(ours(raw, env, baseline, first=False))
        runs["convert"].append(ours_convert(subset, work, env))
        if baseline is not None:
            runs["convert_base"].append(ours_convert(subset, work, env, baseline))
        t = theirs(subset, work)
        if t is not None:
            runs["lerobot"].append(t)
    return {k: v for k, v in runs.items() if v}


def report_shape(shape: str, runs: dict[str, list[Timing]], load: tuple[float, float],
                 row: dict[str, Any]) -> list[tuple[str, str]]:
    """The table lines and goal lines of one shape (and the pair ratios into ``row``)."""
    med = {k: tuple(statistics.median(r[i] for r in v) for i in range(3)) for k, v in runs.items()}
    load_s = f"load {load[0]:.1f}-{load[1]:.1f}"
    lines = []
    for k, label in ROWS:
        o_s, o_m, o_c = med[k]
        line = f"| {label}, {shape} | {o_s:.2f} s, {o_c:.2f} CPU s, {o_m:.0f} MiB |"
        if f"{k}_base" in med:
            b_s, b_m, b_c = med[f"{k}_base"]
            pair_b = statistics.median(o[0] / b[0] for o, b in zip(runs[k], runs[f"{k}_base"], strict=False))
            row[f"{k}_vs_baseline"] = pair_b
            line += f" {b_s:.2f} s, {b_c:.2f} CPU s, {b_m:.0f} MiB ({pair_b:.2f}x) |"
        if "lerobot" in med:
            t_s, t_m, t_c = med["lerobot"]
            # each round's pair ran back to back under the same load: its ratio is the measure
            pair = statistics.median(o[0] / t[0] for o, t in zip(runs[k], runs["lerobot"], strict=False))
            row[f"{k}_ratio"] = pair
            line += (f" {t_s:.2f} s, {t_c:.2f} CPU s, {t_m:.0f} MiB | {pair:.2f}x wall (median of the pairs), "
                     f"{o_c / t_c:.2f}x CPU, {o_m / t_m:.2f}x memory | {load_s} |")
            verdict = "met" if pair <= GOAL else "NOT met"
            goal = (f"goal v3 <= {GOAL}x converter ({k}, {shape}): {verdict} ({pair:.2f}x; "
                    f"load average {load[0]:.1f}-{load[1]:.1f})")
        else:
            line += " n/a | n/a | |"
            goal = f"goal v3 <= {GOAL}x converter ({k}, {shape}): not measured (no /tmp/lerobot044)"
        lines.append((line, goal))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 x 120 long episodes, 300 short ones, 3 rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="build (or reuse) the sources here, keep them")
    ap.add_argument("--only", choices=("long", "short"), default=None)
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout, run in the same rounds")
    ap.add_argument("--out", type=Path, default=HERE / "out/v3.json")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="eva_bench_v3_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "rounds": a.rounds}
    lines = []
    try:
        precompile([REPO] + ([a.baseline.resolve()] if a.baseline else []))
        env = dict(os.environ)
        for shape, (raw, subset) in build(work, a.quick).items():
            if a.only and (a.only == "long") != ("long" in shape):  # the short shape's name says "x 4 frames"
                continue
            load0 = os.getloadavg()[0]
            runs = one_shape(raw, subset, work, env, a.rounds, a.baseline.resolve() if a.baseline else None)
            load = (load0, os.getloadavg()[0])
            row: dict[str, Any] = {k: {"s": [r[0] for r in v], "rss_mib": [r[1] for r in v],
                                       "cpu_s": [r[2] for r in v]} for k, v in runs.items()}
            row["load"] = list(load)
            lines += report_shape(shape, runs, load, row)
            results[shape] = row
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2))
    print(f"cpus {os.cpu_count()}; medians of {a.rounds} interleaved rounds (whole processes, wait4)")
    base = f" baseline {a.baseline} |" if a.baseline else ""
    print(f"\n| eva_export, shape | wall, CPU, peak RSS |{base} LeRobot 0.4.4 converter | ratio | load |")
    print("|---|---|" + ("---|" if a.baseline else "") + "---|---|---|")
    for line, _ in lines:
        print(line)
    print()
    for _, goal in lines:
        print(goal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
