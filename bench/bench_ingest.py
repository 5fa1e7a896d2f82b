"""Bag ingest benchmark: 3 cameras 640x480 rgb8 at 30 Hz + JointState at 100 Hz, rosbag2 MCAP.

    .venv/bin/python bench/bench_ingest.py                 # bags of 20 s and 60 s (about 6.3 GB)
    .venv/bin/python bench/bench_ingest.py --quick         # bags of 5 s and 15 s
    .venv/bin/python bench/bench_ingest.py --compare /work/main   # also another checkout's ingest

The bags are written by `rosbags` (an independent writer, as `ros2 bag record` would) into a
temporary directory and removed afterwards. Per bag length, ``--rounds`` interleaved rounds of
whole child processes (order rotated each round), medians reported:

* decode only (the anchor): read the bag and turn every image message into its RGB array (the
  same bag reader, CDR decoding, intake conversion and image decoder ingest uses), no
  alignment, no encoding: the floor for ingest;
* ingest: ``eva-export ingest`` (one episode per bag): wall time, camera frames/s, x real time
  (bag duration / wall time), peak RSS (VmHWM of the child) - flat across lengths when memory
  does not grow with the bag;
* CPU: user + system seconds of the child (load-independent), and the x real time two free
  cores would give for that CPU (the bound when the work spreads over both);
* ``--compare ROOT``: the same ingest run from another checkout (before/after in one run);
* the CompressedVideo row (``--video-lengths``): the same cameras recorded as H.264
  (foxglove_msgs/msg/CompressedVideo, made by PyAV's libx264, a keyframe every second) and
  ingested with the stream copy, against two anchors from the same bag: decode-only (every
  H.264 frame decoded to RGB, which ingest does for the checks and statistics) and copy-only
  (the same packets remuxed into one MP4 per camera, no decoding: the floor of a copy).

Goal: ingest at least 5x real time on 2 cores, peak RSS flat. The machine may be
shared: the load average of every round is printed next to the numbers. Writes
bench/out/ingest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
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


VIDEO_TYPE = "foxglove_msgs/msg/CompressedVideo"
VIDEO_MSG = "builtin_interfaces/Time timestamp\nstring frame_id\nuint8[] data\nstring format\n"


def write_config(work: Path, video: bool = False) -> Path:
    import yaml

    cam_type, suffix = ("CompressedVideo", "video") if video else ("Image", "image_raw")
    cfg = {"collection": {
        "log_dir": str(work / "datasets"), "fps": FPS, "robot_type": "bench",
        "tasks": [{"dataset_name": "bench", "task": "bench"}],
        "streams": {"state": {"topic": "/joint_states", "type": "JointState", "names": list(JOINTS)},
                    "cameras": [{"name": c, "topic": f"/{c}/{suffix}", "type": cam_type, "width": W,
                                 "height": H} for c in CAMERAS]},
        "capture": {"min_frames": 10, "max_drop_ratio": 0.01}}}
    path = work / ("bench_video.yaml" if video else "bench.yaml")
    path.write_text(yaml.safe_dump(cfg))
    return path


def _h264_encoders() -> list:
    """One libx264 encoder per camera (Annex B out, no B-frames, a keyframe every second)."""
    from fractions import Fraction

    import av

    out = []
    for _ in CAMERAS:
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base, ctx.gop_size = W, H, "yuv420p", Fraction(1, FPS), FPS
        # zerolatency: a packet per frame at once, as a camera's live encoder sends them
        ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "23", "bframes": "0"}
        out.append(ctx)
    return out


def write_bag(path: Path, seconds: float, video: bool = False) -> tuple[int, float]:
    """A rosbag2 MCAP bag written by rosbags (cameras as rgb8 Image, or as H.264 CompressedVideo
    with ``video``); returns (bytes, seconds to write)."""
    import av
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    ts.register(get_types_from_msg(VIDEO_MSG, VIDEO_TYPE))
    T = ts.types
    encoders = _h264_encoders() if video else []
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
        cam_type = VIDEO_TYPE if video else "sensor_msgs/msg/Image"
        cc = [w.add_connection(f"/{c}/{'video' if video else 'image_raw'}", cam_type, typestore=ts) for c in CAMERAS]
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
                if video:
                    f = av.VideoFrame.from_ndarray(img, format="rgb24")
                    f.pts = k
                    (pkt,) = encoders[what].encode(f)  # no B-frames: one packet per frame, at once
                    ns = round(t * 1e9)
                    msg = T[VIDEO_TYPE](timestamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                                        frame_id=CAMERAS[what], data=np.frombuffer(bytes(pkt), np.uint8), format="h264")
                    w.write(cc[what], log_ns, ts.serialize_cdr(msg, VIDEO_TYPE))
                    continue
                msg = T["sensor_msgs/msg/Image"](header=stamp(t), height=H, width=W, encoding="rgb8",
                                                 is_bigendian=0, step=W * 3, data=img.reshape(-1))
                w.write(cc[what], log_ns, ts.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    size = sum(f.stat().st_size for f in path.glob("*.mcap"))
    return size, time.perf_counter() - t_begin


def decode_only(bag: Path, cfg_path: Path) -> dict:
    """Read every image of the bag into RGB the way ingest does, nothing else (run in a child)."""
    from eva_export.capture.ingest import BagReader, open_bag
    from eva_export.capture.intake import ImageDecoder, converter, streams_from_config
    from eva_export.config import load_config

    col = load_config(cfg_path).collection
    specs = {s.topic: s for s in streams_from_config(col)}
    conv = {t: converter(s) for t, s in specs.items()}
    from eva_export.capture.video_feed import VideoFeed

    dec = ImageDecoder()
    feeds = {t: VideoFeed() for t, s in specs.items() if s.msg_type == "CompressedVideo"}
    reader = BagReader(open_bag(bag), set(specs), lambda topic, ty: None)
    frames = 0
    for m in reader:
        _, payload = conv[m.topic](m.msg)
        if m.topic in feeds:
            payload = feeds[m.topic].take(payload)
        if specs[m.topic].is_camera:
            img = dec.rgb(payload)
            frames += int(img.shape[0] > 0)
    return {"frames": frames}


def copy_only(bag: Path, cfg_path: Path) -> dict:
    """Remux every H.264 packet of the bag into one MP4 per camera, no decoding (run in a child)."""
    from eva_export.capture.ingest import BagReader, open_bag
    from eva_export.capture.intake import converter, streams_from_config
    from eva_export.config import load_config
    from eva_export.formats.lerobot_v21.video_copy import PacketCopy

    col = load_config(cfg_path).collection
    specs = {s.topic: s for s in streams_from_config(col)}
    conv = {t: converter(s) for t, s in specs.items()}
    out = Path(tempfile.mkdtemp(prefix="copy_only_"))
    copies = {t: PacketCopy(out / f"{s.name}.mp4", col.fps) for t, s in specs.items() if s.is_camera}
    try:
        for m in BagReader(open_bag(bag), set(specs), lambda topic, ty: None):
            if m.topic in copies:
                copies[m.topic].add(conv[m.topic](m.msg)[1].data.tobytes())
        return {"frames": sum(c.close() for c in copies.values())}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _child(cmd: list[str], root: Path) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child process run from ``root``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[3:5]} failed in {root}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def run_decode(bag: Path, cfg_path: Path, mode: str = "--decode-only") -> dict:
    wall, cpu, out = _child([sys.executable, str(Path(__file__).resolve()), mode, str(bag), str(cfg_path)], ROOT)
    res = json.loads(out)
    return {"wall_s": wall, "cpu_s": cpu, "frames": res["frames"], "frames_per_s": res["frames"] / wall}


def run_ingest(bag: Path, cfg_path: Path, root: Path, work: Path) -> dict:
    shutil.rmtree(work / "datasets", ignore_errors=True)
    cmd = [sys.executable, "-c",
           "import resource, sys\nfrom eva_export.cli import main\nrc = main(sys.argv[1:])\n"
           "print('VMHWM', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\nsys.exit(rc)",
           "ingest", str(bag), "--config", str(cfg_path), "--dataset", "bench"]
    wall, cpu, text = _child(cmd, root)
    shutil.rmtree(work / "datasets", ignore_errors=True)
    rss_kb = int(text.rsplit("VMHWM", 1)[1].split()[0])
    res = json.loads(text.rsplit("VMHWM", 1)[0])
    (ep,) = res["episodes"]
    return {"wall_s": wall, "rows": ep["frames"], "quality": ep["quality"], "codes": ep["codes"],
            "camera_frames_per_s": ep["frames"] * len(CAMERAS) / wall, "peak_rss_mb": rss_kb / 1024, "cpu_s": cpu}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def measure(seconds: float, work: Path, cfg: Path, rounds: int, compare: Path | None, video: bool = False) -> dict:
    bag = work / f"bag_{int(seconds)}s{'_h264' if video else ''}"
    size, write_s = write_bag(bag, seconds, video)
    # the baseline may not know CompressedVideo: it is compared on the raw-image bags
    names = ["decode", "ingest"] + (["copy"] if video else []) + (["compare"] if compare and not video else [])
    runs: dict[str, list[dict]] = {n: [] for n in names}
    loads = []
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate: no kind always first
            if name in ("decode", "copy"):
                runs[name].append(run_decode(bag, cfg, f"--{name}-only"))
            else:
                runs[name].append(run_ingest(bag, cfg, ROOT if name == "ingest" else compare, work))  # type: ignore[arg-type]
            loads.append(os.getloadavg()[0])
    shutil.rmtree(bag, ignore_errors=True)
    row: dict = {"seconds": seconds, "video": video, "bag_mb": size / 2**20, "write_s": write_s, "rounds": rounds,
                 "load_min": min(loads), "load_max": max(loads), "runs": runs}
    for name in names:
        wall, cpu = _median(runs[name], "wall_s"), _median(runs[name], "cpu_s")
        row[name] = {"wall_s": wall, "cpu_s": cpu, "x_realtime": seconds / wall,
                     "x_realtime_2_free_cores": seconds / (cpu / 2) if cpu else 0.0}
    ing = runs["ingest"]
    row["ingest"].update(peak_rss_mb=max(r["peak_rss_mb"] for r in ing), rows=ing[0]["rows"],
                         quality=sorted({f"{r['quality']} {r['codes']}" for r in ing}),
                         camera_frames_per_s=_median(ing, "camera_frames_per_s"))
    row["decode"]["frames_per_s"] = _median(runs["decode"], "frames_per_s")
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return row


def report(rows: list[dict], compare: Path | None) -> None:
    print("\n| bag | MB | decode-only (anchor): x real time, camera fps | ingest x real time (median) | ingest / "
          "decode-only wall | x real time, 2 free cores (CPU bound) | CPU s | peak RSS MB | quality | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        i, d = r["ingest"], r["decode"]
        print(f"| {r['seconds']:.0f} s{' H.264' if r['video'] else ''} | {r['bag_mb']:.0f} | {d['x_realtime']:.1f} ({d['frames_per_s']:.0f}) | "
              f"{i['x_realtime']:.1f} | {i['wall_s'] / d['wall_s']:.1f}x | {i['x_realtime_2_free_cores']:.1f} | "
              f"{i['cpu_s']:.1f} | {i['peak_rss_mb']:.0f} | {', '.join(i['quality'])} | "
              f"{r['load_min']:.1f}-{r['load_max']:.1f} |")
    for r in (r for r in rows if r["video"]):
        i, d, c = r["ingest"], r["decode"], r["copy"]
        print(f"H.264 {r['seconds']:.0f} s bag (stream copy): ingest {i['x_realtime']:.1f}x real time, {i['cpu_s']:.1f} "
              f"CPU s; decode-only {d['x_realtime']:.1f}x ({i['wall_s'] / d['wall_s']:.2f}x its wall); copy-only "
              f"{c['x_realtime']:.1f}x ({i['wall_s'] / c['wall_s']:.2f}x its wall)")
    if compare:
        for r in (r for r in rows if "compare" in r):
            c, i = r["compare"], r["ingest"]
            print(f"compare {compare}: {r['seconds']:.0f} s bag {c['x_realtime']:.1f}x real time, {c['cpu_s']:.1f} "
                  f"CPU s; this checkout {i['x_realtime']:.1f}x, {i['cpu_s']:.1f} CPU s "
                  f"({i['cpu_s'] / c['cpu_s']:.2f}x the CPU)")
    rows = [r for r in rows if not r["video"]] or rows  # the goal is on raw images (the worst case)
    worst = min(r["ingest"]["x_realtime"] for r in rows)
    loads = f"load {min(r['load_min'] for r in rows):.1f}-{max(r['load_max'] for r in rows):.1f}"
    anchor = ", ".join(f"{r['decode']['x_realtime']:.1f}x" for r in rows)
    print(f"goal ingest >= 5x real time: {'met' if worst >= 5 else 'NOT met'} (slowest bag {worst:.1f}x, median of "
          f"{rows[0]['rounds']} rounds; decode-only anchor {anchor} in the same run; {loads}; "
          f"{os.cpu_count()} cores)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bags of 5 s and 15 s")
    ap.add_argument("--lengths", type=float, nargs="*", help="bag lengths in seconds")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per bag (medians)")
    ap.add_argument("--compare", type=Path, help="another checkout whose ingest runs in the same rounds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--video-lengths", type=float, nargs="*", default=[20.0],
                    help="H.264 CompressedVideo bag lengths in seconds (stream copy); none: skip")
    ap.add_argument("--decode-only", nargs=2, metavar=("BAG", "CONFIG"), help=argparse.SUPPRESS)
    ap.add_argument("--copy-only", nargs=2, metavar=("BAG", "CONFIG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.decode_only or args.copy_only:
        fn, (bag, cfg_path) = (decode_only, args.decode_only) if args.decode_only else (copy_only, args.copy_only)
        print(json.dumps(fn(Path(bag), Path(cfg_path))))
        return 0
    lengths = args.lengths or ([5.0, 15.0] if args.quick else [20.0, 60.0])
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    rows = []
    try:
        cfg = write_config(work)
        for seconds in lengths:
            rows.append(measure(seconds, work, cfg, max(1, args.rounds), args.compare))
        vcfg = write_config(work, video=True)
        for seconds in args.video_lengths if not args.quick else [5.0]:
            rows.append(measure(seconds, work, vcfg, max(1, args.rounds), args.compare, video=True))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(rows, args.compare)
    (OUT / "ingest.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
