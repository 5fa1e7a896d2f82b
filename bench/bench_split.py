"""The native quality split (the whole lerobot_v21 export job) against `cp -r SRC DST && sync`.

    python bench/bench_split.py [--quick] [--pairs N] [--keep] [--baseline OTHER_CHECKOUT]

Two shapes of raw v2.1 source, a quarter of the episodes rated red (renumbered subsets):

* short takes: 600 episodes x 4 frames, 2 cameras 320x240 (50 written by the project's writer,
  tiled with real copies; --quick 120);
* long takes: 20 episodes x 300 frames, 2 cameras 640x480 (--quick 6 x 120).

Each pair runs, one after the other in alternating order, two whole processes: the export job
``python -m eva_export.cli export SRC --format lerobot_v21`` (imports, validation, split,
verification, one sync of the staged tree, publication), from a clean state, and
``cp -r SRC DST && sync`` of the same source. A first pair warms the page cache and is not
counted. Medians over the pairs; the ratio is the median of the pairs' ratios; the load
average is printed with every goal line.

Each pair also runs the least work any split of the source does, as a whole process too: the
interpreter and pyarrow imported; every table read and rewritten with the episode_index and
index columns renumbered into the two subsets, in bulk (pyarrow's dataset reader and writer,
its thread pools on every core, one file per episode renamed into place); every MP4 linked;
the metadata copied; then ``sync``. Nothing validated, verified, counted or summarised: a split
that checks what it publishes cannot be faster than this row. Writes bench/out/split.json. ``--baseline DIR``: the
job of another checkout (e.g. the main branch) runs in the same pairs, under the same load.
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
sys.path[:0] = [str(REPO), str(REPO / "tests")]

GOAL = 2.0


def tile(src: Path, dst: Path, times: int) -> None:
    """A ``times``x larger v2.1 dataset: the source's episodes repeated, renumbered, files copied."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eva_export.formats.common.meta import read_meta
    from eva_export.formats.common.stats import aggregate
    from eva_export.fsutil import atomic_write_json, atomic_write_jsonl

    meta = read_meta(src)
    info = meta.info
    rows, stats_rows, offset, n_src = [], [], 0, len(meta.episodes)
    for rep in range(times):
        for e in meta.episodes:
            new = rep * n_src + e.episode_index
            t = pq.read_table(meta.data_path(e.episode_index))
            n = t.num_rows
            for name, values in (("episode_index", np.full(n, new)), ("index", np.arange(offset, offset + n))):
                i = t.schema.get_field_index(name)
                t = t.set_column(i, t.schema.field(i), pa.array(values.astype(np.int64)))
            out = dst / info.data_file(new)
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, out)
            for key in info.video_keys:
                v = dst / info.video_file(key, new)
                v.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(meta.video_path(key, e.episode_index), v)
            row = e.to_dict()
            row["episode_index"] = new
            rows.append(row)
            st = dict(meta.episodes_stats[e.episode_index].stats)
            stats_rows.append({"episode_index": new, "stats": st})
            offset += n
    (dst / "meta").mkdir(parents=True, exist_ok=True)
    atomic_write_jsonl(dst / "meta/episodes.jsonl", rows)
    atomic_write_jsonl(dst / "meta/episodes_stats.jsonl", stats_rows)
    atomic_write_jsonl(dst / "meta/tasks.jsonl", [t.to_dict() for t in meta.tasks])
    info.total_episodes, info.total_frames = len(rows), offset
    info.total_videos = len(rows) * len(info.video_keys)
    info.total_chunks = (len(rows) + info.chunks_size - 1) // info.chunks_size
    atomic_write_json(dst / "meta/info.json", info.to_dict())
    atomic_write_json(dst / "meta/stats.json", aggregate(r["stats"] for r in stats_rows))


