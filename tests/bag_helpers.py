"""Message sequences for ingest tests, and rosbag2 MCAP bags written from them by `rosbags`
(an independent writer: none of our code serializes the bag)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from eva_export.config import parse_config

TS = get_typestore(Stores.ROS2_HUMBLE)
FPS = 30
W, H = 64, 48
JOINTS = ("a", "b", "c")
# topic -> (ROS type, stream kind)
TOPICS = {
    "/s": "sensor_msgs/msg/JointState",
    "/a": "std_msgs/msg/Float64MultiArray",
    "/p": "geometry_msgs/msg/PoseStamped",
    "/f": "sensor_msgs/msg/Image",
    "/w": "sensor_msgs/msg/CompressedImage",
}


def make_config(tmp_path: Path, *, marker: str = "", log_dir: str = "logs", **capture: Any) -> Any:
    return parse_config(config_dict(tmp_path, marker=marker, log_dir=log_dir, **capture)).collection


def write_config(tmp_path: Path, **kw: Any) -> Path:
    """The same config as a YAML file (for the CLI and the capture node)."""
    import yaml

    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump(config_dict(tmp_path, **kw)))
    return path


def config_dict(tmp_path: Path, *, marker: str = "", log_dir: str = "logs", **capture: Any) -> dict:
    cap = {"min_frames": 5, "frozen_frames": 30, "max_drop_ratio": 0.1, **capture}
    if marker:
        cap["ingest_marker_topic"] = marker
    raw = {"collection": {
        "log_dir": str(tmp_path / log_dir), "fps": FPS, "robot_type": "sim",
        "tasks": [{"dataset_name": "live", "task": "pick it"}, {"dataset_name": "bag", "task": "pick it"}],
        "streams": {"state": {"topic": "/s", "type": "JointState", "names": list(JOINTS)},
                    "action": {"topic": "/a", "type": "Float64MultiArray", "names": list(JOINTS)},
                    "ee_pose": {"topic": "/p"},
                    "cameras": [{"name": "front", "topic": "/f", "type": "Image", "width": W, "height": H},
                                {"name": "wrist", "topic": "/w", "type": "CompressedImage", "width": W,
                                 "height": H}]},
        "capture": cap}}
    return raw


def frame(m: int, cam: int) -> np.ndarray:
    """A frame whose content changes with m (a moving gradient and a block per bit of m)."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.zeros((H, W, 3), np.uint8)
    img[..., 0] = (x * 4 + m * 3) % 256
    img[..., 1] = (y * 5 + cam * 60) % 256
    img[..., 2] = (m * 7) % 256
    for bit in range(8):
        if (m >> bit) & 1:
            img[:8, bit * 8:(bit + 1) * 8] = 255
    return img


_JPEG_CACHE: dict[tuple[int, int], bytes] = {}


