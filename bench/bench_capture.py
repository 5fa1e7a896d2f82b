"""Capture benchmark: 3 cameras 640x480 rgb8 at 30 Hz + JointState at 100 Hz, real processes.

    .venv/bin/python bench/bench_capture.py            # rows of 60 s: quiet, CPU load, 6 cameras
    .venv/bin/python bench/bench_capture.py --quick    # the same rows, 20 s each
    .venv/bin/python bench/bench_capture.py --lengths 10 60 120   # quiet 3-camera length sweep

Rows: "quiet" (3 cameras), "cpu load" (3 cameras while a busy process pinned to CPU 0 runs,
started and stopped by the benchmark), "6 cameras" (headroom). Per row a fresh teleop_sim and
capture_node.

teleop_sim publishes in one process, capture_node records in another (a fresh one per
length, so its peak RSS belongs to that length), both with the shipped shared-memory DDS
profile, DDS on loopback and a private ROS_DOMAIN_ID. Prints a Markdown table and writes
bench/out/capture.json:

* lost: grid slots no camera frame was stamped for, summed over the cameras (goal 0: the sim
  loses nothing); late: frames that arrived after their slot was final (delivery jitter);
* jitter p99: delivery delay per stream (receive minus stamp, least delay removed);
* callback p50/p99: duration of the capture node's subscription callbacks (camera streams);
* STOP-to-durable: from the STOP call until the episode row is listed (also as measured
  inside the node: STOP until the row is in episodes.jsonl);
* peak RSS: VmHWM of the capture process (goal: flat across lengths, < 400 MB);
* encode x realtime: episode duration / encoder busy time, slowest camera.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
CAMERAS = ("cam_front", "cam_left", "cam_right")
CAMERAS6 = CAMERAS + ("cam_back", "cam_wrist_l", "cam_wrist_r")
BUSY = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def configure_env() -> dict[str, str]:
    env = dict(os.environ)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.pop("ROS_LOCALHOST_ONLY", None)
    env["ROS_DOMAIN_ID"] = os.environ.get("EVA_BENCH_DOMAIN_ID") or str(150 + os.getpid() % 80)
    env["RMW_IMPLEMENTATION"] = "rmw_fastrtps_cpp"
    env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(ROOT / "config" / "fastdds_shm.xml")
    env["PYTHONUNBUFFERED"] = "1"
    os.environ.update(env)  # this process's own rclpy client too, before rclpy starts
    return env


def write_config(work: Path, cameras: tuple[str, ...] = CAMERAS) -> Path:
    cams = "".join(f"      - {{name: {c}, topic: /bench/{c}/image, type: Image, width: 640, height: 480}}\n"
                   for c in cameras)
    text = (
        "collection:\n"
        # a dataset per camera set: a 6-camera node may not append to the 3-camera dataset
        f"  log_dir: \"{work / f'datasets_{len(cameras)}cam'}\"\n"
        "  fps: 30\n"
        "  robot_type: bench_arm\n"
        "  tasks:\n    - {dataset_name: bench, task: \"benchmark teleop\"}\n"
        "  streams:\n"
        "    state: {topic: /bench/joint_states, type: JointState, names: [j0, j1, j2, j3, j4, j5]}\n"
        "    action: {topic: /bench/action, type: Float64MultiArray, names: [j0, j1, j2, j3, j4, j5]}\n"
        "    cameras:\n" + cams +
        "  capture:\n    video_preset: ultrafast\n"
    )
    path = work / f"bench_capture_{len(cameras)}.yaml"
    path.write_text(text)
    return path


def start(module: str, cfg: Path, env: dict[str, str], log: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", module, "--ros-args", "-r", "__ns:=/bench_ns", "-p", f"config_file:={cfg}", *extra]
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=str(ROOT), start_new_session=True)


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


class Client:
    def __init__(self) -> None:
        import rclpy
        from eva_export_interfaces.srv import ListEpisodes, StartCapture, StopCapture

        self.rclpy = rclpy
        rclpy.init(args=[])
        self.node = rclpy.create_node(f"bench_client_{os.getpid()}")
        self.types = {"start": StartCapture, "stop": StopCapture, "list_episodes": ListEpisodes}
        self.clients = {k: self.node.create_client(t, f"/bench_ns/eva_capture/{k}") for k, t in self.types.items()}

    def call(self, name: str, timeout: float = 30.0):
        cl = self.clients[name]
        if not cl.wait_for_service(timeout_sec=timeout):
            raise TimeoutError(f"service {name} not available")
        fut = cl.call_async(self.types[name].Request())
        self.rclpy.spin_until_future_complete(self.node, fut, timeout_sec=timeout)
        if not fut.done():
            raise TimeoutError(f"no reply from {name}")
        return fut.result()

    def wait_streams(self, timeout: float = 30.0) -> None:
        from eva_export_interfaces.msg import CaptureStatus

        got = []
        sub = self.node.create_subscription(CaptureStatus, "/bench_ns/eva_capture/status", got.append, 10)
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                self.rclpy.spin_once(self.node, timeout_sec=0.1)
                if got and got[-1].streams and all(s.received > 30 for s in got[-1].streams):
                    return
            raise TimeoutError(f"streams not received: {got[-1] if got else None}")
        finally:
            self.node.destroy_subscription(sub)

    def close(self) -> None:
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def run_length(seconds: float, cfg: Path, env: dict[str, str], work: Path, client: Client, index: int,
               cameras: tuple[str, ...] = CAMERAS) -> dict:
    stats_file = work / "capture_stats.jsonl"
    cap = start("eva_export.nodes.capture_node", cfg, env, work / f"capture_{index}.log",
                ["-p", f"stats_file:={stats_file}"])
    try:
        client.wait_streams()
        time.sleep(1.0)
        idle = proc_status(cap.pid)
        n_before = len(client.call("list_episodes").episodes)
        r = client.call("start")
        if not r.success:
            raise RuntimeError(r.message)
        rss = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            rss.append(proc_status(cap.pid).get("VmRSS", 0))
            time.sleep(0.5)
        t_stop = time.monotonic()
        s = client.call("stop")
        t_reply = time.monotonic()
        if not s.success and "still being finalized" not in s.message:
            raise RuntimeError(s.message)
        stop_message = s.message  # an overloaded host answers STOP before the episode is final
        while True:
            eps = client.call("list_episodes").episodes
            if (s.success and any(e.episode_index == s.episode_index for e in eps)) or \
                    (not s.success and len(eps) > n_before):
                break
            if time.monotonic() - t_stop > 600:
                raise TimeoutError("episode never became visible")
            time.sleep(0.01)
        t_durable = time.monotonic()
        peak = proc_status(cap.pid).get("VmHWM", 0)
    finally:
        rc = stop(cap)
    rec = [json.loads(x) for x in stats_file.read_text().splitlines() if x.strip()][-1]
    cams = {c: rec["stream_stats"][c] for c in cameras}
    lat_cam = [rec["callback_latency"][c] for c in cameras if c in rec["callback_latency"]]
    lat_state = rec["callback_latency"].get("state", {})
    return {
        "seconds": seconds, "frames": rec["frames"], "quality": rec["quality"], "codes": rec["codes"],
        "dropped_frames": sum(v["dropped"] for v in cams.values()),
        "dropped_per_camera": {c: v["dropped"] for c, v in cams.items()},
        "received_per_camera": {c: v["received"] for c, v in cams.items()},
        "late_frames": sum(v.get("late", 0) for v in cams.values()),
        "late_per_camera": {c: v.get("late", 0) for c, v in cams.items()},
        "jitter_p99_ms": {n: v.get("jitter_p99_ms") for n, v in rec["stream_stats"].items()},
        "stream_dropped": {n: v["dropped"] for n, v in rec["stream_stats"].items()},
        "state_dropped": rec["stream_stats"]["state"]["dropped"],
        "callback_p50_ms": max((x["p50_ms"] for x in lat_cam), default=None),
        "callback_p99_ms": max((x["p99_ms"] for x in lat_cam), default=None),
        "state_callback_p99_ms": lat_state.get("p99_ms"),
        "max_latency_s": max(v.get("max_latency_s", 0) for v in cams.values()),
        "stop_reply_s": t_reply - t_stop,
        "stop_message": stop_message,
        "stop_to_durable_s": t_durable - t_stop,
        "stop_to_durable_in_node_s": rec["stop_to_durable_s"],
        "idle_rss_mb": idle.get("VmRSS", 0) / 2**20,
        "max_rss_mb": max(rss, default=0) / 2**20,
        "peak_rss_mb": peak / 2**20,
        "encode_x_realtime": min(rec["encode_speed_x_realtime"].values()),
        "intake_overflow": rec["intake_overflow"],
        "capture_exit_code": rc,
    }


def run_row(name: str, seconds: float, cameras: tuple[str, ...], load: bool, env: dict[str, str], work: Path,
            client: Client, index: int) -> dict:
    """One row: a fresh sim and capture node; with ``load`` a busy process pinned to CPU 0."""
    cfg = write_config(work, cameras)
    sim = start("eva_export.nodes.teleop_sim", cfg, env, work / f"sim_{index}.log", [])
    busy = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True) if load else None
    try:
        r = run_length(seconds, cfg, env, work, client, index, cameras)
    finally:
        if busy is not None:
            os.killpg(busy.pid, signal.SIGKILL)
            busy.wait(10)
        stop(sim)
    r.update({"row": name, "cameras": len(cameras), "cpu_load": load,
              "load_avg_1min": os.getloadavg()[0],
              "received_all": all(n >= r["frames"] for n in r["received_per_camera"].values())})
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="rows of 20 s instead of 60 s")
    ap.add_argument("--lengths", type=float, nargs="*", help="quiet 3-camera episodes of these lengths instead")
    ap.add_argument("--rows", nargs="*", help="run only these rows (e.g. --rows '6 cameras')")
    args = ap.parse_args()
    secs = 20.0 if args.quick else 60.0
    if args.lengths:
        rows = [(f"quiet {x:g} s", x, CAMERAS, False) for x in args.lengths]
    else:
        rows = [("quiet", secs, CAMERAS, False), ("cpu load", secs, CAMERAS, True),
                ("6 cameras", secs, CAMERAS6, False)]
        if args.rows:
            rows = [r for r in rows if r[0] in args.rows]
    env = configure_env()
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_capture_") as tmp:
        work = Path(tmp)
        client = Client()
        try:
            for i, (name, x, cams, load) in enumerate(rows):
                print(f"recording {name}: {len(cams)} cameras, {x:g} s ...", flush=True)
                results.append(run_row(name, x, cams, load, env, work, client, i))
                print(json.dumps(results[-1]), flush=True)
        finally:
            client.close()
            for log in sorted(work.glob("*.log")):
                (OUT / f"capture_{log.name}").write_bytes(log.read_bytes())
    lines = [
        "| row | episode | frames | lost / late frames (cams) | jitter p99 ms (cams max / state / action) | "
        "callback p99 ms | STOP-to-durable s | peak RSS MB | encode x realtime | load avg | quality |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        jit = r["jitter_p99_ms"]
        cam_jit = max(jit[c] or 0 for c in r["received_per_camera"])
        lines.append(
            f"| {r['row']} | {r['seconds']:g} s | {r['frames']} | {r['dropped_frames']} / {r['late_frames']} | "
            f"{cam_jit:.1f} / {jit.get('state') or 0:.1f} / {jit.get('action') or 0:.1f} | "
            f"{r['callback_p99_ms']:.3f} | {r['stop_to_durable_s']:.3f} | {r['peak_rss_mb']:.0f} | "
            f"{r['encode_x_realtime']:.1f} | {r['load_avg_1min']:.1f} | {r['quality']} {','.join(r['codes'])} |")
    table = "\n".join(lines)
    print(table)
    doc = {"machine": {"cpus": os.cpu_count()}, "setup": "640x480 rgb8 cameras @30 Hz + JointState @100 Hz + "
           "Float64MultiArray action @100 Hz; libx264 ultrafast; shm DDS profile; cpu load = one busy "
           "process pinned to CPU 0", "results": results, "table": table}
    (OUT / "capture.json").write_text(json.dumps(doc, indent=2))
    print(f"wrote {OUT / 'capture.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