def build_source(root: Path, episodes: int, frames: int, width: int = 320, height: int = 240) -> None:
    """Camera frames with texture and motion (a shifting smoothed-noise pattern), so the MP4s
    have a realistic size; flat colours would make the copy baseline unrealistically cheap."""
    import numpy as np
    from dsfactory import features, state_value

    from eva_export.formats.common.video import VideoSettings
    from eva_export.formats.lerobot_v21.writer import DatasetWriter

    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (2 * height // 8, 2 * width // 8, 3), dtype=np.uint8)
    texture = np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)
    dw = DatasetWriter.open(root, fps=30, features=features(2, width, height, 30), robot_type="bench",
                            settings=VideoSettings(crf=23))
    for e in range(episodes):
        w = dw.begin_episode("pick the cube")
        for f in range(frames):
            s = state_value(e, f)
            x, y = (f * 3 + e * 7) % width, (f * 2 + e * 5) % height
            img = texture[y:y + height, x:x + width]
            noise = rng.integers(0, 12, (height, width, 1), dtype=np.uint8)
            w.add_frame({"observation.state": s, "action": -s, "capture_time": 1000.0 + f / 30},
                        {"observation.images.cam0": img + noise, "observation.images.cam1": img[::-1] + noise})
        dw.commit(w, {"quality": "green" if e % 4 else "red", "quality_issues": []})


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ru_maxrss of a child forked from this (large) process starts at this process's RSS (Linux keeps
# the high-water mark across exec): the command runs under a small launcher (python -S, a few MB),
# which forks it and reports the grandchild's own rusage.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss, ru.ru_utime + ru.ru_stime)
"""


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds of one whole process, from wait4 (bench_v3 too)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *cmd], env=env, cwd=cwd, capture_output=True)
    dt = time.perf_counter() - t0
    code, maxrss_kib, cpu = proc.stdout.split()[-3:]
    if proc.returncode != 0 or int(code) != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({int(code)}): {proc.stderr.decode(errors='replace')[-2000:]}")
    return dt, int(maxrss_kib) / 1024, float(cpu)


def job(src: Path, repo: Path = REPO) -> tuple[float, float, float]:
    """The whole lerobot_v21 export job, as the CLI runs it, from a clean state (no export tree,
    no job records and no facts index of an earlier run: nothing of the source is known)."""
    shutil.rmtree(src.parent / "export", ignore_errors=True)
    shutil.rmtree(src.parent / ".jobs", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    res = timed([sys.executable, "-m", "eva_export.cli", "export", str(src), "--format", "lerobot_v21"], env)
    assert (src.parent / "export" / "lerobot_v21" / "accepted" / "meta" / "info.json").is_file()
    return res


# The least work of a split (see the docstring): run as ``python -c FLOOR SRC DST``.
FLOOR = """
import os, shutil, subprocess, sys
import numpy as np
import pyarrow as pa, pyarrow.dataset as pads
src, dst = sys.argv[1], sys.argv[2]
files = sorted(os.path.join(d, n) for d, _, ns in os.walk(os.path.join(src, "data")) for n in ns)
table = pads.dataset(files, format="parquet").to_table()
old = table.column("episode_index").to_numpy()
for name, keep in (("accepted", old % 4 != 0), ("rejected", old % 4 == 0)):
    sub = table.filter(pa.array(keep))
    _, new = np.unique(sub.column("episode_index").to_numpy(), return_inverse=True)
    for col, values in (("episode_index", new), ("index", np.arange(sub.num_rows))):
        i = sub.schema.get_field_index(col)
        sub = sub.set_column(i, sub.schema.field(i), pa.array(values.astype(np.int64)))
    out = os.path.join(dst, name)
    pads.write_dataset(sub.append_column("part", pa.array(new.astype(np.int64))), os.path.join(out, "parts"),
                       format="parquet", partitioning=pads.partitioning(pa.schema([("part", pa.int64())])),
                       basename_template="t{i}.parquet", max_partitions=1 << 20)
    os.makedirs(os.path.join(out, "data", "chunk-000"))
    for part in os.listdir(os.path.join(out, "parts")):
        os.rename(os.path.join(out, "parts", part, "t0.parquet"),
                  os.path.join(out, "data", "chunk-000", "episode_%06d.parquet" % int(part)))
    for n, e in enumerate(np.unique(old[keep])):
        for cam in os.listdir(os.path.join(src, "videos", "chunk-000")):
            d = os.path.join(out, "videos", "chunk-000", cam)
            os.makedirs(d, exist_ok=True)
            os.link(os.path.join(src, "videos", "chunk-000", cam, "episode_%06d.mp4" % e),
                    os.path.join(d, "episode_%06d.mp4" % n))
    shutil.copytree(os.path.join(src, "meta"), os.path.join(out, "meta"))
subprocess.run(["sync"], check=True)
"""


def floor(src: Path, dst: Path) -> tuple[float, float, float]:
    """The least work of a split of ``src`` (FLOOR), a whole process, as the job's row."""
    shutil.rmtree(dst, ignore_errors=True)
    try:
        return timed([sys.executable, "-c", FLOOR, str(src), str(dst)])
    finally:
        shutil.rmtree(dst, ignore_errors=True)


def copy_sync(src: Path, dst: Path) -> tuple[float, float, float]:
    """``cp -r SRC DST && sync``: the durable copy the split is measured against."""
    shutil.rmtree(dst, ignore_errors=True)
    try:
        return timed(["sh", "-c", 'cp -r "$0" "$1" && sync', str(src), str(dst)])
    finally:
        shutil.rmtree(dst, ignore_errors=True)


