"""Capture benchmark: 3 cameras 640x480 rgb8 at 30 Hz + JointState at 100 Hz, real processes.

    .venv/bin/python bench/bench_capture.py            # episodes of 10, 60 and 120 s
    .venv/bin/python bench/bench_capture.py --quick    # 5, 10 and 20 s

teleop_sim publishes in one process, capture_node records in another (a fresh one per
length, so its peak RSS belongs to that length), both with the shipped shared-memory DDS
profile, DDS on loopback and a private ROS_DOMAIN_ID. Prints a Markdown table and writes
bench/out/capture.json:

* dropped: grid slots without a fresh frame, summed over the cameras (goal 0);
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


def configure_env() -> dict[str, str]:
    env = dict(os.environ)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.pop("ROS_LOCALHOST_ONLY", None)
    env["ROS_DOMAIN_ID"] = str(150 + os.getpid() % 80)
    env["RMW_IMPLEMENTATION"] = "rmw_fastrtps_cpp"
    env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(ROOT / "config" / "fastdds_shm.xml")
    env["PYTHONUNBUFFERED"] = "1"
    os.environ.update(env)  # this process's own rclpy client too, before rclpy starts
    return env


def write_config(work: Path) -> Path:
    cams = "".join(f"      - {{name: {c}, topic: /bench/{c}/image, type: Image, width: 640, height: 480}}\n"
                   for c in CAMERAS)
    text = (
        "collection:\n"
        f"  log_dir: \"{work / 'datasets'}\"\n"
        "  fps: 30\n"
        "  robot_type: bench_arm\n"
        "  tasks:\n    - {dataset_name: bench, task: \"benchmark teleop\"}\n"
        "  streams:\n"
        "    state: {topic: /bench/joint_states, type: JointState, names: [j0, j1, j2, j3, j4, j5]}\n"
        "    action: {topic: /bench/action, type: Float64MultiArray, names: [j0, j1, j2, j3, j4, j5]}\n"
        "    cameras:\n" + cams +
        "  capture:\n    video_preset: ultrafast\n"
    )
    path = work / "bench_capture.yaml"
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


def run_length(seconds: float, cfg: Path, env: dict[str, str], work: Path, client: Client, index: int) -> dict:
    stats_file = work / "capture_stats.jsonl"
    cap = start("eva_export.nodes.capture_node", cfg, env, work / f"capture_{index}.log",
                ["-p", f"stats_file:={stats_file}"])
    try:
        client.wait_streams()
        time.sleep(1.0)
        idle = proc_status(cap.pid)
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
        if not s.success:
            raise RuntimeError(s.message)
        while True:
            eps = client.call("list_episodes").episodes
            if any(e.episode_index == s.episode_index for e in eps):
                break
            if time.monotonic() - t_stop > 120:
                raise TimeoutError("episode never became visible")
            time.sleep(0.01)
        t_durable = time.monotonic()
        peak = proc_status(cap.pid).get("VmHWM", 0)
    finally:
        rc = stop(cap)
    rec = [json.loads(x) for x in stats_file.read_text().splitlines() if x.strip()][-1]
    cams = {c: rec["stream_stats"][c] for c in CAMERAS}
    lat_cam = [rec["callback_latency"][c] for c in CAMERAS if c in rec["callback_latency"]]
    lat_state = rec["callback_latency"].get("state", {})
    return {
        "seconds": seconds, "frames": rec["frames"], "quality": rec["quality"], "codes": rec["codes"],
        "dropped_frames": sum(v["dropped"] for v in cams.values()),
        "dropped_per_camera": {c: v["dropped"] for c, v in cams.items()},
        "received_per_camera": {c: v["received"] for c, v in cams.items()},
        "state_dropped": rec["stream_stats"]["state"]["dropped"],
        "callback_p50_ms": max((x["p50_ms"] for x in lat_cam), default=None),
        "callback_p99_ms": max((x["p99_ms"] for x in lat_cam), default=None),
        "state_callback_p99_ms": lat_state.get("p99_ms"),
        "max_latency_s": max(v.get("max_latency_s", 0) for v in cams.values()),
        "stop_reply_s": t_reply - t_stop,
        "stop_to_durable_s": t_durable - t_stop,
        "stop_to_durable_in_node_s": rec["stop_to_durable_s"],
        "idle_rss_mb": idle.get("VmRSS", 0) / 2**20,
        "max_rss_mb": max(rss, default=0) / 2**20,
        "peak_rss_mb": peak / 2**20,
        "encode_x_realtime": min(rec["encode_speed_x_realtime"].values()),
        "intake_overflow": rec["intake_overflow"],
        "capture_exit_code": rc,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5, 10 and 20 s instead of 10, 60 and 120 s")
    ap.add_argument("--lengths", type=float, nargs="*", help="episode lengths in seconds")
    args = ap.parse_args()
    lengths = args.lengths or ([5, 10, 20] if args.quick else [10, 60, 120])
    env = configure_env()
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_capture_") as tmp:
        work = Path(tmp)
        cfg = write_config(work)
        sim = start("eva_export.nodes.teleop_sim", cfg, env, work / "sim.log", [])
        client = Client()
        try:
            for i, secs in enumerate(lengths):
                print(f"recording {secs:g} s ...", flush=True)
                results.append(run_length(secs, cfg, env, work, client, i))
                print(json.dumps(results[-1]), flush=True)
        finally:
            client.close()
            stop(sim)
            for log in sorted(work.glob("*.log")):
                (OUT / f"capture_{log.name}").write_bytes(log.read_bytes())
    lines = [
        "| episode | frames | dropped (3 cams) | callback p50 / p99 ms | STOP-to-durable s | peak RSS MB | "
        "encode x realtime | quality |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['seconds']:g} s | {r['frames']} | {r['dropped_frames']} | {r['callback_p50_ms']:.3f} / "
            f"{r['callback_p99_ms']:.3f} | {r['stop_to_durable_s']:.3f} | {r['peak_rss_mb']:.0f} | "
            f"{r['encode_x_realtime']:.1f} | {r['quality']} {','.join(r['codes'])} |")
    table = "\n".join(lines)
    print(table)
    doc = {"machine": {"cpus": os.cpu_count()}, "setup": "3x 640x480 rgb8 @30 Hz + JointState @100 Hz + "
           "Float64MultiArray action @100 Hz; libx264 ultrafast; shm DDS profile", "results": results,
           "table": table}
    (OUT / "capture.json").write_text(json.dumps(doc, indent=2))
    print(f"wrote {OUT / 'capture.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
