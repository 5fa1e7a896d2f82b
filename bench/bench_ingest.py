"""Bag ingest benchmark: 3 cameras 640x480 rgb8 at 30 Hz + JointState at 100 Hz, rosbag2 MCAP.

    .venv/bin/python bench/bench_ingest.py            # bags of 20 s and 60 s (about 5.5 GB)
    .venv/bin/python bench/bench_ingest.py --quick    # bags of 5 s and 15 s

The bags are written by `rosbags` (an independent writer, as `ros2 bag record` would) into a
temporary directory and removed afterwards. Per bag length:

* decode only: read the bag and turn every image message into its RGB array (the mcap stream
  reader, CDR decoding and the same intake conversion and image decoder ingest uses), no
  alignment, no encoding: the floor for ingest;
* ingest: ``eva-export ingest`` (one episode per bag) in a child process: wall time, camera
  frames/s, x real time (bag duration / wall time), peak RSS (VmHWM of the child) - flat
  across lengths when memory does not grow with the bag;
* CPU: user + system seconds of the child (load-independent).

Goal (issue 15): ingest at least 5x real time on 2 cores, peak RSS flat. The machine is shared:
print the load average next to the numbers. Writes bench/out/ingest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
CAMERAS = ("cam_front", "cam_left", "cam_right")
W, H, FPS, JOINT_HZ = 640, 480, 30, 100
JOINTS = ("j0", "j1", "j2", "j3", "j4", "j5")


def write_config(work: Path) -> Path:
    import yaml

    cfg = {"collection": {
        "log_dir": str(work / "datasets"), "fps": FPS, "robot_type": "bench",
        "tasks": [{"dataset_name": "bench", "task": "bench"}],
        "streams": {"state": {"topic": "/joint_states", "type": "JointState", "names": list(JOINTS)},
                    "cameras": [{"name": c, "topic": f"/{c}/image_raw", "type": "Image", "width": W,
                                 "height": H} for c in CAMERAS]},
        "capture": {"min_frames": 10, "max_drop_ratio": 0.01}}}
    path = work / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_bag(path: Path, seconds: float) -> tuple[int, float]:
    """A rosbag2 MCAP bag written by rosbags; returns (bytes, seconds to write)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    t_begin = time.perf_counter()
    base = np.fromfunction(lambda y, x, c: (x * 0.4 + y * 0.3 + c * 40) % 256, (H, W, 3)).astype(np.uint8)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 24, (H, W, 3), dtype=np.uint8)  # sensor noise: not trivially compressible
    t0 = 1_700_000_000.0
    events = [(k / JOINT_HZ, "j", k) for k in range(int(seconds * JOINT_HZ))]
    events += [(0.002 + k / FPS + c * 0.001, c, k) for c in range(len(CAMERAS)) for k in range(int(seconds * FPS))]
    events.sort(key=lambda e: e[0])

    def stamp(t: float):  # noqa: ANN202
        ns = round(t * 1e9)
        return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                                        frame_id="")

    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        jc = w.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=ts)
        cc = [w.add_connection(f"/{c}/image_raw", "sensor_msgs/msg/Image", typestore=ts) for c in CAMERAS]
        for rel, what, k in events:
            t = t0 + rel
            log_ns = round((t + 0.003) * 1e9)
            if what == "j":
                msg = T["sensor_msgs/msg/JointState"](header=stamp(t), name=list(JOINTS),
                                                      position=np.sin(np.arange(6) + k * 0.01),
                                                      velocity=np.zeros(0), effort=np.zeros(0))
                w.write(jc, log_ns, ts.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
            else:
                img = np.roll(base, k * 4, axis=1)
                img[:, :, 0] ^= noise[:, :, 0]
                img[40:120, (k * 9) % (W - 80):(k * 9) % (W - 80) + 80] = 255
                msg = T["sensor_msgs/msg/Image"](header=stamp(t), height=H, width=W, encoding="rgb8",
                                                 is_bigendian=0, step=W * 3, data=img.reshape(-1))
                w.write(cc[what], log_ns, ts.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    size = sum(f.stat().st_size for f in path.glob("*.mcap"))
    return size, time.perf_counter() - t_begin


def decode_only(bag: Path, cfg_path: Path) -> dict:
    """Read every image of the bag into RGB the way ingest does, nothing else."""
    from eva_export.capture.ingest import BagReader, open_bag
    from eva_export.capture.intake import ImageDecoder, converter, streams_from_config
    from eva_export.config import load_config

    col = load_config(cfg_path).collection
    specs = {s.topic: s for s in streams_from_config(col)}
    conv = {t: converter(s) for t, s in specs.items()}
    dec = ImageDecoder()
    reader = BagReader(open_bag(bag), set(specs), lambda topic, ty: None)
    t = time.perf_counter()
    c = time.process_time()
    frames = 0
    for m in reader:
        _, payload = conv[m.topic](m.msg)
        if specs[m.topic].is_camera:
            img = dec.rgb(payload)
            frames += int(img.shape[0] > 0)
    wall = time.perf_counter() - t
    cpu = time.process_time() - c
    return {"frames": frames, "wall_s": wall, "frames_per_s": frames / wall, "cpu_s": cpu,
            "frames_per_cpu_s": frames / cpu if cpu else 0.0}


def ingest(bag: Path, cfg_path: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    cmd = [sys.executable, "-c",
           "import resource, sys\nfrom eva_export.cli import main\nrc = main(sys.argv[1:])\n"
           "print('VMHWM', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\nsys.exit(rc)",
           "ingest", str(bag), "--config", str(cfg_path), "--dataset", "bench"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed: {proc.stderr[-2000:]}")
    text = proc.stdout
    rss_kb = int(text.rsplit("VMHWM", 1)[1].split()[0])
    res = json.loads(text.rsplit("VMHWM", 1)[0])
    (ep,) = res["episodes"]
    return {"wall_s": wall, "rows": ep["frames"], "quality": ep["quality"], "codes": ep["codes"],
            "camera_frames_per_s": ep["frames"] * len(CAMERAS) / wall, "peak_rss_mb": rss_kb / 1024,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bags of 5 s and 15 s")
    ap.add_argument("--lengths", type=float, nargs="*", help="bag lengths in seconds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    lengths = args.lengths or ([5.0, 15.0] if args.quick else [20.0, 60.0])
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    rows = []
    try:
        cfg = write_config(work)
        for seconds in lengths:
            bag = work / f"bag_{int(seconds)}s"
            size, write_s = write_bag(bag, seconds)
            dec = decode_only(bag, cfg)
            ing = ingest(bag, cfg)
            shutil.rmtree(work / "datasets", ignore_errors=True)
            row = {"seconds": seconds, "bag_mb": size / 2**20, "write_s": write_s, "decode_only": dec,
                   "ingest": ing, "x_realtime": seconds / ing["wall_s"],
                   # what 2 free cores would give if the work spread over both (an upper bound)
                   "x_realtime_2_free_cores": seconds / (ing["cpu_s"] / 2) if ing["cpu_s"] else 0.0,
                   "load_avg": os.getloadavg()}
            rows.append(row)
            shutil.rmtree(bag, ignore_errors=True)
            print(json.dumps(row), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| bag | MB | decode-only fps (per CPU s) | ingest camera fps | x real time | x real time, 2 free cores "
          "(CPU bound) | peak RSS MB | CPU s | quality | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        i = r["ingest"]
        d = r["decode_only"]
        print(f"| {r['seconds']:.0f} s | {r['bag_mb']:.0f} | {d['frames_per_s']:.0f} ({d['frames_per_cpu_s']:.0f}) | "
              f"{i['camera_frames_per_s']:.0f} | {r['x_realtime']:.1f} | {r['x_realtime_2_free_cores']:.1f} | "
              f"{i['peak_rss_mb']:.0f} | {i['cpu_s']:.1f} | "
              f"{i['quality']} {i['codes']} | {r['load_avg'][0]:.1f} |")
    (OUT / "ingest.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