def build(base: Path, quick: bool) -> dict[str, Path]:
    """{shape: raw source}: short takes (50 written, tiled with real copies) and long takes."""
    n_short = 150 if quick else 600
    long_eps, long_frames = (6, 120) if quick else (20, 300)
    seed = base / "seed" / "raw"
    build_source(seed, 50, 4)
    short = base / "short" / "raw"
    tile(seed, short, n_short // 50)
    shutil.rmtree(seed.parent)
    long = base / "long" / "raw"
    build_source(long, long_eps, long_frames, 640, 480)
    return {f"{n_short} episodes x 4 frames, 2 cams 320x240": short,
            f"{long_eps} episodes x {long_frames} frames, 2 cams 640x480": long}


def one_shape(src: Path, pairs: int, baseline: Path | None) -> dict:
    """Interleaved pairs (the order alternates from pair to pair: neither side always runs first);
    with ``baseline``, that checkout's job runs in the same pairs."""
    runs: dict[str, list[tuple[float, float, float]]] = ({"job": [], "copy": [], "floor": []}
                                                          | ({"base": []} if baseline else {}))
    load0 = os.getloadavg()[0]
    run = {"job": lambda: job(src), "copy": lambda: copy_sync(src, src.parent / "copy"),
           "floor": lambda: floor(src, src.parent / "floor"), "base": lambda: job(src, baseline or REPO)}
    for r in range(pairs + 1):  # the first pair warms the page cache for both sides, not counted
        order = list(runs) if r % 2 else list(reversed(runs))
        got = {m: run[m]() for m in order}
        if r:
            for m, v in got.items():
                runs[m].append(v)
    ratios = [j[0] / c[0] for j, c in zip(runs["job"], runs["copy"], strict=True)]
    base = {"base_s": statistics.median(v[0] for v in runs["base"]),
            "base_ratio": statistics.median(b[0] / c[0] for b, c in zip(runs["base"], runs["copy"], strict=True)),
            "base_cpu_s": statistics.median(v[2] for v in runs["base"])
            } if baseline else {}
    return {"episodes": len(list((src / "data").rglob("*.parquet"))), "bytes": du(src),
            "job_s": statistics.median(v[0] for v in runs["job"]),
            "copy_s": statistics.median(v[0] for v in runs["copy"]),
            "ratio": statistics.median(ratios),
            "floor_s": statistics.median(v[0] for v in runs["floor"]),
            "floor_ratio": statistics.median(f[0] / c[0] for f, c in zip(runs["floor"], runs["copy"], strict=True)),
            "job_peak_rss_mb": max(v[1] for v in runs["job"]),
            "job_cpu_s": statistics.median(v[2] for v in runs["job"]),
            "runs": runs, "load": (load0, os.getloadavg()[0]), **base}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--baseline", type=Path, help="another checkout whose job runs in the same pairs")
    args = ap.parse_args()
    for repo in (REPO, *([args.baseline] if args.baseline else [])):  # as an install is: no process compiles
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "eva_export")], check=True,
                       stdout=subprocess.DEVNULL)
    base = Path(tempfile.mkdtemp(prefix="bench_split_", dir=os.environ.get("EVA_BENCH_DIR")))
    results = {}
    try:
        t0 = time.perf_counter()
        shapes = build(base, args.quick)
        print(f"built sources in {time.perf_counter() - t0:.1f} s under {base}", file=sys.stderr)
        for shape, src in shapes.items():
            results[shape] = one_shape(src, args.pairs, args.baseline)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{args.pairs} interleaved pairs per shape, medians; whole processes (imports included)\n")
    print("| source | size MB | native split (lerobot_v21 job) s | `cp -r && sync` s | ratio | least work s "
          "| least work / copy | job CPU s | job peak RSS MiB | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape, r in results.items():
        print(f"| {shape} | {r['bytes'] / 1e6:.0f} | {r['job_s']:.2f} | {r['copy_s']:.2f} | {r['ratio']:.2f}x | "
              f"{r['floor_s']:.2f} | {r['floor_ratio']:.2f}x | "
              f"{r['job_cpu_s']:.2f} | {r['job_peak_rss_mb']:.0f} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    for shape, r in results.items():
        if "base_s" in r:
            print(f"baseline {args.baseline} ({shape}): {r['base_s']:.2f} s, {r['base_ratio']:.2f}x `cp -r && sync`, "
                  f"{r['base_cpu_s']:.2f} CPU s")
    for shape, r in results.items():
        print(f"goal split <= {GOAL:g}x `cp -r && sync` ({shape}): {'met' if r['ratio'] <= GOAL else 'NOT met'} "
              f"({r['ratio']:.2f}x; the least work, unverified, on every core: {r['floor_ratio']:.2f}x; "
              f"load {r['load'][0]:.1f}-{r['load'][1]:.1f})")
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "split.json").write_text(json.dumps({"quick": args.quick, "pairs": args.pairs,
                                                         "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
