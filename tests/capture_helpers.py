"""Helpers shared by the capture node and fault tests (config, sim + node start, read back)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import rosharness

DDS_PROFILE = rosharness.REPO_ROOT / "config" / "fastdds_shm.xml"
DDS_ENV = {"FASTDDS_DEFAULT_PROFILES_FILE": str(DDS_PROFILE)}
CAMS = ("front", "wrist")
JOINTS = ("j0", "j1", "j2", "j3")


def write_config(tmp_path: Path, *, cameras: tuple[str, ...] = CAMS, width: int = 320, height: int = 240,
                 camera_type: str = "Image", action_type: str = "Float64MultiArray", extra_capture: str = "",
                 ee_pose: bool = False,
                 tasks: tuple[tuple[str, str], ...] = (("pick", "pick the cube"), ("place", "place it"))) -> Path:
    log_dir = tmp_path / "datasets"
    log_dir.mkdir(exist_ok=True)
    cams = "".join(f"      - {{name: {c}, topic: /sim/{c}/image, type: {camera_type}, width: {width}, "
                   f"height: {height}}}\n" for c in cameras)
    task_lines = "".join(f"    - {{dataset_name: {d}, task: \"{t}\"}}\n" for d, t in tasks)
    text = (
        "collection:\n"
        f"  log_dir: \"{log_dir}\"\n"
        "  fps: 30\n"
        "  robot_type: sim_arm\n"
        "  tasks:\n" + task_lines +
        "  streams:\n"
        f"    state: {{topic: /sim/joint_states, type: JointState, names: [{', '.join(JOINTS)}]}}\n"
        f"    action: {{topic: /sim/action, type: {action_type}, names: [{', '.join(JOINTS)}]}}\n"
        + ("    ee_pose: {topic: /sim/ee_pose}\n" if ee_pose else "") +
        "    cameras:\n" + cams +
        "  capture:\n"
        "    min_frames: 10\n"
        "    frozen_frames: 10\n"
        "    max_drop_ratio: 0.05\n" + extra_capture
    )
    path = tmp_path / "capture.yaml"
    path.write_text(text)
    return path


def start_pair(node_factory: Any, ros_client: Any, config: Path, sim_params: dict[str, Any] | None = None,
               capture_params: dict[str, Any] | None = None, namespace: str | None = None) -> tuple[Any, Any]:
    """capture_node and teleop_sim as separate processes (shared-memory DDS profile)."""
    ns = namespace or rosharness.unique_namespace()
    cap = node_factory("capture_node", namespace=ns, env=DDS_ENV,
                       params={"config_file": str(config), **(capture_params or {})})
    sim = node_factory("teleop_sim", namespace=ns, env=DDS_ENV,
                       params={"config_file": str(config), **(sim_params or {})})
    ros_client.wait_for_services([cap.service("start")], procs=[cap, sim])
    return cap, sim


def relaunch(node_factory: Any, ros_client: Any, dead: Any, config: Path) -> Any:
    """A new capture node in the killed one's namespace, once its own endpoints are matched.

    The killed incarnation's service endpoints linger in the graph until their lease ends, so
    "the service is available" may mean only the dead one is, and a request sent then goes
    nowhere (seen in CI: START unanswered after a relaunch). Every endpoint in the graph before
    the new process starts is old; wait for one that is not, and drop cached clients."""
    from eva_export_interfaces.srv import ListEpisodes, StartCapture, StopCapture

    old = ros_client.service_endpoints(dead.service("start"))
    cap = node_factory("capture_node", namespace=dead.namespace, env=DDS_ENV, params={"config_file": str(config)})
    ros_client.wait_for_services([cap.service("start")], procs=[cap])
    ros_client.wait_for_new_server(cap.service("start"), old, timeout=60, procs=[cap])
    for srv, name in ((StartCapture, "start"), (StopCapture, "stop"), (ListEpisodes, "list_episodes")):
        ros_client.forget_client(srv, cap.service(name))
    return cap


def wait_receiving(ros_client: Any, cap: Any, timeout: float = 20.0) -> Any:
    """Wait until the capture node has received messages on every stream."""
    from eva_export_interfaces.msg import CaptureStatus

    end = time.monotonic() + timeout
    status = None
    while time.monotonic() < end:
        status = ros_client.wait_for_message(CaptureStatus, cap.topic("status"), timeout=10)
        if status.streams and all(s.received > 0 for s in status.streams):
            return status
        ros_client.spin_for(0.2)
    raise TimeoutError(f"streams not received: {status}\n{cap.log_tail()}")


def record(ros_client: Any, cap: Any, seconds: float = 2.0, dataset: str = "", task: str = "") -> Any:
    from eva_export_interfaces.srv import StartCapture, StopCapture

    req = StartCapture.Request()
    req.dataset_name, req.task = dataset, task
    r = ros_client.call(StartCapture, cap.service("start"), req, timeout=15)
    assert r.success, r.message
    ros_client.spin_for(seconds)
    stop = ros_client.call(StopCapture, cap.service("stop"), timeout=30)
    assert stop.success, stop.message
    return stop


def wait_episodes(ros_client: Any, cap: Any, n: int, dataset: str = "", timeout: float = 60.0) -> list[Any]:
    from eva_export_interfaces.srv import ListEpisodes

    end = time.monotonic() + timeout
    req = ListEpisodes.Request()
    req.dataset_name = dataset
    eps: list[Any] = []
    while time.monotonic() < end:
        r = ros_client.call(ListEpisodes, cap.service("list_episodes"), req, timeout=15)
        eps = list(r.episodes)
        if len(eps) >= n:
            return eps
        ros_client.spin_for(0.2)
    raise TimeoutError(f"{len(eps)} episodes listed, waited for {n}\n{cap.log_tail()}")


def episode_rows(root: Path) -> list[dict[str, Any]]:
    path = root / "meta" / "episodes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_table(root: Path, index: int) -> dict[str, np.ndarray]:
    info = json.loads((root / "meta" / "info.json").read_text())
    path = root / info["data_path"].format(episode_chunk=index // info["chunks_size"], episode_index=index)
    table = pq.read_table(path)
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        try:
            out[name] = np.asarray(col.to_pylist())
        except Exception:  # noqa: BLE001
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def video_path(root: Path, key: str, index: int) -> Path:
    info = json.loads((root / "meta" / "info.json").read_text())
    return root / info["video_path"].format(episode_chunk=index // info["chunks_size"], video_key=key,
                                            episode_index=index)


def decode_video(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


def check_dataset(root: Path) -> list[str]:
    """Problems of a raw dataset: every listed episode has its Parquet and MP4s, counts agree."""
    try:
        from eva_export.formats.lerobot_v21.validate import validate_dataset  # type: ignore[attr-defined]
    except ImportError:
        validate_dataset = None
    problems: list[str] = []
    if validate_dataset is not None:
        try:
            result = validate_dataset(root)
            if isinstance(result, list):
                problems += [str(p) for p in result]
        except Exception as exc:  # noqa: BLE001
            problems.append(f"validate_dataset: {exc}")
    info = json.loads((root / "meta" / "info.json").read_text())
    video_keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    rows = episode_rows(root)
    if [r["episode_index"] for r in rows] != list(range(len(rows))):
        problems.append(f"episode indices not contiguous: {[r['episode_index'] for r in rows]}")
    if info["total_episodes"] != len(rows):
        problems.append(f"info total_episodes {info['total_episodes']} != {len(rows)} rows")
    for r in rows:
        i = r["episode_index"]
        t = read_table(root, i)
        if len(t["timestamp"]) != r["length"]:
            problems.append(f"episode {i}: {len(t['timestamp'])} table rows, length {r['length']}")
        for k in video_keys:
            p = video_path(root, k, i)
            if not p.is_file():
                problems.append(f"episode {i}: {p} missing")
    return problems