def jpeg(img: np.ndarray) -> bytes:
    import av

    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt = W, H, "yuvj420p"
    ctx.time_base = __import__("fractions").Fraction(1, FPS)
    pkts = ctx.encode(av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuvj420p"))
    pkts += ctx.encode(None)
    return b"".join(bytes(p) for p in pkts)


def _stamp(t: float) -> Any:
    ns = round(t * 1e9)
    return TS.types["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9)


def _header(t: float) -> Any:
    return TS.types["std_msgs/msg/Header"](stamp=_stamp(t), frame_id="")


def build(topic: str, n: int, t: float) -> Any:
    """Message n of a topic stamped at t (rosbags message objects: ROS field names)."""
    T = TS.types
    if topic == "/s":
        # joint order differs from the config's: the converter reorders by name
        vals = np.array([n + 0.5, n + 0.0, n + 0.25])
        return T["sensor_msgs/msg/JointState"](header=_header(t), name=["c", "a", "b"], position=vals,
                                               velocity=np.zeros(0), effort=np.zeros(0))
    if topic == "/a":
        dim = T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        return T["std_msgs/msg/Float64MultiArray"](layout=dim, data=np.array([-n, -n - 0.5, -n - 0.75], float))
    if topic == "/p":
        P, Q = T["geometry_msgs/msg/Point"], T["geometry_msgs/msg/Quaternion"]
        pose = T["geometry_msgs/msg/Pose"](position=P(x=n * 0.01, y=1.0, z=2.0), orientation=Q(x=0.0, y=0.0, z=0.0, w=1.0))
        return T["geometry_msgs/msg/PoseStamped"](header=_header(t), pose=pose)
    if topic == "/f":
        img = frame(n, 0)
        return T["sensor_msgs/msg/Image"](header=_header(t), height=H, width=W, encoding="rgb8", is_bigendian=0,
                                          step=W * 3, data=img.reshape(-1).copy())
    if topic == "/w":
        return T["sensor_msgs/msg/CompressedImage"](header=_header(t), format="jpeg",
                                                    data=np.frombuffer(jpeg(frame(n, 1)), np.uint8))
    raise ValueError(topic)


RATES = {"/s": 100.0, "/a": 100.0, "/p": 50.0, "/f": 30.0, "/w": 30.0}


def schedule(seconds: float) -> list[tuple[float, str, int]]:
    """(time from start, topic, n) for every message, in time order."""
    out = []
    for topic, hz in RATES.items():
        phase = {"/f": 0.003, "/w": 0.005}.get(topic, 0.0)
        for n in range(int(seconds * hz)):
            out.append((phase + n / hz, topic, n))
    out.sort()
    return out


@dataclass
class Recorded:
    log_ns: int
    topic: str
    msg: Any


class LiveFeed:
    """Publishes the schedule in real time into a live Recorder (through the same converters the
    capture node uses) and keeps every message with its receive time, as `ros2 bag record` would."""

    def __init__(self, rec: Any, seconds: float, markers: list[tuple[float, str, Any]] = ()) -> None:
        from eva_export.capture.intake import converter

        self.rec = rec
        self.sched = schedule(seconds)
        self.index = {s.topic: i for i, s in enumerate(rec.streams)}
        self.convert = {s.topic: converter(s) for s in rec.streams}
        self.recorded: list[Recorded] = []
        self.base = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.base = time.monotonic() + 0.2
        for rel, topic, n in self.sched:
            time.sleep(max(0.0, self.base + rel - time.monotonic()))
            msg = build(topic, n, self.base + rel)
            recv_ns = time.monotonic_ns()
            recv = recv_ns * 1e-9
            stamp, payload = self.convert[topic](msg)
            self.rec.offer(self.index[topic], recv, stamp, payload)
            self.recorded.append(Recorded(recv_ns, topic, msg))
        self.done.set()

    def start(self) -> LiveFeed:
        self.thread.start()
        return self


def write_bag(path: Path, recorded: list[Recorded], extra_topics: dict[str, str] | None = None) -> Path:
    """A rosbag2 MCAP bag (directory with metadata.yaml) written by rosbags."""
    topics = {**TOPICS, **(extra_topics or {})}
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conns = {t: w.add_connection(t, ty, typestore=TS) for t, ty in topics.items()}
        for r in recorded:
            w.write(conns[r.topic], r.log_ns, TS.serialize_cdr(r.msg, topics[r.topic]))
    return path


def offline(seconds: float, t0: float = 1_700_000_000.0, delay: float = 0.002, seed: int = 1) -> list[Recorded]:
    """The schedule as a recorder would have received it (a small random delivery delay)."""
    rng = np.random.default_rng(seed)
    out = []
    for rel, topic, n in schedule(seconds):
        t = t0 + rel
        out.append(Recorded(round((t + delay + rng.uniform(0, 0.002)) * 1e9), topic, build(topic, n, t)))
    out.sort(key=lambda r: r.log_ns)
    return out


def string_msg(text: str) -> Any:
    return TS.types["std_msgs/msg/String"](data=text)


def register_eva_types() -> None:
    """Teach rosbags our CaptureStatus (from the package's own .msg files), to record ~/status."""
    from rosbags.typesys import get_types_from_msg

    root = Path(__file__).resolve().parents[1] / "msg"
    types: dict = {}
    for name in ("StreamStatus", "CaptureStatus"):
        types.update(get_types_from_msg((root / f"{name}.msg").read_text(), f"eva_export_interfaces/msg/{name}"))
    if "eva_export_interfaces/msg/CaptureStatus" not in TS.types:
        TS.register(types)


def status_msg(state: str) -> Any:
    """A capture node status message (as the node publishes ~/status about 2 Hz)."""
    register_eva_types()
    return TS.types["eva_export_interfaces/msg/CaptureStatus"](
        state=state, dataset_name="", dataset_dir="", task="", frames=0, save_queue_depth=0,
        save_queue_capacity=4, streams=[], last_episode_index=-1, last_episode_quality="", last_message="",
        last_take_id="")
