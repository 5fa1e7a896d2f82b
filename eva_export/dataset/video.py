"""H.264 MP4 encoding and decoding with PyAV, one frame at a time.

Files are constant frame rate: frame i has pts i in a 1/fps time base, so frame i is shown
at exactly i/fps seconds, which is what LeRobot's timestamp lookup expects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from av.container import OutputContainer
from av.video.stream import VideoStream
from numpy.typing import NDArray

from ..errors import VideoError


@dataclass(frozen=True)
class VideoSettings:
    codec: str = "libx264"
    preset: str = "ultrafast"
    crf: int = 18
    gop: int = 10  # keyframe interval: small enough for fast random access while training
    threads: int = 1  # one encoder thread per camera is enough (PyAV releases the GIL)


class VideoEncoder:
    """Streaming encoder: ``add`` one RGB frame at a time, ``close`` returns the frame count."""

    def __init__(self, path: Path, width: int, height: int, fps: int,
                 settings: VideoSettings = VideoSettings()) -> None:
        self.path = Path(path)
        self.width, self.height, self.fps = width, height, fps
        self.frames = 0
        try:
            self._container: OutputContainer | None = av.open(str(self.path), mode="w", format="mp4")
            stream = self._container.add_stream(settings.codec, rate=fps)
            if not isinstance(stream, VideoStream):  # an audio or subtitle codec name in the config
                raise ValueError(f"{settings.codec!r} is not a video codec")
            stream.width = width
            stream.height = height
            stream.pix_fmt = "yuv420p"
            stream.time_base = Fraction(1, fps)
            stream.codec_context.time_base = Fraction(1, fps)
            stream.codec_context.gop_size = settings.gop
            stream.thread_count = settings.threads
            if settings.codec in ("libx264", "libx265"):
                stream.options = {"preset": settings.preset, "crf": str(settings.crf)}
            self._stream: VideoStream = stream
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise VideoError(f"cannot open video encoder for {self.path}: {exc}") from exc

    def add(self, rgb: NDArray[Any]) -> None:
        if rgb.shape != (self.height, self.width, 3) or rgb.dtype != np.uint8:
            raise VideoError(
                f"{self.path.name}: frame {self.frames} has shape {rgb.shape} {rgb.dtype}, "
                f"expected ({self.height}, {self.width}, 3) uint8"
            )
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self.frames
        frame.time_base = Fraction(1, self.fps)
        if self._container is None:
            raise VideoError(f"{self.path.name}: frame added after close")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> int:
        if self._container is None:
            return self.frames
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None
        return self.frames

    def abort(self) -> None:
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - the file is being discarded anyway
                pass
            self._container = None

    def __enter__(self) -> VideoEncoder:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def iter_frames(path: Path) -> Iterator[NDArray[Any]]:
    """Decode every frame of the first video stream as an (H, W, 3) uint8 RGB array."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                yield frame.to_ndarray(format="rgb24")
    except av.FFmpegError as exc:
        raise VideoError(f"cannot decode {path}: {exc}") from exc


def count_frames(path: Path) -> int:
    """Count frames by demuxing packets (no decode): exact for our one-packet-per-frame MP4s."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            return sum(1 for p in container.demux(stream) if p.size > 0)
    except av.FFmpegError as exc:
        raise VideoError(f"cannot read {path}: {exc}") from exc


def decode_count(path: Path) -> int:
    """Count frames by really decoding them: the check a consumer would do."""
    return sum(1 for _ in iter_frames(path))


@dataclass(frozen=True)
class VideoProbe:
    codec: str
    width: int
    height: int
    pix_fmt: str
    fps: Fraction
    extradata: bytes


def probe(path: Path) -> VideoProbe:
    try:
        with av.open(str(path)) as container:
            s = container.streams.video[0]
            cc = s.codec_context
            return VideoProbe(codec=cc.name, width=cc.width, height=cc.height,
                              pix_fmt=str(cc.pix_fmt), fps=Fraction(s.average_rate or 0),
                              extradata=bytes(cc.extradata or b""))
    except av.FFmpegError as exc:
        raise VideoError(f"cannot probe {path}: {exc}") from exc
