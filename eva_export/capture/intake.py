"""What a message becomes before the aligner sees it: payloads, conversion, decoding, fingerprints.

Both producers build the same payloads with the same functions, so the rest of the capture path
cannot tell them apart:

* the capture node's subscription callbacks (rclpy messages, eva_export.nodes.ros_convert), and
* bag ingest (messages decoded from CDR by mcap-ros2-support, eva_export.capture.ingest).

The converters only read attributes (``msg.header.stamp.sec``, ``msg.data`` ...), which the
rclpy classes and mcap-ros2-support's decoded objects share, and take zero-copy views where the
buffer allows it. Decoding (JPEG/PNG, channel order) happens later in the worker.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from ..config import CollectionConfig
from ..errors import ConfigError
from ..formats.common.video import RgbConverter
from .features import ACTION, EE_POSE, STATE


# ---- payloads ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RawVector:
    """A vector message: values (float64 view) and, for JointState, the element names."""

    values: np.ndarray[Any, Any]
    names: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class RawImage:
    """An image message without copies: ``data`` is a uint8 view of the message buffer."""

    data: np.ndarray[Any, Any]
    height: int = 0
    width: int = 0
    encoding: str = ""
    step: int = 0
    compressed: bool = False
    # an H.264 frame decoded by video.VideoFeed: its access unit, kept for the stream copy
    packet: bytes | None = None
    key: bool = False
    frame_no: int = -1  # position in the stream's decode order


# ---- streams ----------------------------------------------------------------------------------
#: Configured type name -> ROS 2 type name (as a bag's schema or `ros2 topic info` spells it).
ROS_TYPE_NAMES = {
    "JointState": "sensor_msgs/msg/JointState",
    "Float64MultiArray": "std_msgs/msg/Float64MultiArray",
    "PoseStamped": "geometry_msgs/msg/PoseStamped",
    "Image": "sensor_msgs/msg/Image",
    "CompressedImage": "sensor_msgs/msg/CompressedImage",
    "CompressedVideo": "foxglove_msgs/msg/CompressedVideo",  # H.264 Annex B, a frame per message
}


@dataclass(frozen=True)
class StreamSpec:
    name: str  # state, action, ee_pose or the camera name
    topic: str
    kind: str  # "vector", "pose" or "camera"
    msg_type: str  # a key of ROS_TYPE_NAMES
    feature: str
    names: tuple[str, ...] = ()
    field: str = "position"
    width: int = 0
    height: int = 0

    @property
    def is_camera(self) -> bool:
        return self.kind == "camera"

    @property
    def ros_type(self) -> str:
        return ROS_TYPE_NAMES.get(self.msg_type, self.msg_type)

    @property
    def width_values(self) -> int:
        """Length of the vector this stream contributes to a row (cameras: 0)."""
        return 7 if self.kind == "pose" else (0 if self.is_camera else len(self.names))


def streams_from_config(col: CollectionConfig) -> list[StreamSpec]:
    out: list[StreamSpec] = []
    if col.state is not None:
        out.append(StreamSpec("state", col.state.topic, "vector", col.state.type, STATE, col.state.names,
                              col.state.field))
    if col.action is not None:
        out.append(StreamSpec("action", col.action.topic, "vector", col.action.type, ACTION,
                              col.action.names, col.action.field))
    if col.ee_pose is not None:
        out.append(StreamSpec("ee_pose", col.ee_pose.topic, "pose", "PoseStamped", EE_POSE))
    for cam in col.cameras:
        out.append(StreamSpec(cam.name, cam.topic, "camera", cam.type, cam.key, width=cam.width,
                              height=cam.height))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"stream names must be unique (a camera may not be named state/action/ee_pose): {names}")
    return out


# ---- message -> (stamp, payload) ----------------------------------------------------------------
Convert = Callable[[Any], tuple[float | None, Any]]


def stamp_seconds(msg: Any) -> float | None:
    header = getattr(msg, "header", None)
    if header is None:
        return None
    return float(header.stamp.sec + header.stamp.nanosec * 1e-9)


def _f64(arr: Any) -> np.ndarray[Any, Any]:
    try:
        return np.frombuffer(arr, dtype=np.float64)
    except (TypeError, ValueError):
        return np.asarray(arr, dtype=np.float64)


def _u8(arr: Any) -> np.ndarray[Any, Any]:
    try:
        return np.frombuffer(arr, dtype=np.uint8)
    except (TypeError, ValueError):
        return np.asarray(arr, dtype=np.uint8)


def converter(spec: StreamSpec) -> Convert:
    """msg -> (header stamp or None, payload) for one configured stream (any message object with
    the ROS field names: rclpy's or mcap-ros2-support's)."""
    if spec.msg_type == "JointState":
        field = spec.field

        def joint_state(msg: Any) -> tuple[float | None, Any]:
            return stamp_seconds(msg), RawVector(_f64(getattr(msg, field)), list(msg.name))

        return joint_state
    if spec.msg_type == "Float64MultiArray":
        return lambda msg: (None, RawVector(_f64(msg.data)))
    if spec.msg_type == "PoseStamped":
        def pose(msg: Any) -> tuple[float | None, Any]:
            p, q = msg.pose.position, msg.pose.orientation
            return stamp_seconds(msg), RawVector(np.array([p.x, p.y, p.z, q.x, q.y, q.z, q.w]))

        return pose
    if spec.msg_type == "Image":
        def image(msg: Any) -> tuple[float | None, Any]:
            return stamp_seconds(msg), RawImage(_u8(msg.data), msg.height, msg.width, msg.encoding, msg.step)

        return image
    if spec.msg_type == "CompressedImage":
        return lambda msg: (stamp_seconds(msg), RawImage(_u8(msg.data), compressed=True))
    if spec.msg_type == "CompressedVideo":
        # no header: the frame's own timestamp plays the header stamp; decoded by video.VideoFeed
        return lambda msg: (float(msg.timestamp.sec + msg.timestamp.nanosec * 1e-9),
                            RawImage(_u8(msg.data), encoding=str(msg.format), compressed=True))
    raise ValueError(f"stream {spec.name}: unsupported message type {spec.msg_type!r}")


# ---- decoding and fingerprints (worker side) ---------------------------------------------------
_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8uc1": 1, "8uc3": 3}


#: Largest compressed frame decoded at all (pixels), whatever the configuration says.
MAX_PIXELS = 8192 * 8192
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # JPEG start-of-frame markers (not DHT/JPG/DAC)


def compressed_size(data: np.ndarray[Any, Any]) -> tuple[int, int]:
    """(width, height) from a JPEG's start-of-frame or a PNG's IHDR header, without decoding."""
    head = bytes(data[:24])
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if not head.startswith(b"\xff\xd8"):
        raise ValueError("compressed image is neither JPEG nor PNG")
    buf = np.ascontiguousarray(data, np.uint8).reshape(-1).tobytes()  # a frame header is near the start
    i, n = 2, len(buf)
    while i + 9 <= n:  # each step moves forward by at least 2 bytes: bounded by the size
        if buf[i] != 0xFF:
            raise ValueError(f"JPEG marker expected at byte {i}")
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF:
            return (buf[i + 7] << 8) | buf[i + 8], (buf[i + 5] << 8) | buf[i + 6]
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    raise ValueError("JPEG has no frame header")


class ImageDecoder:
    """RGB frames from raw or compressed (JPEG/PNG, decoded with PyAV) messages."""

    def __init__(self) -> None:
        self._ctx: dict[str, Any] = {}
        self._rgb = RgbConverter()

    def rgb(self, raw: RawImage, expect: tuple[int, int] | None = None) -> np.ndarray[Any, Any]:
        """The frame as HxWx3 RGB. ``expect`` (width, height): a compressed frame whose header
        declares another size is refused before decoding (a 12000x12000 JPEG would take 432 MB)."""
        if raw.compressed:
            w, h = compressed_size(raw.data)
            if (expect is not None and (w, h) != expect) or w * h > MAX_PIXELS:
                want = f"{expect[0]}x{expect[1]} configured" if expect else f"at most {MAX_PIXELS} pixels"
                raise ValueError(f"compressed image is {w}x{h} ({want}); not decoded")
            return self._decode(raw.data)
        enc = raw.encoding.lower()
        n = _CHANNELS.get(enc)
        if n is None:
            raise ValueError(f"unsupported image encoding {raw.encoding!r}")
        h, w, step = raw.height, raw.width, raw.step or raw.width * n
        if raw.data.size < h * step or step < w * n:
            raise ValueError(f"image buffer of {raw.data.size} bytes too small for {w}x{h} {enc} step {step}")
        img = raw.data[: h * step].reshape(h, step)[:, : w * n].reshape(h, w, n)
        if enc in ("rgb8", "8uc3"):
            return img
        if enc == "bgr8":
            return img[..., ::-1]
        if enc == "rgba8":
            return img[..., :3]
        if enc == "bgra8":
            return img[..., 2::-1]
        return np.repeat(img, 3, axis=2)

    def _decode(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        head = bytes(data[:8])
        if head.startswith(b"\xff\xd8"):
            codec = "mjpeg"
        elif head.startswith(b"\x89PNG"):
            codec = "png"
        else:
            raise ValueError("compressed image is neither JPEG nor PNG")
        ctx = self._ctx.get(codec)
        if ctx is None:
            ctx = self._ctx[codec] = av.CodecContext.create(codec, "r")
        frames = ctx.decode(av.Packet(data.tobytes()))  # type: ignore[union-attr]  # a video/image codec
        if not frames:
            raise ValueError(f"{codec} decoder returned no frame")
        return self._rgb(frames[-1])


def fingerprint(raw: RawImage) -> int:
    """A cheap content hash: identical frames always match (a strided subsample of raw bytes)."""
    d = raw.data
    sub = d if raw.compressed or d.size <= 65536 else d[::31]
    return zlib.crc32(sub.tobytes()) ^ (d.size << 32)
