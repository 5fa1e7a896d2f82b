"""Native quality split (a full lerobot_v21 export job) against a plain recursive copy.

    python bench/bench_split.py [--quick] [--keep]

Builds a source of 20 episodes x 300 frames x 2 cameras 320x240 with the project's writer, and a
10x larger one by tiling it (real file copies, renumbered). For each, in the same run: the time
of ``shutil.copytree`` of the source and of ``ExportService.run(source, "lerobot_v21")``
(validation, per-episode units, assembly, pair publication), each in its own subprocess whose
peak RSS is read from its own /proc VmHWM. Goals: split <= 1.5x the copy; peak memory flat
from the small to the 10x source. Prints a Markdown table and writes bench/out/split.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

CHILD = r"""
import json, os, shutil, sys, time
from pathlib import Path
mode, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.perf_counter()
if mode == "copy":
    shutil.copytree(src, out)
    extra = {}
else:
    from eva_export.config import parse_config
    from eva_export.export.runner import ExportService
    t_import = time.perf_counter()
    cfg = parse_config({"collection": {"log_dir": str(src.parent.parent)},
                        "export": {"jobs_dir": str(out)}})
    job = ExportService(cfg, background=False, recover=False).run(src, "lerobot_v21")
    assert job.state == "completed", job.error
    extra = {"import_s": t_import - t0, "accepted": job.accepted_episodes, "rejected": job.rejected_episodes}
    t0 = t_import  # the operation itself, without the interpreter's imports
seconds = time.perf_counter() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": seconds, "peak_rss_mb": int(hwm) / 1024, **extra}))
"""


def run_child(mode: str, src: Path, out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(src), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    stdout = proc.stdout.read()  # type: ignore[union-attr]
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    _pid, status, _usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed: {stderr.decode()[-2000:]}")
    # Peak RSS is the child's own VmHWM: ru_maxrss of a forked child also counts the parent's
    # image at fork time, which would hide the child's own peak.
    return json.loads(stdout.decode().strip().splitlines()[-1])


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


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    episodes, frames = (10, 100) if quick else (20, 300)
    base = Path(tempfile.mkdtemp(prefix="bench_split_", dir=os.environ.get("EVA_BENCH_DIR")))
    results = []
    try:
        t0 = time.perf_counter()
        small = base / "logs" / "small" / "raw"
        build_source(small, episodes, frames)
        big = base / "logs" / "big" / "raw"
        tile(small, big, 10)
        print(f"built sources in {time.perf_counter() - t0:.1f} s under {base}", file=sys.stderr)
        for name, src in (("small", small), ("10x", big)):
            n_ep = len(list((src / "data").rglob("*.parquet")))
            size = du(src)
            best: dict[str, dict] = {}
            for _attempt in range(2):  # alternate, keep the faster of two (page cache warm for both)
                for mode in ("copy", "split"):
                    out = base / f"out_{mode}"
                    export_dir = src.parent / "export"
                    res = run_child(mode, src, out)
                    shutil.rmtree(out, ignore_errors=True)
                    shutil.rmtree(export_dir, ignore_errors=True)
                    if mode not in best or res["seconds"] < best[mode]["seconds"]:
                        best[mode] = res
            results.append({"source": name, "episodes": n_ep, "frames": n_ep * frames, "bytes": size,
                            "copy_s": best["copy"]["seconds"], "split_s": best["split"]["seconds"],
                            "ratio": best["split"]["seconds"] / best["copy"]["seconds"],
                            "copy_peak_rss_mb": best["copy"]["peak_rss_mb"],
                            "split_peak_rss_mb": best["split"]["peak_rss_mb"],
                            "split_import_s": best["split"]["import_s"]})
    finally:
        if "--keep" not in sys.argv[1:]:
            shutil.rmtree(base, ignore_errors=True)
    print("| source | episodes | frames | size MB | copytree s | native split s | split/copy | copy peak RSS MB | split peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['source']} | {r['episodes']} | {r['frames']} | {r['bytes'] / 1e6:.1f} | {r['copy_s']:.3f} | "
              f"{r['split_s']:.3f} | {r['ratio']:.2f}x | {r['copy_peak_rss_mb']:.0f} | {r['split_peak_rss_mb']:.0f} |")
    flat = results[1]["split_peak_rss_mb"] / results[0]["split_peak_rss_mb"]
    ok_speed = all(r["ratio"] <= 1.5 for r in results)
    print(f"goal split <= 1.5x copytree: {'met' if ok_speed else 'NOT met'}; "
          f"goal flat memory: 10x source peak RSS is {flat:.2f}x the small one's "
          f"({'met' if flat <= 1.2 else 'NOT met'})")
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "split.json").write_text(json.dumps({"quick": quick, "results": results,
                                                         "memory_ratio_10x": flat}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
