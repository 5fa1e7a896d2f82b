"""Many short episodes: the per-episode cost of a verified export, against copying and hashing the bytes.

    python bench/bench_episodes.py [--quick] [--baseline /path/to/other/checkout]
    python bench/bench_episodes.py --memory --sizes 1000,5000,10000 [--baseline ...]
    python bench/bench_episodes.py --frames 4 --sizes 1000 --baseline ...           # the short shape
    python bench/bench_episodes.py --frames 300 --size 640x480 --sizes 20 --baseline ...  # its long shape

Builds 20 episodes x 30 frames (``--frames``; the short shape is 4) x 2 cameras 64x48
with the project's writer, tiles them (real file copies, renumbered; bench_split.tile) to 100
and 1000 episodes, and measures, each in its own subprocess, in interleaved rounds (the order
rotated each round; the median of the rounds):

* anchors of the same bytes: ``cp -r`` of the source, and sha256 of every source byte;
* the least work a split does, unverified ("least work"): every table read and rewritten with its
  episode renumbered (pyarrow defaults), every MP4 hard-linked, meta copied: how far the goal
  "split <= 2x hashing" is from what any split of per-episode files costs on this machine;
* the full lerobot_v21 export job (validate, split, verify, publish: ExportService.run), its wall
  time, time per episode, CPU seconds (the job and its unit workers, from wait4) and peak RSS,
  twice: the first export of the source (no facts index yet: every file read) and the rerun on
  the unchanged source (the facts index in the jobs directory kept, the pair removed);
  with ``--baseline``, the same job run from another checkout (e.g. the commit before a change)
  in the same rounds;
* peak RSS of the lerobot_v3, hdf5 and mcap exporters on the 100- and 1000-episode subsets
  (goal: flat in the episode count; ``--no-exporters`` skips them).

The goal lines ("goal split <= 2x hashing: met / NOT met", and with ``--memory`` "goal 10000
within 10% of 1000") are printed under the tables.

``--memory``: peak RSS only, one job and one run of each exporter per size (and per checkout),
no anchors: the shape of the goal "10,000 short episodes within 10% of 1,000" (a 10,000-episode
job takes about a quarter of an hour on the shared 2-core machine).

Prints Markdown tables (with the load average) and writes bench/out/episodes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(HERE)]

CHILD = r"""
import hashlib, json, os, shutil, subprocess, sys, time
from pathlib import Path
mode, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.perf_counter()
if mode == "cp":
    subprocess.run(["cp", "-r", str(src), str(out)], check=True)
elif mode == "sha256":
    for dirpath, _d, names in sorted(os.walk(src)):
        for n in sorted(names):
            with open(os.path.join(dirpath, n), "rb") as fh:
                hashlib.file_digest(fh, "sha256")
