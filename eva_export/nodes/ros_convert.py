"""ROS messages <-> numpy: the only module that knows message layouts.

Intake converters (``intake_converter``) run inside subscription callbacks, so they only read
the header stamp and take zero-copy ``np.frombuffer`` views; decoding, reordering and checks
happen later in the capture worker (eva_export.capture.recorder). Builders (``image_msg`` ...)
are used by the simulated teleop publisher.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from geometry_msgs.msg import PoseStamped  # type: ignore[import-untyped]  # no py.typed
from sensor_msgs.msg import CompressedImage, Image, JointState  # type: ignore[import-untyped]  # no py.typed
from std_msgs.msg import Float64MultiArray  # type: ignore[import-untyped]  # no py.typed

from eva_export.capture import intake
from eva_export.capture.intake import StreamSpec, stamp_seconds  # noqa: F401 - re-exported

MSG_TYPES: dict[str, type] = {
    "JointState": JointState,
    "Float64MultiArray": Float64MultiArray,
    "PoseStamped": PoseStamped,
    "Image": Image,
    "CompressedImage": CompressedImage,
}

Intake = intake.Convert


class _Time(Protocol):
    sec: int
    nanosec: int


class _Header(Protocol):
    stamp: _Time


class Stamped(Protocol):
    """A message with a std_msgs/Header (the generated classes are untyped)."""

    header: _Header

DDS_PROFILE_ENV = "FASTDDS_DEFAULT_PROFILES_FILE"
DDS_PROFILE_NAME = "fastdds_shm.xml"


# ---- intake -----------------------------------------------------------------------------------
def intake_converter(spec: StreamSpec) -> tuple[type, Intake]:
    """(message class, msg -> (header stamp or None, payload)) for one configured stream.

    The conversion itself is ROS-free (eva_export.capture.intake) and shared with bag ingest.
    """
    if spec.msg_type not in MSG_TYPES:
        raise ValueError(f"stream {spec.name}: unsupported message type {spec.msg_type!r}")
    return MSG_TYPES[spec.msg_type], intake.converter(spec)


# ---- builders (teleop_sim, tests) ---------------------------------------------------------------
def set_stamp(msg: Stamped, seconds_nanos: tuple[int, int]) -> None:
    msg.header.stamp.sec, msg.header.stamp.nanosec = seconds_nanos


def joint_state_msg(names: Sequence[str], values: NDArray[np.generic], field: str = "position") -> JointState:
    msg = JointState()
    msg.name = list(names)
    setattr(msg, field, np.asarray(values, dtype=np.float64).tolist())
    return msg


def float_array_msg(values: NDArray[np.generic]) -> Float64MultiArray:
    msg = Float64MultiArray()
    msg.data = np.asarray(values, dtype=np.float64).tolist()
    return msg


def pose_msg(values: Sequence[float]) -> PoseStamped:
    msg = PoseStamped()
    p, q = msg.pose.position, msg.pose.orientation
    p.x, p.y, p.z, q.x, q.y, q.z, q.w = (float(v) for v in values)
    return msg


def image_msg(rgb: NDArray[np.uint8], frame_id: str = "") -> Image:
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
