"""The whole eva_export life cycle on this machine, with no robot: `make demo`.

1. starts a throwaway OpenSSH server on 127.0.0.1 as the upload remote,
2. starts the three nodes exactly as launch/eva.launch.py asks (read with the launch doubles),
   plus the simulated teleop publisher (joint state, action, two cameras at 30 Hz),
3. records episodes through the capture services: good ones, one with an injected fault
   (comes out red), one cancelled, one with zero frames,
4. reviews them: a pass that overrides a red, a fail of a green,
5. exports the raw dataset to every format of the registry through the export service and
   verifies each export with a real read,
6. uploads the accepted lerobot_v3 export through the upload service,
7. prints a summary and writes it to <out>/summary.json. Everything stays on disk in <out>.
8. compares what happened with the scenario (which takes are green or red, what each export
   accepted and rejected) and exits 1, listing every difference, when they disagree.

All DDS traffic stays on loopback (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST); the domain id is
the user's ROS_DOMAIN_ID when set, else a private one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import rosharness  # noqa: E402

from eva_export.formats.registry import format_names  # noqa: E402

FORMATS = tuple(format_names())
# the scenario: label -> expected quality; cancelled / zero-frame takes write nothing
EXPECT_QUALITY = {"good_1": "green", "good_2": "green", "fault_nan": "red", "good_3": "green"}
EXPECT_ACCEPTED = ("good_1", "fault_nan", "good_3")  # fault_nan passed by the operator
EXPECT_REJECTED = ("good_2",)  # failed by the operator
CAMERAS = ("front", "wrist")
JOINTS = [f"joint_{i}" for i in range(1, 7)] + ["gripper"]


class Demo:
    def __init__(self, out: Path, seconds: float, width: int, height: int) -> None:
        self.out = out
        self.seconds = seconds
        self.width, self.height = width, height
        self.timings: dict[str, float] = {}
        self.procs: list[rosharness.NodeProcess] = []
        self.sim: rosharness.NodeProcess | None = None
        self.client: Any = None

    # ---- set-up ------------------------------------------------------------------------------
    def write_config(self, sftp: Any) -> Path:
        import yaml

        cams = [{"name": c, "topic": f"/demo/{c}/image_raw", "type": "Image",
                 "width": self.width, "height": self.height} for c in CAMERAS]
        cfg = {
            "collection": {
                "log_dir": str(self.out / "datasets"),
                "fps": 30,
                "robot_type": "eva_sim",
                "tasks": [{"dataset_name": "demo_pick", "task": "pick up the cube"}],
                "streams": {
                    "state": {"topic": "/demo/joint_states", "type": "JointState", "names": JOINTS},
                    "action": {"topic": "/demo/action", "type": "JointState", "names": JOINTS},
                    "cameras": cams,
                },
                "capture": {"min_frames": 10},
                "storage": {"sftp": {
                    "host": sftp.host, "port": sftp.port, "user": sftp.user,
                    "identity_file": str(sftp.client_key), "known_hosts": str(sftp.known_hosts),
                    "remote_dir": str(self.out / "remote")}},
            },
        }
        (self.out / "remote").mkdir(parents=True, exist_ok=True)
        path = self.out / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start_nodes(self, config: Path) -> None:
        from launch_doubles import launch_plan

        plan, env = launch_plan({"config": str(config)})
        os.environ.update(env)  # e.g. the shipped Fast DDS profile, as the launch file sets it
        for node in plan:
            proc = rosharness.NodeProcess(node.executable, self.out / "logs", name=node.name,
                                          namespace="/", params=node.params, prefer_script=True)
            self.procs.append(proc.start())

    def start_sim(self, **faults: Any) -> None:
        """(Re)start the simulated teleop publisher and wait until capture receives every stream."""
        self.stop_sim()
        before = self.received()
        params: dict[str, Any] = {"config_file": str(self.out / "config.yaml")}  # same topics as capture
        params.update(faults)
        self.sim = rosharness.NodeProcess("teleop_sim", self.out / "logs", name="teleop_sim", namespace="/",
                                          params=params, prefer_script=True).start()
        deadline = time.monotonic() + 30
        while True:  # discovery of a new publisher takes 0.3 to 2 s
            now = self.received()
            if now and all(now[k] > before.get(k, 0) for k in now):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"capture did not receive every stream from the simulator: {now}")
            time.sleep(0.2)

    def received(self) -> dict[str, int]:
        """Messages received per stream, from the capture node's status topic."""
        from eva_export_interfaces.msg import CaptureStatus

        status = self.client.wait_for_message(CaptureStatus, "/eva_capture/status", timeout=10)
        return {s.name: int(s.received) for s in status.streams}

    def stop_sim(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None

    def stop(self) -> None:
        self.stop_sim()
        for p in self.procs:
            p.stop()


def _timed(timings: dict[str, float], key: str, t0: float) -> None:
    timings[key] = round(time.monotonic() - t0, 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import eva_export_interfaces.srv as srv
    from sshd import SshServer

    from eva_export.formats.verify import verify_export

    rosharness.configure_ros_env(os.environ, keep_user_domain=True)
    os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(ROOT / "config" / "fastdds_shm.xml"))
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    demo = Demo(out, args.seconds, args.width, args.height)
    t_all = time.monotonic()
    sshd = SshServer.start(out / "sshd")
    rosharness.rclpy_init_once()
    client = rosharness.RosClient("eva_demo")
    demo.client = client
    summary: dict[str, Any] = {"out": str(out), "ros_domain_id": os.environ["ROS_DOMAIN_ID"]}
    try:
        config = demo.write_config(sshd)
        t0 = time.monotonic()
        demo.start_nodes(config)
        cap, exp, up = "/eva_capture", "/eva_export", "/eva_upload"
        client.wait_for_services([f"{cap}/start", f"{exp}/start", f"{up}/start"], timeout=60, procs=demo.procs)
        _timed(demo.timings, "nodes_ready_s", t0)

        def call(srv_type: Any, name: str, req: Any = None, timeout: float = 30.0) -> Any:
            return client.call(srv_type, name, req if req is not None else srv_type.Request(), timeout=timeout)

        def record(label: str, seconds: float, cancel: bool = False) -> dict[str, Any]:
            r = call(srv.StartCapture, f"{cap}/start")
            if not r.success:
                raise RuntimeError(f"{label}: start refused: {r.message}")
            time.sleep(seconds)
            if cancel:
                c = call(srv.CancelCapture, f"{cap}/cancel")
                print(f"  {label}: cancelled ({c.frames_discarded} frames discarded)")
                return {"label": label, "cancelled": True, "frames": int(c.frames_discarded)}
            s = call(srv.StopCapture, f"{cap}/stop")
            print(f"  {label}: stop -> {s.message}")
            return {"label": label, "episode_index": int(s.episode_index), "frames": int(s.frames),
                    "success": bool(s.success), "message": s.message}

        print("recording ...")
        t0 = time.monotonic()
        takes = []
        demo.start_sim()
        takes.append(record("good_1", args.seconds))
        takes.append(record("good_2", args.seconds))
        takes.append(record("cancelled", args.seconds / 2, cancel=True))
        # NaN bursts in the state stream (0.2 s of every 1 s): comes out red; its finite runs train
        demo.start_sim(nan_after_s=0.0, nan_every_s=1.0, nan_for_s=0.2)
        takes.append(record("fault_nan", args.seconds))
        demo.stop_sim()  # nobody publishes: the next take has zero frames and writes nothing
        takes.append(record("zero_frames", 0.5))
        demo.start_sim()
        takes.append(record("good_3", args.seconds))
        demo.stop_sim()
        # wait until every queued episode is saved
        deadline = time.monotonic() + 120
        want = sum(1 for t in takes if t.get("episode_index", -1) >= 0)
        while True:
            eps = call(srv.ListEpisodes, f"{cap}/list_episodes").episodes
            if len(eps) >= want or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        _timed(demo.timings, "recording_s", t0)

        print("reviewing ...")
        by_label = {t["label"]: t for t in takes}
        red_idx = by_label["fault_nan"]["episode_index"]
        green_idx = by_label["good_2"]["episode_index"]
        for idx, verdict, note in ((red_idx, "pass", "NaN burst is a sensor glitch; motion is fine"),
                                   (green_idx, "fail", "operator dropped the cube")):
            rv = call(srv.ReviewEpisode, f"{cap}/review",
                      srv.ReviewEpisode.Request(episode_index=idx, verdict=verdict, note=note, set_note=True))
            if not rv.success:
                raise RuntimeError(f"review of {idx} failed: {rv.message}")
        listing = call(srv.ListEpisodes, f"{cap}/list_episodes")
        source = listing.dataset_dir
        summary["source_dir"] = source
        summary["takes"] = takes
        summary["episodes"] = [{"episode_index": e.episode_index, "length": e.length, "quality": e.quality,
                                "quality_codes": list(e.quality_codes), "qc_verdict": e.qc_verdict,
                                "note": e.note} for e in listing.episodes]

        print("exporting ...")
        summary["exports"] = {}
        for fmt in FORMATS:
            t0 = time.monotonic()
            r = call(srv.StartExport, f"{exp}/start", srv.StartExport.Request(source_dir=source, format=fmt))
            if not r.success:
                raise RuntimeError(f"export {fmt} refused: {r.message}")
            job = wait_job(call, srv.GetJob, f"{exp}/get_job", r.job_id)
            if job.state != "completed":
                raise RuntimeError(f"export {fmt} failed: {job.error}")
            verified = {}
            for subset, d in (("accepted", job.accepted_dir), ("rejected", job.rejected_dir)):
                rep = verify_export(Path(d))
                verified[subset] = {"ok": rep.ok, "episodes": rep.episodes, "frames": rep.frames,
                                    "errors": rep.errors}
                if not rep.ok:
                    raise RuntimeError(f"verify {fmt}/{subset} failed: {rep.errors}")
            summary["exports"][fmt] = {
                "job_id": job.job_id, "accepted_dir": job.accepted_dir, "rejected_dir": job.rejected_dir,
                "accepted_episodes": job.accepted_episodes, "accepted_frames": job.accepted_frames,
                "rejected_episodes": job.rejected_episodes, "rejected_frames": job.rejected_frames,
                "verified": verified, "seconds": round(time.monotonic() - t0, 2)}
            print(f"  {fmt}: accepted {job.accepted_episodes} ep / {job.accepted_frames} frames, "
                  f"rejected {job.rejected_episodes} ep / {job.rejected_frames} frames (verified)")

        print("uploading the accepted lerobot_v3 export ...")
        t0 = time.monotonic()
        v3 = summary["exports"]["lerobot_v3"]
        r = call(srv.StartUpload, f"{up}/start",
                 srv.StartUpload.Request(source_dir=source, format="lerobot_v3", accepted_dir=v3["accepted_dir"]))
        if not r.success:
            raise RuntimeError(f"upload refused: {r.message}")
        job = wait_job(call, srv.GetJob, f"{up}/get_job", r.job_id)
        if job.state != "completed":
            raise RuntimeError(f"upload failed: {job.error}")
        summary["upload"] = {"job_id": job.job_id, "remote_path": job.remote_path, "files": job.files_total,
                             "bytes": job.bytes_total, "seconds": round(time.monotonic() - t0, 2)}
        _timed(demo.timings, "total_s", t_all)
        summary["timings"] = demo.timings
        return summary
    finally:
        client.close()
        demo.stop()
        sshd.stop()
        rosharness.rclpy_shutdown()


def wait_job(call: Any, get_job: Any, name: str, job_id: str, timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = call(get_job, name, get_job.Request(job_id=job_id))
        if r.success and r.job.state in ("completed", "failed"):
            return r.job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {r.job.state} after {timeout} s")
        time.sleep(0.2)


def scenario_errors(s: dict[str, Any]) -> list[str]:
    """Every way the run differs from the scenario (empty when it went as planned)."""
    errors: list[str] = []
    takes = {t["label"]: t for t in s["takes"]}
    episodes = {e["episode_index"]: e for e in s["episodes"]}
    for label in ("cancelled", "zero_frames"):
        if takes[label].get("episode_index", -1) >= 0:
            errors.append(f"{label}: wrote episode {takes[label]['episode_index']}, expected nothing")
    for label, quality in EXPECT_QUALITY.items():
        ep = episodes.get(takes[label].get("episode_index", -1))
        if ep is None:
            errors.append(f"{label}: no episode was saved ({takes[label].get('message', '')})")
        elif ep["length"] != takes[label].get("frames"):  # reviews go by STOP's index: it must be this take
            errors.append(f"{label}: episode {ep['episode_index']} has {ep['length']} frames, but STOP "
                          f"returned that index for a take of {takes[label].get('frames')}")
        elif ep["quality"] != quality:
            errors.append(f"{label}: episode {ep['episode_index']} is {ep['quality']}, expected {quality} "
                          f"(issues: {', '.join(ep['quality_codes']) or 'none'})")
    if "fault_nan" in takes and "non_finite" not in episodes.get(
            takes["fault_nan"].get("episode_index", -1), {}).get("quality_codes", []):
        errors.append("fault_nan: no non_finite issue")
    index = {label: t.get("episode_index", -1) for label, t in takes.items()}
    want = {"accepted": [index[lab] for lab in EXPECT_ACCEPTED], "rejected": [index[lab] for lab in EXPECT_REJECTED]}
    for fmt in FORMATS:
        e = s["exports"].get(fmt)
        if e is None:
            errors.append(f"{fmt}: not exported")
            continue
        for subset, indices in want.items():
            got, ok = e[f"{subset}_episodes"], e["verified"][subset]["ok"]
            # a passed episode with NaN bursts is exported as its finite runs: one or more episodes
            raw = sorted(set(json.loads(Path(e[f"{subset}_dir"], "meta/quality_split.json").read_text())
                             ["source_episode_indices"]))
            if raw != sorted(indices) or got < len(indices) or not ok:
                errors.append(f"{fmt}: {subset} has {got} episodes from raw episodes {raw} (verified: {ok}), "
                              f"expected raw episodes {indices}")
    if not s.get("upload", {}).get("remote_path"):
        errors.append("upload: nothing was published")
    return errors


def print_summary(s: dict[str, Any]) -> None:
    print("\n==================== eva_export demo summary ====================")
    print(f"raw dataset : {s['source_dir']}")
    print("episodes    :")
    for e in s["episodes"]:
        codes = ",".join(dict.fromkeys(e["quality_codes"])) or "-"
        print(f"  #{e['episode_index']}: {e['length']:4d} frames  quality={e['quality']:<5} "
              f"issues={codes:<28} verdict={e['qc_verdict'] or '-':<4} note={e['note']!r}")
    skipped = [t for t in s["takes"] if t.get("cancelled") or t.get("episode_index", 0) < 0]
    for t in skipped:
        print(f"  ({t['label']}: {'cancelled' if t.get('cancelled') else 'zero frames'}, nothing written)")
    print("exports     :")
    for fmt, e in s["exports"].items():
        print(f"  {fmt:<12} accepted {e['accepted_episodes']} ep/{e['accepted_frames']} fr  "
              f"rejected {e['rejected_episodes']} ep/{e['rejected_frames']} fr  {e['seconds']} s  verified")
        print(f"               {e['accepted_dir']}")
    if "mcap_foxglove" in s["exports"]:  # docs/mcap-viewers.md
        print(f"  look at one : rerun {s['exports']['mcap_foxglove']['accepted_dir']}/data/chunk-000/episode_000000.mcap"
              " (or open it in Foxglove / Lichtblick)")
    u = s["upload"]
    print(f"upload      : {u['files']} files, {u['bytes']} bytes -> {u['remote_path']} ({u['seconds']} s)")
    print(f"timings     : {s['timings']}")
    print(f"everything is in {s['out']} (summary.json, datasets/, remote/, logs/)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "demo_output" / time.strftime("%Y%m%d-%H%M%S")))
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each recorded episode")
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    args = ap.parse_args(argv)
    summary = run(args)
    summary["scenario_errors"] = scenario_errors(summary)
    Path(summary["out"], "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    if summary["scenario_errors"]:
        print("\nthe demo did NOT go as its scenario says:", file=sys.stderr)
        for err in summary["scenario_errors"]:
            print(f"  - {err}", file=sys.stderr)
        return 1
    print("scenario met: every take and every export as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