elif mode == "floor":  # the least a split does: every table read and rewritten renumbered, every MP4 linked
    import pyarrow as pa, pyarrow.parquet as pq
    t0 = time.perf_counter()  # without the import, as the job's row
    tables = sorted((src / "data").rglob("*.parquet"))
    for i, path in enumerate(tables):
        tab = pq.read_table(path)
        col = tab.schema.get_field_index("episode_index")
        tab = tab.set_column(col, "episode_index", pa.array([i] * tab.num_rows, tab.schema.field(col).type))
        (out / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(tab, out / path.relative_to(src))
    for dirpath, _d, names in os.walk(src / "videos"):
        dst = out / Path(dirpath).relative_to(src)
        dst.mkdir(parents=True, exist_ok=True)
        for n in names:
            os.link(os.path.join(dirpath, n), dst / n)
    shutil.copytree(src / "meta", out / "meta")
elif mode == "job":
    from eva_export.config import parse_config
    from eva_export.export.runner import ExportService
    cfg = parse_config({"collection": {"log_dir": str(src.parent.parent)}, "export": {"jobs_dir": str(out)}})
    t0 = time.perf_counter()  # the operation, without the interpreter's imports
    job = ExportService(cfg, background=False, recover=False).run(src, "lerobot_v21")
    assert job.state == "completed", job.error
elif mode == "validate":  # source validation alone (read_meta and every table and MP4 checked)
    from eva_export.formats.lerobot_v21.validate import validate_source
    t0 = time.perf_counter()
    validate_source(src)
else:  # an exporter on a subset carrying its quality_split.json
    from eva_export.formats.registry import get_exporter
    get_exporter(mode).export(src, out)
seconds = time.perf_counter() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": seconds, "peak_rss_mb": int(hwm) / 1024}))
"""


def run_child(mode: str, src: Path, out: Path, repo: Path = REPO) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(src), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=repo)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} ({repo}) failed: {stderr.decode()[-2000:]}")
    return json.loads(stdout.decode().strip().splitlines()[-1])


def timed_child(mode: str, src: Path, out: Path, repo: Path = REPO) -> dict[str, float]:
    import resource

    # The reaped child's CPU (with the unit workers it waited for) joins RUSAGE_CHILDREN.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = run_child(mode, src, out, repo)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def build(base: Path, sizes: list[int], frames: int = 30, width: int = 64, height: int = 48) -> dict[int, Path]:
    from bench_split import build_source, tile

    seed = base / "logs" / "seed" / "raw"
    build_source(seed, 20, frames, width=width, height=height)
    out = {}
    for n in sizes:
        out[n] = base / "logs" / f"n{n}" / "raw"
        tile(seed, out[n], n // 20)
    return out


def marked_copy(src: Path, dst: Path) -> Path:
    """A copy of ``src`` shaped like a staged subset (its quality_split.json), for the exporters."""
    from eva_export.export.records import QualitySplit
    from eva_export.formats.common.meta import read_meta

    shutil.copytree(src, dst)
    meta = read_meta(dst)
    QualitySplit(str(src), "accepted", "lerobot_v21", [e.episode_index for e in meta.episodes],
                 episode_count=len(meta.episodes), frame_count=sum(e.length for e in meta.episodes)).write(dst)
    return dst


INDEX = ".facts-index.sqlite"  # eva_export/formats/common/facts_index.py: kept in the jobs directory


def keep_only_index(jobs: Path) -> None:
    """A jobs directory emptied of all but the facts index (the job records of a run removed)."""
    for p in jobs.iterdir() if jobs.is_dir() else []:
        if p.name != INDEX:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def measure_size(n: int, src: Path, base: Path, rounds: int, baseline: Path | None) -> dict[str, Any]:
    """Interleaved rounds (the order rotated each round); medians of each row. ``job``: the
    first export of the source (a new jobs directory: no facts index, every file read);
    ``job_warm``: the rerun on the unchanged source (the jobs directory's index kept, the
    published pair and its staging removed)."""
    modes = [("cp", REPO), ("sha256", REPO), ("floor", REPO), ("job", REPO), ("job_warm", REPO)]
    modes += [("job_base", baseline)] if baseline else []
    runs: dict[str, list[dict[str, float]]] = {}
    loads = []
    warm_jobs = base / "jobs_warm"
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotate: no row always runs first
        for label, repo in order:
            warm = label == "job_warm"
            out = warm_jobs if warm else base / f"out_{label}"
            if warm and not (warm_jobs / INDEX).is_file():
                run_child("job", src, out, repo)  # untimed: the first export leaves the index
                shutil.rmtree(src.parent / "export", ignore_errors=True)
                keep_only_index(out)
            loads.append(os.getloadavg()[0])
            res = timed_child("job" if label.startswith("job") else label, src, out, repo)
            if warm:
                keep_only_index(out)
            else:
                shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(src.parent / "export", ignore_errors=True)
            runs.setdefault(label, []).append(res)
    shutil.rmtree(warm_jobs, ignore_errors=True)
    best = {label: median_run(rs) for label, rs in runs.items()}
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    return {"episodes": n, "bytes": size, "rows": best, "rounds": rounds, "load_min": min(loads),
            "load_max": max(loads)}


def median_run(rs: list[dict[str, float]]) -> dict[str, float]:
    """The run of median wall time (its CPU and RSS with it)."""
    return sorted(rs, key=lambda r: r["seconds"])[(len(rs) - 1) // 2]


def exporter_memory(n: int, src: Path, base: Path) -> dict[str, float]:
    sub = marked_copy(src, base / f"subset_{n}")
    out = {}
    for fmt in ("lerobot_v3", "hdf5", "mcap"):
        dst = base / f"exp_{fmt}_{n}"
        out[fmt] = run_child(fmt, sub, dst)["peak_rss_mb"]
        shutil.rmtree(dst, ignore_errors=True)
    shutil.rmtree(sub, ignore_errors=True)
    return out


def report(results: list[dict[str, Any]], memory: dict[int, dict[str, float]]) -> str:
    lines = ["| episodes | size MB | cp -r s | sha256 s | least work s | job s (first) | job s (rerun) | ms/episode | "
             "job / sha256 | rerun / sha256 | job CPU s | rerun CPU s | job peak RSS MB | baseline job s | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    goals = []
    for r in results:
        b = r["rows"]
        job, warm, sha = b["job"], b["job_warm"], b["sha256"]["seconds"]
        base = f"{b['job_base']['seconds']:.2f} ({b['job_base']['cpu_s']:.1f} CPU s)" if "job_base" in b else "-"
        lines.append(f"| {r['episodes']} | {r['bytes'] / 1e6:.1f} | {b['cp']['seconds']:.3f} | "
                     f"{sha:.3f} | {b['floor']['seconds']:.3f} | {job['seconds']:.2f} | {warm['seconds']:.2f} | "
                     f"{1000 * job['seconds'] / r['episodes']:.1f} | {job['seconds'] / sha:.1f}x | "
                     f"{warm['seconds'] / sha:.1f}x | {job['cpu_s']:.1f} | {warm['cpu_s']:.1f} | {job['peak_rss_mb']:.0f} | {base} | "
                     f"{r['load_min']:.1f}-{r['load_max']:.1f} |")
        for what, row in (("first export", job), ("rerun", warm)):
            ratio = row["seconds"] / sha
            goals.append(f"goal split <= 2x hashing ({r['episodes']} episodes, {what}): "
                         f"{'met' if ratio <= 2 else 'NOT met'} ({ratio:.1f}x; the least work, every table "
                         f"read and rewritten renumbered and every MP4 linked, unverified: "
                         f"{b['floor']['seconds'] / sha:.1f}x)")
    if len(memory) < 2:  # one size: no growth to show
        return "\n".join(lines + [""] + goals)
    small, big = min(memory), max(memory)
    lines += ["", f"| peak RSS MB | {small} episodes | {big} episodes | ratio | goal flat (<= 1.1x) |", "|---|---|---|---|---|"]
    job_mem = {r["episodes"]: r["rows"]["job"]["peak_rss_mb"] for r in results}
    rows = [("lerobot_v21 job", job_mem[small], job_mem[big])]
    rows += [(f"{fmt} exporter", memory[small][fmt], memory[big][fmt]) for fmt in memory[small]]
    for name, a, b in rows:
        lines.append(f"| {name} | {a:.0f} | {b:.0f} | {b / a:.2f}x | {'met' if b / a <= 1.1 else 'NOT met'} |")
    return "\n".join(lines + [""] + goals)


def memory_rows(sizes: list[int], sources: dict[int, Path], base: Path, baseline: Path | None,
                formats: list[str], job_max: int) -> str:
    """Peak RSS of validation, the job and the exporters at each size (the job and exporters up
    to ``job_max`` episodes), each checkout in turn."""
    repos = [("this checkout", REPO)] + ([("baseline", baseline)] if baseline else [])
    goals: list[str] = []
    head = " | ".join(f"{n} episodes" for n in sizes)
    lines = [f"| peak RSS MB | {head} | largest / smallest | goal <= 1.1x |",
             "|---|" + "---|" * (len(sizes) + 2)]
    for label, repo in repos:
        rows: dict[str, list[float]] = {}
        for n in sizes:
            res = run_child("validate", sources[n], base / "out_job", repo)
            rows.setdefault("validate_source", []).append(res["peak_rss_mb"])
            print(f"{label} {n} validate {res['seconds']:.1f} s {res['peak_rss_mb']:.0f} MB", file=sys.stderr)
            if n > job_max:
                continue
            load = os.getloadavg()[0]
            res = run_child("job", sources[n], base / "out_job", repo)
            shutil.rmtree(base / "out_job", ignore_errors=True)
            shutil.rmtree(sources[n].parent / "export", ignore_errors=True)
            rows.setdefault("lerobot_v21 job", []).append(res["peak_rss_mb"])
            print(f"{label} {n} job {res['seconds']:.1f} s {res['peak_rss_mb']:.0f} MB load {load:.1f}", file=sys.stderr)
            sub = marked_copy(sources[n], base / f"subset_{n}")
            for fmt in formats:
                res = run_child(fmt, sub, base / f"exp_{fmt}", repo)
                shutil.rmtree(base / f"exp_{fmt}", ignore_errors=True)
                rows.setdefault(f"{fmt} exporter", []).append(res["peak_rss_mb"])
                print(f"{label} {n} {fmt} {res['seconds']:.1f} s {res['peak_rss_mb']:.0f} MB", file=sys.stderr)
            shutil.rmtree(sub, ignore_errors=True)
        for name, mb in rows.items():  # the job and exporters may stop at --job-max
            ratio = mb[-1] / mb[0]
            cells = [f"{m:.0f}" for m in mb] + ["-"] * (len(sizes) - len(mb))
            lines.append(f"| {name} ({label}) | " + " | ".join(cells)
                         + f" | {ratio:.2f}x ({sizes[len(mb) - 1]} / {sizes[0]}) | {'met' if ratio <= 1.1 else 'NOT met'} |")
            if name == "lerobot_v21 job" and label == "this checkout":
                goals.append(f"goal {sizes[len(mb) - 1]} within 10% of {sizes[0]} (job peak RSS): "
                             f"{'met' if ratio <= 1.1 else 'NOT met'} ({mb[0]:.0f} -> {mb[-1]:.0f} MB, {ratio:.2f}x)")
    return "\n".join(lines + [""] + goals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 and 200 episodes, one round")
    ap.add_argument("--memory", action="store_true", help="peak RSS only (job and exporters), one run per size")
    ap.add_argument("--sizes", default=None, help="comma-separated episode counts (multiples of 20)")
    ap.add_argument("--formats", default="lerobot_v3,hdf5,mcap", help="exporters measured with --memory")
    ap.add_argument("--job-max", type=int, default=0, help="--memory: job and exporters only up to this size")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout whose job runs in the same rounds")
    ap.add_argument("--frames", type=int, default=30, help="frames per episode (the short shape: 4)")
    ap.add_argument("--size", default="64x48", help="camera WIDTHxHEIGHT (the long shape: 640x480)")
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 3, --quick 1)")
    ap.add_argument("--no-exporters", action="store_true", help="skip the v3/hdf5/mcap peak-RSS rows")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    sizes = [100, 200] if args.quick else [100, 1000]
    if args.sizes:
        sizes = sorted(int(n) for n in args.sizes.split(","))
    rounds = args.rounds or (1 if args.quick else 3)
    base = Path(tempfile.mkdtemp(prefix="bench_episodes_", dir=os.environ.get("EVA_BENCH_DIR")))
    try:
        t0 = time.perf_counter()
        width, height = (int(v) for v in args.size.split("x"))
        sources = build(base, sizes, args.frames, width, height)
        # Sources an hour old, as a recorded dataset is (and past video_facts' racy margin).
        old = time.time() - 3600
        for p in base.rglob("*"):
            os.utime(p, (old, old), follow_symlinks=False)
        print(f"built sources in {time.perf_counter() - t0:.1f} s under {base}", file=sys.stderr)
        if args.memory:
            loads = [os.getloadavg()[0]]
            table = memory_rows(sizes, sources, base, args.baseline, [f for f in args.formats.split(",") if f],
                                args.job_max or sizes[-1])
            loads.append(os.getloadavg()[0])
            print(f"load average {min(loads):.1f}-{max(loads):.1f}\n\n{table}")
            return 0
        results = [measure_size(n, sources[n], base, rounds, args.baseline) for n in sizes]
        memory = ({n: {} for n in sizes} if args.no_exporters
                  else {n: exporter_memory(n, sources[n], base) for n in sizes})
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(report(results, memory))
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "episodes.json").write_text(json.dumps({"quick": args.quick, "results": results,
                                                            "exporter_peak_rss_mb": memory}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
