#!/usr/bin/env python3
"""Benchmark episode units in worker processes and the fleet batch; one command, one run.

    PYTHONPATH=. python bench/bench_parallel.py [--quick] [--workers N] [--no-ray] [--no-lerobot]

Every ratio is against an anchor measured in the same run:

1. per format, the full export job (validate, split units, conversion units, verify,
   publish) of the anchor dataset (bench_formats.build_dataset: 20 episodes x 300 frames x 2
   cameras 640x480; --quick: 6 x 120) with 1 worker vs N workers (speed-up), and its output
   throughput against the physical limit: a dd-style write of the same number of bytes with
   fsync (hdf5, mcap) or a plain copy of the source (lerobot_v21, lerobot_v3);
2. the lerobot_v3 exporter against LeRobot 0.4.4's own converter (convert_dataset_v21_to_v30,
   run in /tmp/lerobot044's venv on a copy) on the anchor (a few long episodes) and on a
   many-short-episodes source (1003 episodes x 4 frames, one 64x48 camera, two chunks);
3. a simulated day of 50 small datasets: ``eva-export batch`` on Ray local mode and on the
   local pool against the serial loop (one ExportService.run per dataset, 1 worker), with the
   driver's RSS after the first 10 and after all 50 datasets (flat: no growth per dataset).

Writes a Markdown table to stdout and bench/out/parallel.json.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import psutil  # noqa: E402
from bench_formats import build_dataset  # noqa: E402
from dsfactory import Ep, make_dataset  # noqa: E402

from eva_export.config import parse_config  # noqa: E402
from eva_export.export.batch import RAY_LOOPBACK_ENV, run_batch  # noqa: E402
from eva_export.formats.common.meta import read_meta  # noqa: E402
from eva_export.formats.common.video import VideoSettings  # noqa: E402
from eva_export.formats.lerobot_v21.writer import DatasetWriter  # noqa: E402

os.environ.setdefault(RAY_LOOPBACK_ENV, "0")  # the local Ray instance on loopback only (read at ray's import)
from eva_export.export.paths import ExportPaths  # noqa: E402
from eva_export.export.records import QualitySplit  # noqa: E402
from eva_export.export.runner import ExportService  # noqa: E402
from eva_export.formats.registry import get_exporter  # noqa: E402
from eva_export.jobs import COMPLETED  # noqa: E402

FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap")
LEROBOT_PY = Path("/tmp/lerobot044/bin/python")


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def dd_fsync(path: Path, nbytes: int, block: int = 8 << 20) -> float:
    """Write ``nbytes`` in 8 MiB blocks and fsync: what the disk takes (the physical limit)."""
    buf = os.urandom(block)
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        left = nbytes
        while left > 0:
            fh.write(buf[:min(block, left)])
            left -= block
        fh.flush()
        os.fsync(fh.fileno())
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


def plain_copy(src: Path, dst: Path) -> float:
    t0 = time.perf_counter()
    shutil.copytree(src, dst)
    dt = time.perf_counter() - t0
    shutil.rmtree(dst)
    return dt


def export_job(log_dir: Path, src: Path, fmt: str, workers: int) -> tuple[float, int]:
    cfg = parse_config({"collection": {"log_dir": str(log_dir)}, "export": {"workers": workers}})
    paths = ExportPaths.of(src, fmt)
    shutil.rmtree(paths.root, ignore_errors=True)
    t0 = time.perf_counter()
    job = ExportService(cfg, background=False, recover=False).run(src, fmt)
    dt = time.perf_counter() - t0
    assert job.state == COMPLETED, job.error
    return dt, tree_bytes(paths.pair_dir)


def short_source(root: Path, episodes: int) -> Path:
    """Many short episodes: 4 frames each, one 64x48 camera, chunks of 1000 (two chunks)."""
    import numpy as np
    from dsfactory import features as make_features
    from dsfactory import state_value

    dw = DatasetWriter.open(root, fps=30, features=make_features(1, 64, 48, 30), robot_type="bench",
                            settings=VideoSettings())
    for _ in range(episodes):
        src = dw.next_episode_index
        w = dw.begin_episode("short task")
        for f in range(4):
            s = state_value(src, f)
            img = np.full((48, 64, 3), (src * 7 + f * 20) % 256, np.uint8)
            w.add_frame({"observation.state": s, "action": -s, "capture_time": 1000.0 + f / 30},
                        {"observation.images.cam0": img})
        w.finish()
        dw.commit(w, {"quality": "green", "quality_issues": []})
    return root


def as_subset(root: Path) -> Path:
    meta = read_meta(root)
    QualitySplit(str(root), "accepted", "lerobot_v21", [e.episode_index for e in meta.episodes],
                 episode_count=len(meta.episodes), frame_count=sum(e.length for e in meta.episodes)).write(root)
    return root


# LeRobot's venv (torch 2.13 cpu beside torchvision 0.28) fails to import torchvision
# ("operator torchvision::nms does not exist"); the converter uses none of it, so the
# benchmark stubs torchvision out rather than touch that shared venv.
LEROBOT_SNIPPET = """
import importlib.abc, importlib.machinery, logging, sys, time, types
class _Any(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})
class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = _Any(spec.name)
        m.__path__ = []
        return m
    def exec_module(self, m):
        pass
