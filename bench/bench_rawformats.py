"""Raw-frame formats at the disk: hdf5 and mcap export + fdatasync against ``dd conv=fdatasync``.

    python bench/bench_rawformats.py [--episodes 4 --frames 300] [--baseline /path/to/other/checkout]

Dataset: bench_formats' synthetic one (2 cameras 640x480 @ 30 fps, H.264), here 4 episodes x
300 frames (2.2 GB of raw frames). In interleaved rounds (medians of the rounds), each in its
own subprocess:

* the decode limit: every frame of every camera decoded to RGB (PyAV), an episode's cameras at once;
* hdf5, mcap (lz4, the default; ``mcap:none`` = ``export.mcap_compression: none``) and mcap_foxglove
  (the viewer profile: H.264 packets copied, joints as CDR) exports, every output file
  fdatasync'ed, then ``build_manifest`` of the output (what publication does next), each paired
  with the write limit, ``dd if=/dev/zero bs=4M conv=fdatasync`` of as many bytes, run right
  before or after it (alternating by round), and then ``dd ... oflag=direct`` (the page cache
  bypassed, as the writers now do where they can); with ``--baseline`` the same exports from
  another checkout in the same rounds. The child also times a plain SHA-256 re-read of the
  output (what the manifest did before the exporters hashed their files while writing; from the
  disk, not the page cache, for what was written O_DIRECT).

Reported: medians of seconds, MB/s of output, the per-pair ratio to dd (goal >= 0.8x), peak
RSS, and the load; CPU of the whole child (start-up and the re-read included) and of the
export alone (export + fsync: what a CPU budget for the goal has to cover).
Prints a Markdown table and writes bench/out/rawformats.json.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(HERE)]

CHILD = r"""
import json, os, sys, time
from pathlib import Path
mode, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
extra = {}
if mode == "decode":
    from concurrent.futures import ThreadPoolExecutor
    from eva_export.formats.common.meta import read_meta
    from eva_export.formats.common.video import iter_frames
    t0 = time.perf_counter()
    meta = read_meta(src)
    paths = [meta.video_path(k, e.episode_index) for e in meta.episodes for k in meta.info.video_keys]
    with ThreadPoolExecutor(len(meta.info.video_keys)) as pool:  # the cameras of an episode at once, as hdf5 does
        n = sum(pool.map(lambda p: sum(1 for _ in iter_frames(p)), paths))
else:
    import dataclasses
    from eva_export.formats.registry import get_exporter, get_spec
    from eva_export.manifest import build_manifest, sha256_file
    import resource
    fmt, _, comp = mode.partition(":")
    exporter = get_exporter(fmt, dataclasses.replace(get_spec(fmt).options(), compression=comp) if comp else None)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)  # the export's own CPU: not the start-up, not the re-read
    t0 = time.perf_counter()
    exporter.export(src, out)
    for dirpath, _d, names in os.walk(out):  # durable, as dd conv=fdatasync is
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
    t1 = time.perf_counter()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    build_manifest(out)  # what publication does next: digests recorded while writing, else a re-read
    t2 = time.perf_counter()
    files = [os.path.join(d, n) for d, _s, ns in os.walk(out) for n in ns]
    for f in files:  # the re-read the manifest did before (page cache hot, as it was)
        sha256_file(Path(f))
    extra = {"export_s": t1 - t0, "manifest_s": t2 - t1, "reread_hash_s": time.perf_counter() - t2,
             "export_cpu_s": ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime}
seconds = (extra["export_s"] + extra["manifest_s"]) if extra else time.perf_counter() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
size = sum(os.path.getsize(os.path.join(d, n)) for d, _s, ns in os.walk(out) for n in ns) if out.exists() else 0
print(json.dumps({"seconds": seconds, "peak_rss_mb": int(hwm) / 1024, "bytes": size, **extra}))
"""


def run_child(mode: str, src: Path, out: Path, repo: Path) -> dict[str, float]:
    import resource

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the reaped child's CPU joins this total
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out)], capture_output=True,
                          env=env, cwd=repo, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} ({repo}) failed: {proc.stderr[-2000:]}")
    res: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    res["cpu_s"] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return res


def run_dd(out: Path, nbytes: int, direct: bool = False) -> dict[str, float]:
    count = max(1, nbytes // (4 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={out}", "bs=4M", f"count={count}", "conv=fdatasync"]
                   + (["oflag=direct"] if direct else []), check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    size = out.stat().st_size
    out.unlink()
    return {"seconds": seconds, "bytes": size}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_rounds(rows: list[tuple[str, str, Path]], src: Path, work: Path, rounds: int,
               loads: list[float]) -> dict[str, list[dict[str, float]]]:
    """Each round: every row, order rotated; an export row is a pair with ``dd`` of its bytes,
    the pair's order alternating by round (so neither always gets the cooler page cache)."""
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _m, _r in rows}
    for r in range(rounds):
        for label, mode, repo in rows[r % len(rows):] + rows[:r % len(rows)]:
            loads.append(os.getloadavg()[0])
            out = work / "out"
            if mode == "decode":
                runs[label].append(run_child(mode, src, out, repo))
                continue
            known = runs[label][0]["bytes"] if runs[label] else 0
            dd_first = r % 2 == 1 and known
            dd = run_dd(work / "dd.bin", int(known)) if dd_first else None
            res = run_child(mode, src, out, repo)
            shutil.rmtree(out, ignore_errors=True)
            loads.append(os.getloadavg()[0])
            if dd is None:
                dd = run_dd(work / "dd.bin", int(res["bytes"]))
            res["dd_s"] = dd["seconds"] * res["bytes"] / dd["bytes"]
            res["ratio"] = res["dd_s"] / res["seconds"]
            ddd = run_dd(work / "dd.bin", int(res["bytes"]), direct=True)  # the page cache bypassed, as the writers do
            res["dd_direct_s"] = ddd["seconds"] * res["bytes"] / ddd["bytes"]
            res["ratio_direct"] = res["dd_direct_s"] / res["seconds"]
            runs[label].append(res)
    return runs


