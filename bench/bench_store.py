#!/usr/bin/env python3
"""Benchmark eva_store random access and size against LeRobot v3 and HDF5; one command, one run.

    PYTHONPATH=. python bench/bench_store.py [--quick] [--episodes 20 --frames 300]

Dataset: the anchor of bench_formats (20 episodes x 300 frames x 2 cameras 640x480 at 30 fps,
H.264 libx264 ultrafast, keyframe every 10 frames), exported in the same run to eva_store
(JPEG, the default, and raw), LeRobot v3 and HDF5. Reported:

* random-access samples/s (uniform random sample indices, both cameras decoded, state and
  action) with 1 and with 2 worker processes (forked, started together), for eva_store jpeg
  and raw, and for LeRobot 0.4.4's ``LeRobotDataset`` (torchcodec backend) on the v3 export,
  run in the lerobot venv of tools/lerobot_venvs.sh; PyAV seek+decode random access is
  measured too as a second anchor (and the only one when that venv is missing);
* goals: jpeg >= 5x LeRobot per worker, raw >= 20x, 2 workers >= 1.7x one worker;
* bytes on disk vs the v3 export and vs the HDF5 export (goal jpeg <= 1/5 of HDF5);
* export throughput (frames/s) vs decode-only (PyAV to RGB);
* where a jpeg sample's time goes: pread of the records (I/O, page cache warm), MessagePack
  unpack, JPEG decode, and the rest (Python: index lookup, dict, numeric rows).

Files are read once before timing (warm page cache): the numbers are CPU cost, not disk.
Writes a Markdown table to stdout and bench/out/store.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_formats import CAMS, H, W, build_dataset, decode_only  # noqa: E402

from eva_export.formats.common.meta import read_meta  # noqa: E402
from eva_export.formats.eva_store import open_store  # noqa: E402
from eva_export.formats.eva_store.codecs import decode_image, unpack_record  # noqa: E402
from eva_export.formats.eva_store.exporter import EvaStoreExporter  # noqa: E402
from eva_export.formats.eva_store.options import EvaStoreOptions
from eva_export.formats.registry import get_exporter  # noqa: E402
from eva_export.formats.verify import verify_export  # noqa: E402

LEROBOT_VENV = Path(os.environ.get("LEROBOT_VENV_BASE", "/tmp")) / "lerobot044"
WARMUP = 10


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def warm(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def sample_indices(n_total: int, count: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_total, count).tolist()


# ---- eva_store readers -------------------------------------------------------------------------
def _store_worker(path: str, indices: list[int], barrier: Any, out: Any) -> None:
    store = open_store(path)
    for s in store.manifest.shards:  # steady state: each shard opened once per worker (timed apart)
        store[s.row_start]
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in indices:
        s = store[i]
        assert s["observation.images.cam0"].shape == (H, W, 3)
    out.put((len(indices), time.perf_counter() - t0, time.process_time() - c0))


def _rate(res: list[tuple[int, float, float]]) -> dict[str, float]:
    """Aggregate rate of workers started together, and the CPU each sample cost.

    ``core_share`` is CPU time / wall time per worker: below 1 the worker waited for a core
    (the machine is shared), which is what keeps 2 workers from scaling, not the store.
    """
    total = sum(r[0] for r in res)
    wall = max(r[1] for r in res)
    cpu = sum(r[2] for r in res)
    return {"samples": total, "wall_s": round(wall, 3), "samples_per_s": total / wall,
            "cpu_ms_per_sample": 1e3 * cpu / total, "core_share": cpu / sum(r[1] for r in res)}


def store_rate(path: Path, workers: int, per_worker: int, seed: int) -> dict[str, float]:
    """Aggregate samples/s of ``workers`` forked processes reading random samples at once."""
    return _forked_rate(_store_worker, path, len(open_store(path)), workers, per_worker, seed)


def _forked_rate(worker: Any, path: Path, n_total: int, workers: int, per_worker: int,
                 seed: int) -> dict[str, float]:
    """Start ``workers`` forked readers together (a barrier) and aggregate their rates."""
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(str(path), sample_indices(n_total, per_worker, seed + w), barrier, q))
             for w in range(workers)]
    for p in procs:
        p.start()
    res = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return _rate(res)


def breakdown(path: Path, count: int, seed: int) -> dict[str, float]:
    """CPU ms per sample (process time, so other load on the machine does not count).

    ``total`` is ``store[i]``; ``frames`` the frame reads alone (both cameras); for encoded
    codecs those split into pread (I/O from the page cache), msgpack unpack and image decode;
    a raw frame is one ``preadv`` into its array (I/O = the frame time). ``python_rest`` =
    total - frames: index lookup, numeric rows, the dict.
    """
    store = open_store(path)
    idx = sample_indices(len(store), count, seed)
    t0 = time.process_time()
    for s in store.manifest.shards:  # the one-time cost of opening every shard in this process
        store[s.row_start]
    open_ms = 1e3 * (time.process_time() - t0) / len(store.manifest.shards)
    keys = store.frame_keys
    cpu = time.process_time
    t0 = cpu()
    for i in idx:
        store[i]
    total = cpu() - t0
    t0 = cpu()
    for i in idx:
        h = store._shard_handle(int(store._shard[i]))
        for k in keys:
            h.frame(k, int(store._row[i]))
    frames = cpu() - t0
    n = len(idx)
    ms = {"total_ms": 1e3 * total / n, "frames_ms": 1e3 * frames / n, "shard_open_ms": open_ms}
    if store.manifest.materialized_blocks.image_codec != "raw":
        t_io = t_unpack = t_dec = 0.0
        for i in idx:
            for k in keys:
                a = cpu()
                buf = store.raw_record(i, k)
                b = cpu()
                codec, shape, data = unpack_record(buf)
                c = cpu()
                decode_image(data, codec, shape)
                d = cpu()
                t_io, t_unpack, t_dec = t_io + b - a, t_unpack + c - b, t_dec + d - c
        ms.update(io_pread_ms=1e3 * t_io / n, msgpack_ms=1e3 * t_unpack / n, image_decode_ms=1e3 * t_dec / n)
    ms["python_rest_ms"] = max(0.0, ms["total_ms"] - ms["frames_ms"])
    return ms


# ---- PyAV anchor: what a video-backed loader must do per sample ---------------------------------
def _pyav_worker(src: str, indices: list[int], barrier: Any, out: Any) -> None:
    import av

    meta = read_meta(Path(src))
    eps = [(e.episode_index, e.length) for e in meta.episodes]
    starts = np.cumsum([0] + [n for _, n in eps])
    keys = meta.info.video_keys
    fps = meta.info.fps

    def one(i: int) -> None:
        e = int(np.searchsorted(starts, i, side="right") - 1)
        frame_no = i - int(starts[e])
        for k in keys:
            with av.open(str(meta.video_path(k, eps[e][0]))) as c:
                s = c.streams.video[0]
                c.seek(int(frame_no / fps / s.time_base), stream=s, backward=True)
                for f in c.decode(s):
                    if f.pts is not None and round(float(f.pts * s.time_base) * fps) >= frame_no:
                        f.to_ndarray(format="rgb24")
                        break

    for i in indices[:3]:
        one(i)
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in indices:
        one(i)
    out.put((len(indices), time.perf_counter() - t0, time.process_time() - c0))


def pyav_rate(src: Path, n_total: int, workers: int, per_worker: int, seed: int) -> dict[str, float]:
    return _forked_rate(_pyav_worker, src, n_total, workers, per_worker, seed)


# ---- LeRobot 0.4.4 (its own venv; torch lives only there) ---------------------------------------
LEROBOT_SNIPPET = r"""
import json, os, sys, time, multiprocessing as mp
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import numpy as np, torch
try:
    _lib = torch.library.Library("torchvision", "FRAGMENT")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
