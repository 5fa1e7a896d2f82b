"""ROS messages <-> numpy: the only module that knows message layouts.

Intake converters (``intake_converter``) run inside subscription callbacks, so they only read
the header stamp and take zero-copy ``np.frombuffer`` views; decoding, reordering and checks
happen later in the capture worker (eva_export.capture.recorder). Builders (``image_msg`` ...)
are used by the simulated teleop publisher.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from geometry_msgs.msg import PoseStamped
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray

from eva_export.capture.recorder import RawImage, RawVector, StreamSpec

MSG_TYPES: dict[str, Any] = {
    "JointState": JointState,
    "Float64MultiArray": Float64MultiArray,
    "PoseStamped": PoseStamped,
    "Image": Image,
    "CompressedImage": CompressedImage,
}

Intake = Callable[[Any], tuple[float | None, Any]]

DDS_PROFILE_ENV = "FASTDDS_DEFAULT_PROFILES_FILE"
DDS_PROFILE_NAME = "fastdds_shm.xml"


# ---- intake -----------------------------------------------------------------------------------
def stamp_seconds(msg: Any) -> float | None:
    header = getattr(msg, "header", None)
    if header is None:
        return None
    return header.stamp.sec + header.stamp.nanosec * 1e-9


def _f64(arr: Any) -> np.ndarray:
    try:
        return np.frombuffer(arr, dtype=np.float64)
    except (TypeError, ValueError):
        return np.asarray(arr, dtype=np.float64)


def _u8(arr: Any) -> np.ndarray:
    try:
        return np.frombuffer(arr, dtype=np.uint8)
    except (TypeError, ValueError):
        return np.asarray(arr, dtype=np.uint8)


def intake_converter(spec: StreamSpec) -> tuple[Any, Intake]:
    """(message class, msg -> (header stamp or None, payload)) for one configured stream."""
    if spec.msg_type == "JointState":
        field = spec.field

        def joint_state(msg: Any) -> tuple[float | None, Any]:
            return stamp_seconds(msg), RawVector(_f64(getattr(msg, field)), msg.name)

        return JointState, joint_state
    if spec.msg_type == "Float64MultiArray":
        return Float64MultiArray, lambda msg: (None, RawVector(_f64(msg.data)))
    if spec.msg_type == "PoseStamped":
        def pose(msg: Any) -> tuple[float | None, Any]:
            p, q = msg.pose.position, msg.pose.orientation
            return stamp_seconds(msg), RawVector(np.array([p.x, p.y, p.z, q.x, q.y, q.z, q.w]))

        return PoseStamped, pose
    if spec.msg_type == "Image":
        def image(msg: Any) -> tuple[float | None, Any]:
            return stamp_seconds(msg), RawImage(_u8(msg.data), msg.height, msg.width, msg.encoding, msg.step)

        return Image, image
    if spec.msg_type == "CompressedImage":
        return CompressedImage, lambda msg: (stamp_seconds(msg), RawImage(_u8(msg.data), compressed=True))
    raise ValueError(f"stream {spec.name}: unsupported message type {spec.msg_type!r}")


# ---- builders (teleop_sim, tests) ---------------------------------------------------------------
def set_stamp(msg: Any, seconds_nanos: tuple[int, int]) -> None:
    msg.header.stamp.sec, msg.header.stamp.nanosec = seconds_nanos


def joint_state_msg(names: Sequence[str], values: np.ndarray, field: str = "position") -> JointState:
    msg = JointState()
    msg.name = list(names)
    setattr(msg, field, np.asarray(values, dtype=np.float64).tolist())
    return msg


def float_array_msg(values: np.ndarray) -> Float64MultiArray:
    msg = Float64MultiArray()
    msg.data = np.asarray(values, dtype=np.float64).tolist()
    return msg


def pose_msg(values: Sequence[float]) -> PoseStamped:
    msg = PoseStamped()
    p, q = msg.pose.position, msg.pose.orientation
    p.x, p.y, p.z, q.x, q.y, q.z, q.w = (float(v) for v in values)
    return msg


def image_msg(rgb: np.ndarray, frame_id: str = "") -> Image:
    """An rgb8 Image from an (H, W, 3) uint8 array (one copy into the message)."""
    msg = Image()
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
    msg.encoding = "rgb8"
    msg.is_bigendian = 0
    msg.step = msg.width * 3
    msg.data = np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()
    return msg


def compressed_msg(data: bytes, fmt: str = "jpeg") -> CompressedImage:
    msg = CompressedImage()
    msg.format = fmt
    msg.data = data
    return msg


# ---- the shipped DDS profile ---------------------------------------------------------------------
def shipped_dds_profile() -> Path | None:
    """config/fastdds_shm.xml from the installed share directory or the source tree."""
    candidates = []
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("eva_export")) / "config" / DDS_PROFILE_NAME)
    except Exception:  # noqa: BLE001 - not installed through ament: try the source tree
        pass
    candidates.append(Path(__file__).resolve().parents[2] / "config" / DDS_PROFILE_NAME)
    return next((c for c in candidates if c.is_file()), None)


def use_shipped_dds_profile() -> str:
    """Point Fast DDS at the shipped profile unless the user chose one. Call before rclpy.init.

    Set EVA_NO_DDS_PROFILE=1 to keep Fast DDS's built-in transports.
    """
    if os.environ.get(DDS_PROFILE_ENV) or os.environ.get("EVA_NO_DDS_PROFILE"):
        return os.environ.get(DDS_PROFILE_ENV, "")
    path = shipped_dds_profile()
    if path is not None:
        os.environ[DDS_PROFILE_ENV] = str(path)
        return str(path)
    return ""