sys.meta_path.insert(0, _Stub())
from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset
t0 = time.perf_counter()
convert_dataset(repo_id="bench/ds", root=sys.argv[1], push_to_hub=False, force_conversion=True)
print(time.perf_counter() - t0)
"""


def lerobot_copy(subset: Path, work: Path) -> tuple[Path, dict[str, str]]:
    """A copy of ``subset`` laid out for LEROBOT_SNIPPET (the converter renames it in place), and
    the offline environment it runs in (no PYTHONPATH: LeRobot's venv, not this checkout)."""
    base = work / "lr"
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(subset, base / "bench" / "ds")
    (base / "bench" / "ds" / "meta" / "quality_split.json").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return base, env


def lerobot_convert(subset: Path, work: Path) -> float | None:
    """LeRobot 0.4.4's converter on a copy of ``subset`` (it renames the dataset in place)."""
    if not LEROBOT_PY.is_file():
        return None
    base, env = lerobot_copy(subset, work)
    res = subprocess.run([str(LEROBOT_PY), "-c", LEROBOT_SNIPPET, str(base)], capture_output=True, text=True,
                         env=env, timeout=3600)
    shutil.rmtree(base, ignore_errors=True)
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
        return None
    return float(res.stdout.strip().splitlines()[-1])


def v3_export(subset: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    get_exporter("lerobot_v3").export(subset, out)
    dt = time.perf_counter() - t0
    rep = get_exporter("lerobot_v3").verify(out)
    assert rep.ok, rep.errors
    shutil.rmtree(out)
    return dt


def fleet(root: Path, n: int) -> list[Path]:
    return [make_dataset(root / f"robot_{k:02d}" / "raw",
                         [Ep(frames=20, quality="green" if j % 3 else "red") for j in range(4)],
                         cameras=2, width=64, height=48) for k in range(n)]


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 x 120 anchor, 300 short episodes, 12 datasets")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--datasets", type=int, default=None)
    ap.add_argument("--short-episodes", type=int, default=None)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-lerobot", action="store_true")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/out/parallel.json")
    a = ap.parse_args()
    episodes, frames = (6, 120) if a.quick else (20, 300)
    n_short = a.short_episodes or (300 if a.quick else 1003)
    n_ds = a.datasets or (12 if a.quick else 50)
    work = Path(tempfile.mkdtemp(prefix="eva_bench_par_", dir=a.workdir))
    rows: list[tuple[str, str, str, str]] = []
    out: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "workers": a.workers,
                           "anchor": f"{episodes} x {frames} x 2 cams 640x480"}
    try:
        t0 = time.perf_counter()
        anchor = build_dataset(work / "logs" / "anchor" / "raw", episodes, frames)
        subset_copy = work / "anchor_subset"
        shutil.copytree(anchor, subset_copy)  # the native subset the exporters read (with marker)
        (anchor / "meta" / "quality_split.json").unlink()  # the raw source of the jobs
        out["build_anchor_s"] = time.perf_counter() - t0
        src_bytes = tree_bytes(anchor)
        copy_s = min(plain_copy(anchor, work / "copy") for _ in range(2))
        out["plain_copy_s"] = copy_s
        rows.append(("plain copy of the source", f"{copy_s:.2f} s, {src_bytes / 2**20:.0f} MB", "", ""))
        for fmt in FORMATS:
            t1, nbytes = export_job(work / "logs", anchor, fmt, 1)
            tn, _ = export_job(work / "logs", anchor, fmt, a.workers)
            r = {"serial_s": t1, "workers_s": tn, "speedup": t1 / tn, "bytes": nbytes}
            if fmt in ("hdf5", "mcap"):
                limit = min(dd_fsync(work / "dd.bin", nbytes) for _ in range(2))
                r["limit_s"] = limit
                r["vs_limit"] = limit / tn
                goal = ">= 0.8x write limit or >= 1.7x speed-up"
                met = r["vs_limit"] >= 0.8 or r["speedup"] >= 1.7
                lim = f"dd+fsync {limit:.2f} s ({nbytes / 2**20 / limit:.0f} MB/s)"
            else:
                r["limit_s"] = copy_s
                r["vs_limit"] = tn / copy_s
                goal = "<= 3x plain copy" if fmt == "lerobot_v3" else "(reported)"
                met = r["vs_limit"] <= 3 if fmt == "lerobot_v3" else None
                lim = f"copy {copy_s:.2f} s"
            out[fmt] = r
            ratio = (f"{r['vs_limit']:.2f}x of the write limit" if fmt in ("hdf5", "mcap")
                     else f"{r['vs_limit']:.1f}x a plain copy")
            rows.append((f"{fmt}: 1 vs {a.workers} workers",
                         f"{t1:.2f} s vs {tn:.2f} s = {r['speedup']:.2f}x; {nbytes / 2**20 / tn:.0f} MB/s out; "
                         f"{lim}; {ratio}", goal, "" if met is None else str(met)))
        # v3 against LeRobot's converter
        short = as_subset(short_source(work / "short" / "raw", n_short))
        for label, sub in (("few long episodes", subset_copy), (f"{n_short} short episodes", short)):
            ours = min(v3_export(sub, work / "v3out") for _ in range(2))
            theirs = None if a.no_lerobot else lerobot_convert(sub, work)
            r = {"ours_s": ours, "lerobot_s": theirs, "ratio": None if theirs is None else ours / theirs}
            out[f"v3_vs_lerobot_{label}"] = r
            rows.append((f"lerobot_v3 vs LeRobot 0.4.4 converter, {label}",
                         f"{ours:.2f} s vs " + ("n/a" if theirs is None else f"{theirs:.2f} s = {ours / theirs:.2f}x"),
                         "<= 0.2x", "" if theirs is None else str(ours / theirs <= 0.2)))
        # a fleet's day
        day = work / "day"
        srcs = fleet(day, n_ds)
        t0 = time.perf_counter()
        for s in srcs:
            export_job(day, s, "hdf5", 1)
        serial = time.perf_counter() - t0
        out["batch_serial_s"] = serial
        rows.append((f"batch of {n_ds} small datasets (hdf5): serial loop, 1 worker", f"{serial:.1f} s", "", ""))
        for s in srcs:
            shutil.rmtree(ExportPaths.of(s, "hdf5").root)
        t0 = time.perf_counter()
        res = run_batch(day, "hdf5", workers=a.workers)
        local = time.perf_counter() - t0
        assert all(r.result == "published" for r in res), [r for r in res if r.result != "published"]
        out["batch_local_s"] = local
        rows.append((f"batch, local pool of {a.workers}", f"{local:.1f} s = {serial / local:.2f}x the serial loop", "", ""))
        if not a.no_ray:
            import ray

            for s in srcs:
                shutil.rmtree(ExportPaths.of(s, "hdf5").root)
            t0 = time.perf_counter()
            ray.init(num_cpus=a.workers, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
            ray_start = time.perf_counter() - t0
            marks: list[float] = []
            before = rss_mb()

            def seen(_r: Any) -> None:
                marks.append(rss_mb())

            t0 = time.perf_counter()
            res = run_batch(day, "hdf5", ray_address="auto", on_result=seen)
            rt = time.perf_counter() - t0
            ray.shutdown()
            assert all(r.result == "published" for r in res), [r for r in res if r.result != "published"]
            k = min(10, len(marks)) - 1
            out["batch_ray"] = {"start_s": ray_start, "run_s": rt, "rss_before_mb": before,
                                "rss_after_10_mb": marks[k], "rss_after_all_mb": marks[-1]}
            rows.append((f"batch on Ray local mode ({a.workers} CPUs)",
                         f"{rt:.1f} s (+{ray_start:.1f} s ray.init) = {serial / rt:.2f}x the serial loop", "", ""))
            growth = (marks[-1] - marks[k]) / max(1, len(marks) - 1 - k)
            rows.append(("Ray driver RSS: before / after 10 / after all",
                         f"{before:.0f} / {marks[k]:.0f} / {marks[-1]:.0f} MB ({growth:.2f} MB per dataset after 10)",
                         "flat", str(growth < 1.0)))
            t0 = time.perf_counter()
            res = run_batch(day, "hdf5", workers=a.workers)
            out["batch_rerun_s"] = time.perf_counter() - t0
            assert all(r.result == "skipped" for r in res)
            rows.append(("batch rerun (every dataset current: skipped)", f"{out['batch_rerun_s']:.1f} s", "", ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_avg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(f"cpus {os.cpu_count()}, load average at start {out['load_avg'][0]:.1f}, at end {out['load_avg_end'][0]:.1f}; "
          f"anchor {out['anchor']}")
    print("\n| measure | value | goal | met |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
