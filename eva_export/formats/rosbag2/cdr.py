"""Zero-copy CDR decoding of the messages a bag carries most (images, joint states), for bag
ingest (bagreader.py).

mcap-ros2-support decodes a ``uint8[]`` into ``bytes`` (a copy of every 900 KB frame) through a
Python loop over the schema; these types have a fixed layout, so their few header fields are
read here with ``struct`` and the arrays stay read-only NumPy views of the message buffer.

Only little-endian plain CDR (what rclpy publishes and ``ros2 bag record`` stores) takes this
path; anything this decoder is not sure about (another encapsulation, a length that runs past the
buffer, an undecodable string) returns None and the generic decoder decides, so hostile input
behaves exactly as it did before this path existed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
JOINT_STATE = "sensor_msgs/msg/JointState"
COMPRESSED_VIDEO = "foxglove_msgs/msg/CompressedVideo"
FAST_TYPES = (IMAGE, COMPRESSED_IMAGE, JOINT_STATE, COMPRESSED_VIDEO)
_CDR_LE = b"\x00\x01"  # encapsulation kind CDR_LE; the two option bytes follow
_U32 = struct.Struct("<I")
_STAMP = struct.Struct("<iI")


@dataclass(frozen=True, slots=True)
class Stamp:
    sec: int
    nanosec: int


@dataclass(frozen=True, slots=True)
class Header:
    stamp: Stamp
    frame_id: str


@dataclass(frozen=True, slots=True)
class Image:
    """sensor_msgs/msg/Image with the field names rclpy uses; ``data`` a view, not a copy."""

    header: Header
    height: int
    width: int
    encoding: str
    is_bigendian: int
    step: int
    data: np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class CompressedImage:
    header: Header
    format: str
    data: np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class CompressedVideo:
    """foxglove_msgs/msg/CompressedVideo (no header: ``timestamp`` and ``frame_id`` at the top)."""

    timestamp: Stamp
    frame_id: str
    data: np.ndarray[Any, Any]
    format: str


@dataclass(frozen=True, slots=True)
class JointState:
    header: Header
    name: tuple[str, ...]
    position: np.ndarray[Any, Any]
    velocity: np.ndarray[Any, Any]
    effort: np.ndarray[Any, Any]


class _Doubt(Exception):
    """The buffer is not what this decoder expects: the generic decoder takes the message."""


class _Cursor:
    """Reads aligned CDR fields; offsets count from the end of the 4-byte encapsulation header."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos, self.end = buf, 4, len(buf)

    def _align(self, n: int) -> None:
        self.pos += (-(self.pos - 4)) % n

    def u32(self) -> int:
        self._align(4)
        if self.pos + 4 > self.end:
            raise _Doubt
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u8(self) -> int:
        if self.pos >= self.end:
            raise _Doubt
        self.pos += 1
        return int(self.buf[self.pos - 1])

    def string(self) -> str:
        n = self.u32()
        if self.pos + n > self.end:
            raise _Doubt
        raw = bytes(self.buf[self.pos:self.pos + max(0, n - 1)])  # without the terminating NUL
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Doubt from None

    def u8_view(self) -> np.ndarray[Any, Any]:
        n = self.u32()
        if self.pos + n > self.end:
            raise _Doubt
        view = np.frombuffer(self.buf, np.uint8, count=n, offset=self.pos)
        self.pos += n
        return view

    def f64_view(self) -> np.ndarray[Any, Any]:
        n = self.u32()
        if n:
            self._align(8)
        if self.pos + 8 * n > self.end:
            raise _Doubt
        view = np.frombuffer(self.buf, "<f8", count=n, offset=self.pos)
        self.pos += 8 * n
        return view

    def strings(self) -> tuple[str, ...]:
        n = self.u32()
        if 4 * n > self.end - self.pos:  # every string takes at least its 4-byte length
            raise _Doubt
        return tuple(self.string() for _ in range(n))

    def header(self) -> Header:
        self._align(4)
        if self.pos + 8 > self.end:
            raise _Doubt
        sec, nsec = _STAMP.unpack_from(self.buf, self.pos)
        self.pos += 8
        return Header(Stamp(int(sec), int(nsec)), self.string())


def decode(type_name: str, buf: memoryview) -> Image | CompressedImage | CompressedVideo | JointState | None:
    """The message, when ``type_name`` is an image type in little-endian CDR; else None."""
    if type_name not in FAST_TYPES or len(buf) < 4 or bytes(buf[:2]) != _CDR_LE:
        return None
    c = _Cursor(buf)
    try:
        header = c.header()
        if type_name == COMPRESSED_VIDEO:  # the same two leading fields as a Header
            data = c.u8_view()
            return CompressedVideo(header.stamp, header.frame_id, data, c.string())
        if type_name == JOINT_STATE:
            return JointState(header, c.strings(), c.f64_view(), c.f64_view(), c.f64_view())
        if type_name == COMPRESSED_IMAGE:
            return CompressedImage(header, c.string(), c.u8_view())
        height = c.u32()
        width = c.u32()
        encoding = c.string()
        big = c.u8()
        step = c.u32()
        return Image(header, height, width, encoding, big, step, c.u8_view())
    except _Doubt:
        return None