def table(runs: dict[str, list[dict[str, float]]], frames: int) -> list[str]:
    lines = ["| row | s (export + fsync + manifest) | of which manifest s | re-read hash s (before) | CPU s (child) | "
             "export CPU s | "
             "output MB | MB/s | dd conv=fdatasync s (same bytes) | ratio to dd | dd oflag=direct s | ratio to it | "
             "frames/s | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, rs in runs.items():
        med = {k: _median([r[k] for r in rs if k in r]) for k in rs[0]}
        mb = med["bytes"] / 1e6
        if "dd_s" not in med:
            lines.append(f"| {label} (PyAV to RGB, cameras in parallel, nothing written) | {med['seconds']:.2f} | | | "
                         f"{med['cpu_s']:.1f} | | | | | | | | {frames / med['seconds']:.0f} | "
                         f"{med['peak_rss_mb']:.0f} |")
            continue
        pairs = ", ".join(f"{r['ratio']:.2f}" for r in rs)
        lines.append(f"| {label} | {med['seconds']:.2f} | {med['manifest_s']:.2f} | {med['reread_hash_s']:.2f} | "
                     f"{med['cpu_s']:.1f} | {med.get('export_cpu_s', float('nan')):.1f} | {mb:.0f} | "
                     f"{mb / med['seconds']:.0f} | {med['dd_s']:.2f} | "
                     f"{med['ratio']:.2f}x (pairs {pairs}) | {med['dd_direct_s']:.2f} | {med['ratio_direct']:.2f}x | "
                     f"{frames / med['seconds']:.0f} | {max(r['peak_rss_mb'] for r in rs):.0f} |")
    return lines


def viewer_line(runs: dict[str, list[dict[str, float]]]) -> None:
    """The viewer profile against the eva-client one: it copies the H.264 packets instead of
    writing decoded frames, so it is compared in time and bytes, not only with dd."""
    if "mcap_foxglove" in runs and "mcap" in runs:
        v, e = (_median([r[k] for r in runs[f]]) for f in ("mcap_foxglove", "mcap") for k in ("seconds",))
        vb, eb = (_median([r["bytes"] for r in runs[f]]) / 1e6 for f in ("mcap_foxglove", "mcap"))
        print(f"mcap_foxglove vs mcap (eva-client): {v:.2f} s vs {e:.2f} s ({e / v:.1f}x faster), "
              f"{vb:.0f} MB vs {eb:.0f} MB ({eb / vb:.0f}x smaller)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="2 episodes x 150 frames, one round")
    ap.add_argument("--formats", default="hdf5,mcap,mcap:none,mcap_foxglove", help="format[:compression], comma-separated")
    ap.add_argument("--source", type=Path, default=None, help="an existing bench_formats dataset (skips the build)")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.frames, args.rounds = 2, 150, 1
    from bench_formats import build_dataset

    work = Path(tempfile.mkdtemp(prefix="bench_raw_", dir=os.environ.get("EVA_BENCH_DIR")))
    rows: list[tuple[str, str, Path]] = [("decode", "decode", REPO)]
    for fmt in args.formats.split(","):
        rows.append((fmt, fmt, REPO))
        if args.baseline:
            rows.append((f"{fmt} (baseline)", fmt, args.baseline))
    loads: list[float] = []
    try:
        src = args.source or build_dataset(work / "src", args.episodes, args.frames)
        runs = run_rounds(rows, src, work, args.rounds, loads)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    frames = args.episodes * args.frames * 2
    print(f"{args.episodes} episodes x {args.frames} frames x 2 cameras 640x480; {args.rounds} interleaved rounds, "
          f"medians; load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("\n".join(table(runs, frames)))
    for fmt in ("hdf5", "mcap", "mcap:none"):  # mcap:none is export.mcap_compression: none
        if fmt in runs:
            ratio = _median([r["ratio"] for r in runs[fmt]])
            print(f"goal {fmt} >= 0.8x write limit: {'met' if ratio >= 0.8 else 'NOT met'} ({ratio:.2f}x, "
                  f"peak RSS {max(r['peak_rss_mb'] for r in runs[fmt]):.0f} MB)")
    viewer_line(runs)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "rawformats.json").write_text(json.dumps({"rows": runs, "loads": loads}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