except Exception:
    pass
torch.set_num_threads(1)
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root, workers, per_worker, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ds = LeRobotDataset("bench/store_anchor", root=root, video_backend="torchcodec")
n = len(ds)
def work(w, barrier, q):
    idx = np.random.default_rng(seed + w).integers(0, n, per_worker).tolist()
    for i in idx[:3]:
        ds[i]
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in idx:
        s = ds[i]
        assert s["observation.images.cam0"].shape[0] == 3
    q.put((len(idx), time.perf_counter() - t0, time.process_time() - c0))
ctx = mp.get_context("fork")
barrier, q = ctx.Barrier(workers), ctx.Queue()
ps = [ctx.Process(target=work, args=(w, barrier, q)) for w in range(workers)]
[p.start() for p in ps]
res = [q.get() for _ in ps]
[p.join() for p in ps]
tot = sum(r[0] for r in res); wall = max(r[1] for r in res); cpu = sum(r[2] for r in res)
print(json.dumps({"samples": tot, "wall_s": round(wall, 3), "samples_per_s": tot / wall, "frames": n,
                  "cpu_ms_per_sample": 1e3 * cpu / tot, "core_share": cpu / sum(r[1] for r in res)}))
"""


def lerobot_rate(v3: Path, workers: int, per_worker: int, seed: int) -> dict[str, Any] | None:
    py = LEROBOT_VENV / "bin" / "python"
    if not py.exists():
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(py), "-c", LEROBOT_SNIPPET, str(v3), str(workers), str(per_worker), str(seed)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        print(f"lerobot run failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--samples", type=int, default=400, help="random samples per worker (eva_store)")
    ap.add_argument("--anchor-samples", type=int, default=60, help="random samples per worker (LeRobot, PyAV)")
    ap.add_argument("--quick", action="store_true", help="4 episodes x 100 frames, fewer samples")
    ap.add_argument("--no-hdf5", action="store_true", help="skip the HDF5 export (11 GB at full size)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/out/store.json")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.frames, args.samples, args.anchor_samples = 4, 100, 150, 20

    work = Path(tempfile.mkdtemp(prefix="bench_store_", dir=args.workdir))
    res: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "loadavg_start": os.getloadavg()},
                           "dataset": {"episodes": args.episodes, "frames_per_episode": args.frames, "cameras": CAMS,
                                       "width": W, "height": H, "codec": "h264 libx264 ultrafast, gop 10"}}
    rows: list[tuple[str, str, str, str]] = []
    try:
        print(f"building {args.episodes} x {args.frames} frames x {CAMS} cameras {W}x{H} ...", file=sys.stderr)
        src = build_dataset(work / "src", args.episodes, args.frames)
        warm(src)
        n_frames = args.episodes * args.frames
        video_frames = n_frames * CAMS

        t_decode = timed(lambda: decode_only(src))
        decode_fps = video_frames / t_decode
        exports: dict[str, dict[str, Any]] = {}
        for name, ex in (("eva_store jpeg", EvaStoreExporter()), ("eva_store raw", EvaStoreExporter(EvaStoreOptions(image_codec="raw")))):
            out = work / name.replace(" ", "_")
            t = timed(lambda: ex.export(src, out))  # noqa: B023
            rep = verify_export(out)
            exports[name] = {"dir": out, "s": t, "fps": video_frames / t, "bytes": tree_bytes(out), "ok": rep.ok}
        t = timed(lambda: get_exporter("lerobot_v3").export(src, work / "v3"))
        exports["lerobot_v3"] = {"dir": work / "v3", "s": t, "bytes": tree_bytes(work / "v3"),
                                 "ok": verify_export(work / "v3").ok}
        if not args.no_hdf5:
            t = timed(lambda: get_exporter("hdf5").export(src, work / "hdf5"))
            exports["hdf5"] = {"s": t, "fps": video_frames / t, "bytes": tree_bytes(work / "hdf5"), "ok": None}
            shutil.rmtree(work / "hdf5")  # 11 GB at full size; only its size is needed
        for e in exports.values():
            if "dir" in e:
                warm(e["dir"])

        # random access
        ra: dict[str, dict[int, dict[str, Any] | None]] = {}
        for name in ("eva_store jpeg", "eva_store raw"):
            ra[name] = {w: store_rate(exports[name]["dir"], w, args.samples, seed=100) for w in (1, 2)}
        ra["lerobot 0.4.4 (v3)"] = {w: lerobot_rate(work / "v3", w, args.anchor_samples, seed=100) for w in (1, 2)}
        ra["PyAV seek+decode (v2.1 MP4s)"] = {w: pyav_rate(src, n_frames, w, args.anchor_samples, seed=100)
                                              for w in (1, 2)}
        res["breakdown_jpeg_ms"] = breakdown(exports["eva_store jpeg"]["dir"], min(200, args.samples), seed=7)
        res["breakdown_raw_ms"] = breakdown(exports["eva_store raw"]["dir"], min(200, args.samples), seed=7)
        res["loadavg_end"] = os.getloadavg()

        lr = ra["lerobot 0.4.4 (v3)"][1]
        anchor_name = "lerobot 0.4.4 (v3)" if lr else "PyAV seek+decode (v2.1 MP4s)"
        anchor1 = ra[anchor_name][1]["samples_per_s"]  # type: ignore[index]
        res["anchor"] = anchor_name
        for name, per in ra.items():
            for w, r in per.items():
                if r is None:
                    rows.append((f"{name}, {w} worker(s)", "not measured (no lerobot venv)", "", ""))
                    continue
                ratio = r["samples_per_s"] / anchor1
                rows.append((f"{name}, {w} worker(s)", f"{r['samples_per_s']:.1f} samples/s ({r['samples']} in "
                             f"{r['wall_s']:.1f} s); {ratio:.1f}x anchor 1 worker; CPU {r['cpu_ms_per_sample']:.1f} "
                             f"ms/sample, {r['core_share']:.2f} core per worker", "", ""))
        for name, goal in (("eva_store jpeg", 5.0), ("eva_store raw", 20.0)):
            one = ra[name][1]["samples_per_s"]  # type: ignore[index]
            two = ra[name][2]["samples_per_s"]  # type: ignore[index]
            rows.append((f"{name} per worker vs {anchor_name}", f"{one / anchor1:.1f}x", f">= {goal:.0f}x",
                         str(one / anchor1 >= goal)))
            rows.append((f"{name}: 2 workers / 1 worker", f"{two / one:.2f}x", ">= 1.7x", str(two / one >= 1.7)))
        if ra[anchor_name][2]:
            a2 = ra[anchor_name][2]["samples_per_s"]  # type: ignore[index]
            rows.append((f"{anchor_name}: 2 workers / 1 worker", f"{a2 / anchor1:.2f}x", "(reference)", ""))
        for name in ("eva_store jpeg", "eva_store raw"):
            e = exports[name]
            parts = [f"{e['bytes'] / 2**20:.0f} MB", f"{e['bytes'] / exports['lerobot_v3']['bytes']:.1f}x v3"]
            if "hdf5" in exports:
                parts.append(f"{e['bytes'] / exports['hdf5']['bytes']:.3f}x hdf5")
            goal, met = ("<= 0.2x hdf5", str(e["bytes"] <= 0.2 * exports["hdf5"]["bytes"])) \
                if name.endswith("jpeg") and "hdf5" in exports else ("", "")
            rows.append((f"{name} bytes on disk", ", ".join(parts), goal, met))
            rows.append((f"{name} export", f"{e['s']:.1f} s, {e['fps']:.0f} frames/s = {e['fps'] / decode_fps:.2f}x "
                         f"decode-only ({decode_fps:.0f} frames/s); verified={e['ok']}", "(reported)", ""))
        rows.append(("lerobot_v3 bytes on disk", f"{exports['lerobot_v3']['bytes'] / 2**20:.0f} MB", "", ""))
        if "hdf5" in exports:
            rows.append(("hdf5 bytes on disk", f"{exports['hdf5']['bytes'] / 2**20:.0f} MB "
                         f"(export {exports['hdf5']['s']:.1f} s)", "", ""))
        b = res["breakdown_jpeg_ms"]
        rows.append(("CPU of a jpeg sample (1 process)",
                     f"{b['total_ms']:.2f} ms = frames {b['frames_ms']:.2f} (pread {b['io_pread_ms']:.2f} + msgpack "
                     f"{b['msgpack_ms']:.2f} + JPEG decode {b['image_decode_ms']:.2f}) + Python rest "
                     f"{b['python_rest_ms']:.2f}; once per shard per worker: open {b['shard_open_ms']:.0f} ms",
                     "", ""))
        b = res["breakdown_raw_ms"]
        rows.append(("CPU of a raw sample (1 process)",
                     f"{b['total_ms']:.2f} ms = frames {b['frames_ms']:.2f} (preadv into the array: I/O) + Python rest "
                     f"{b['python_rest_ms']:.2f}", "", ""))
        for name in ("eva_store jpeg", "eva_store raw"):
            cpu_ratio = ra[anchor_name][1]["cpu_ms_per_sample"] / ra[name][1]["cpu_ms_per_sample"]  # type: ignore[index]
            rows.append((f"{name} CPU per sample vs {anchor_name}", f"{cpu_ratio:.1f}x less CPU", "(load-independent)",
                         ""))
        res["random_access"] = ra
        res["exports"] = {k: {kk: vv for kk, vv in v.items() if kk != "dir"} for k, v in exports.items()}
        res["decode_only_fps"] = decode_fps
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.episodes} episodes x {args.frames} frames x {CAMS} cameras {W}x{H}; "
          f"load average {res['machine']['loadavg_start'][0]:.1f} at start, {res['loadavg_end'][0]:.1f} at end "
          f"(2 cores, shared); anchor: {res['anchor']}\n")
    print("| measure | value | goal | met |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
