"""The records of a viewer-profile MCAP file: header, topics, schemas and message encodings.

``data/chunk-XXX/episode_NNNNNN.mcap``, one file per episode:

* Header: profile ``eva-viewer``, library ``eva-export <version>``. Channels mix two encodings
  that Foxglove, Lichtblick and Rerun all decode, each with its schema embedded in the file.
* ``/<camera key>`` per camera, ``protobuf``: ``foxglove.CompressedVideo`` (format ``h264``,
  Annex B, one access unit per frame, the source's packets copied) when the source camera is
  H.264 without B-frames, else ``foxglove.CompressedImage`` (``png`` bytes copied from a
  Parquet image column, or ``jpeg`` encoded from the decoded frames). Schema: the Foxglove
  FileDescriptorSet. frame_id is the camera key.
* ``/<feature>`` per numeric feature (state, action, effort...; not the five index columns),
  ``cdr``: ROS 2 ``sensor_msgs/msg/JointState`` (ros2msg schema), ``name`` the feature's
  dimension names, ``position`` its values as float64. Rerun turns it into one named Scalars
  series per dimension; Foxglove plots ``/<feature>.position[i]``.
* Metadata record ``eva_export.episode``: the episode row (task, length, quality, quality
  issues, verdict, note), its subset and source episode index, fps: why it is in this subset;
  the same as text in one ``std_msgs/msg/String`` message (``cdr``) on ``/eva_export/episode``.

Message i of every channel has log_time = publish_time = header stamp = i * 1e9 // fps ns
(the table's timestamp grid) and sequence i; messages are written in time order.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ... import __version__
from ..common.info_record import DEFAULT_FEATURES, Feature

FORMAT = "mcap_foxglove"
PROFILE = "eva-viewer"
LIBRARY = f"eva-export {__version__}"
METADATA_NAME = "eva_export.episode"
EPISODE_TOPIC = "/eva_export/episode"
STRING_SCHEMA = "std_msgs/msg/String"
STRING_MSGDEF = "string data\n"
VIDEO_SCHEMA = "foxglove.CompressedVideo"
IMAGE_SCHEMA = "foxglove.CompressedImage"
JOINT_SCHEMA = "sensor_msgs/msg/JointState"
JOINT_MSGDEF = """std_msgs/Header header
string[] name
float64[] position
float64[] velocity
float64[] effort
================================================================================
MSG: std_msgs/Header
builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec
"""
_NUMERIC = ("float", "int", "uint", "bool")
_CDR_LE = b"\x00\x01\x00\x00"  # encapsulation: plain CDR, little endian
_STAMP = struct.Struct("<iI")
_U32 = struct.Struct("<I")


def string_cdr(text: str) -> bytes:
    """CDR bytes of ``std_msgs/msg/String``."""
    raw = text.encode() + b"\0"
    return _CDR_LE + _U32.pack(len(raw)) + raw


def frame_time_ns(frame_index: int, fps: int) -> int:
    """Stamp of frame ``frame_index``: the table's timestamp grid (frame 0 at 0)."""
    return frame_index * 1_000_000_000 // fps


def topic(key: str) -> str:
    return "/" + key


def numeric_keys(features: dict[str, Feature]) -> list[str]:
    """The features written as JointState channels, in info.json order."""
    return [k for k, f in features.items() if k not in DEFAULT_FEATURES and not f.is_visual
            and f.dtype.startswith(_NUMERIC)]


def dimension_names(key: str, feature: Feature) -> list[str]:
    """One name per value of ``feature`` (info.json ``names``, flattened), else ``key[i]``."""
    dims = int(np.prod(feature.shape)) if feature.shape else 1
    names: Any = feature.names
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if (isinstance(names, list) and len(names) == dims and all(isinstance(n, str) and n for n in names)
            and len(set(names)) == dims):
        return list(names)
    return [f"{key}[{i}]" for i in range(dims)]


class JointStateCdr:
    """CDR bytes of ``sensor_msgs/msg/JointState`` for one channel: the header's frame id and
    the names never change, so everything between the stamp and the values is built once."""

    def __init__(self, frame_id: str, names: list[str]) -> None:
        body = bytearray()
        pos = _STAMP.size  # offsets count from the end of the encapsulation header

        def put(data: bytes, align: int) -> None:
            nonlocal pos
            pad = (-pos) % align
            body.extend(b"\0" * pad + data)
            pos += pad + len(data)

        def put_string(s: str) -> None:
            raw = s.encode() + b"\0"
            put(_U32.pack(len(raw)), 4)
            put(raw, 1)

        put_string(frame_id)
        put(_U32.pack(len(names)), 4)
        for n in names:
            put_string(n)
        put(_U32.pack(len(names)), 4)  # position count; the float64 values follow, 8-aligned
        pad = (-pos) % 8
        self._prefix = bytes(body) + b"\0" * pad
        self._dims = len(names)
        self._tail = _U32.pack(0) * 2  # velocity and effort: empty (8-aligned after the values)

    def encode(self, stamp_ns: int, values: NDArray[Any]) -> bytes:
        flat = np.ascontiguousarray(values, dtype="<f8").reshape(-1)
        if flat.size != self._dims:
            raise ValueError(f"{flat.size} values for {self._dims} joint names")
        sec, nanosec = divmod(stamp_ns, 1_000_000_000)
        return b"".join((_CDR_LE, _STAMP.pack(sec, nanosec), self._prefix, flat.tobytes(), self._tail))
