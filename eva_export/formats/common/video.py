"""H.264 MP4 encoding and decoding with PyAV, one frame at a time.

Files are constant frame rate: frame i has pts i in a 1/fps time base, so frame i is shown
at exactly i/fps seconds, which is what LeRobot's timestamp lookup expects.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from ...errors import VideoError
from . import video_facts

if TYPE_CHECKING:
    import av
    from av.container import InputContainer, OutputContainer
    from av.video.stream import VideoStream


def is_ffmpeg_error(exc: BaseException) -> bool:
    """Whether ``exc`` is PyAV's (never, while nothing has imported PyAV: the plain MP4 shape is
    read and written without it)."""
    av_mod = sys.modules.get("av")
    return av_mod is not None and isinstance(exc, av_mod.FFmpegError)


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
        import av
        from av.video.stream import VideoStream

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

    def add(self, rgb: NDArray[np.uint8]) -> None:
        import av

        if rgb.shape != (self.height, self.width, 3) or rgb.dtype != np.uint8:
            raise VideoError(
                f"{self.path.name}: frame {self.frames} has shape {rgb.shape} {rgb.dtype}, "
                f"expected ({self.height}, {self.width}, 3) uint8"
            )
        if rgb.strides[1:] != (3, 1) or rgb.strides[0] < 3 * self.width:
            rgb = np.ascontiguousarray(rgb)  # a channel-reordering or flipped view: one copy, here
        # wrap, not copy: the encoder converts to YUV inside encode(), before it returns; the
        # bitstream is byte-identical to a copied, aligned frame (tests/test_ingest_speed.py)
        frame = av.VideoFrame.from_numpy_buffer(rgb, format="rgb24")
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


class RgbConverter:
    """Decoded frames of one stream as (H, W, 3) uint8 RGB arrays, through one converter with one
    swscale thread: ``frame.to_ndarray(format="rgb24")`` makes a new scaler with its own thread
    pool for every frame (3-10x the conversion's cost). The pixels are the same
    (tests/test_hdf5_mcap_written.py)."""

    def __init__(self) -> None:
        from av.video.reformatter import VideoReformatter

        self._reformatter = VideoReformatter()

    def __call__(self, frame: av.VideoFrame) -> NDArray[np.uint8]:
        rgb = self._reformatter.reformat(frame, format="rgb24", threads=1).to_ndarray()
        return cast("NDArray[np.uint8]", rgb)  # rgb24 is 8 bits per channel; the stubs give every format's type


def iter_frames(path: Path) -> Iterator[NDArray[np.uint8]]:
    """Decode every frame of the first video stream as an (H, W, 3) uint8 RGB array (a small
    plain-shape file straight from its samples: plain_decode.py)."""
    import av

    from .plain_decode import frames, read_small

    rgb = RgbConverter()
    try:
        if (small := read_small(path)) is not None:
            for frame in frames(*small):
                yield rgb(frame)
            return
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                yield rgb(frame)
    except av.FFmpegError as exc:
        raise VideoError(f"cannot decode {path}: {exc}") from exc


def mp4_truncation(path: Path) -> str:
    """Why the MP4's top-level boxes do not tile the file exactly ("" when they do).

    A file cut short (a copy interrupted, a full disk) leaves its last box claiming more bytes
    than exist, even when the index (moov) at the front still lists every frame; garbage has
    no box structure. Reads 8 to 16 bytes per top-level box, nothing else.
    """
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes"
    with open(path, "rb") as fh:

        def head_at(pos: int) -> bytes:
            fh.seek(pos)
            return fh.read(16)

        return _box_truncation(head_at, size)


def mp4_truncation_of(data: bytes) -> str:
    """``mp4_truncation`` of a file whose every byte is ``data`` (read once by the caller)."""
    if len(data) < 8:
        return f"{len(data)} bytes"
    return _box_truncation(lambda pos: data[pos:pos + 16], len(data))


def _box_truncation(head_at: Callable[[int], bytes], size: int) -> str:
    pos = 0
    while pos < size:
        head = head_at(pos)
        if len(head) < 8:
            return f"a box header is cut at byte {pos}"
        box = int.from_bytes(head[:4], "big")
        kind = head[4:8]
        if not all(32 <= b < 127 for b in kind):
            return f"no MP4 box at byte {pos}"
        if box == 1:
            if len(head) < 16:
                return f"a box header is cut at byte {pos}"
            box = int.from_bytes(head[8:16], "big")
        elif box == 0:
            box = size - pos  # "to the end of the file"
        if box < 8:
            return f"box {kind!r} at byte {pos} has the impossible size {box}"
        if pos + box > size:
            return f"box {kind.decode()!r} at byte {pos} needs {pos + box} bytes, the file has {size}"
        pos += box
    return ""


def count_frames(path: Path) -> int:
    """Frames of the first video stream, without decoding: the MP4 sample table (exact, one
    sample per frame) when the file has one and its boxes tile the file, else packets demuxed.

    Demuxing reads the whole file; the index answers from the first few KB, which is what
    makes verifying a hard-linked split cheap. A file cut short is refused by its boxes. A file
    source validation already demuxed in this process, unchanged since, is not read again.
    """
    import av

    facts = video_facts.lookup(video_facts.file_key(path))
    if facts is not None:
        return facts.frames
    why = mp4_truncation(path) if path.suffix.lower() == ".mp4" else ""
    if why:
        raise VideoError(f"{path} is not a complete MP4 (truncated, empty or garbage: {why})")
    try:
        with av.open(str(path)) as container:
            return stream_frames(container, container.streams.video[0])
    except av.FFmpegError as exc:
        raise VideoError(f"cannot read {path}: {exc}") from exc


def stream_frames(container: InputContainer, stream: VideoStream) -> int:
    """Frames of an open video stream: the container index (the MP4 sample table, exact) when
    it has one, else the packets, demuxed (no decode)."""
    indexed = int(stream.frames or 0)
    return indexed if indexed > 0 else sum(1 for p in container.demux(stream) if p.size > 0)


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
    import av

    try:
        with av.open(str(path)) as container:
            s = container.streams.video[0]
            cc = s.codec_context
            return VideoProbe(codec=cc.name, width=cc.width, height=cc.height,
                              pix_fmt=str(cc.pix_fmt), fps=Fraction(s.average_rate or 0),
                              extradata=bytes(cc.extradata or b""))
    except av.FFmpegError as exc:
        raise VideoError(f"cannot probe {path}: {exc}") from exc


TOLERANCE_S = Fraction(1, 10000)  # LeRobotDataset's tolerance_s default: frame lookups allow this much


@dataclass(frozen=True)
class StreamTiming:
    """What a consumer's frame lookup relies on, read from the packets (nothing decoded). Times
    stay integer ticks of the stream's time base: a Fraction per packet cost more than the demux."""

    pts_ticks: tuple[int, ...]  # presentation times, in decode order
    dts_ticks: tuple[int, ...]  # decode times, in decode order
    time_base: Fraction
    duration: Fraction | None  # the stream's duration in seconds, as the container states it

    @property
    def pts(self) -> tuple[Fraction, ...]:
        """Presentation times in seconds, in decode order."""
        return tuple(p * self.time_base for p in self.pts_ticks)

    @property
    def dts(self) -> tuple[Fraction, ...]:
        """Decode times in seconds, in decode order."""
        return tuple(d * self.time_base for d in self.dts_ticks)


def stream_timing(path: Path) -> StreamTiming:
    import av

    try:
        with av.open(str(path)) as container:
            return container_timing(container, path)
    except av.FFmpegError as exc:
        raise VideoError(f"cannot read {path}: {exc}") from exc


def container_timing(container: InputContainer, path: Path) -> StreamTiming:
    """``stream_timing`` of a container already open (its packets not demuxed yet); PyAV's own
    errors are not wrapped here."""
    import av

    s = container.streams.video[0]
    tb = Fraction(s.time_base or 1)
    pts: list[int] = []
    dts: list[int] = []
    for p in container.demux(s):
        if p.size == 0:
            continue
        if p.pts is None or p.dts is None:
            raise VideoError(f"{path}: packet {len(pts)} has no timestamp")
        pts.append(p.pts)
        dts.append(p.dts)
    if s.duration:
        duration: Fraction | None = s.duration * tb
    else:
        duration = Fraction(container.duration, av.time_base) if container.duration else None
    return StreamTiming(tuple(pts), tuple(dts), tb, duration)


def timing_problems(t: StreamTiming, fps: int, frames: int, check_duration: bool = True) -> list[str]:
    """Why a consumer reading ``frames`` frames at ``i / fps`` would fail ([] if it would not).

    Decode times strictly increasing (a muxer's and a decoder's rule), presentation times on the
    fps grid within LeRobot's tolerance, one frame per slot, and (``check_duration``) a stated
    duration that covers the last frame without reaching a frame past it: decoders that derive
    the rate from the duration look frames up by ``round(t * frames / duration)``.
    """
    return tick_problems(t.pts_ticks, t.dts_ticks, t.time_base, t.duration, fps, frames, check_duration)


def tick_problems(pts: Sequence[int], dts: Sequence[int], tb: Fraction, duration: Fraction | None, fps: int,
                  frames: int, check_duration: bool = True) -> list[str]:
    """``timing_problems`` of times in ticks of ``tb``: integer arithmetic throughout."""
    out: list[str] = []
    if len(pts) != frames:
        out.append(f"{len(pts)} frames, {frames} expected")
    for k in range(1, len(dts)):
        if dts[k] <= dts[k - 1]:
            out.append(f"decode timestamps do not increase at packet {k} "
                       f"({float(dts[k - 1] * tb):.4f} s -> {float(dts[k] * tb):.4f} s)")
            break
    # |p*n/d - i/fps| <= 1/T  <=>  |p*n*fps*T - i*d*T| <= d*fps  (n/d = tb, 1/T = TOLERANCE_S)
    n, d, big_t = tb.numerator, tb.denominator, TOLERANCE_S.denominator
    a, b, c = n * fps * big_t, d * big_t, d * fps
    for i, p in enumerate(sorted(pts)):
        if abs(p * a - i * b) > c:
            out.append(f"frame {i} is shown at {float(p * tb):.4f} s, not {float(Fraction(i, fps)):.4f} s "
                       f"({fps} fps from {0.0:.4f} s)")
            break
    if check_duration and frames:
        end = Fraction(len(pts), fps)
        if duration is None:
            out.append("the stream states no duration")
        elif not end - TOLERANCE_S <= duration < end + Fraction(1, fps) - TOLERANCE_S:
            out.append(f"the stream lasts {float(duration):.4f} s, its {len(pts)} frames need "
                       f"{float(end):.4f} s")
    return out


def image_row_problem(value: object, shape: tuple[int, ...]) -> str:
    """Why one embedded-image cell (``{"bytes", "path"}`` holding a PNG or JPEG) would not give a
    reader an image of ``shape`` ("" when it would)."""
    import av

    data = value.get("bytes") if isinstance(value, dict) else value
    if not isinstance(data, (bytes, bytearray)) or not data:
        return "holds no image bytes"
    data = bytes(data)
    name = "png" if data.startswith(b"\x89PNG") else "mjpeg" if data.startswith(b"\xff\xd8") else ""
    if not name:
        return f"is not a PNG or JPEG image ({len(data)} bytes)"
    try:
        cc: Any = av.CodecContext.create(name, "r")  # a decoding context; the stubs type only the base
        frames = cc.decode(av.Packet(data))
        if not frames:
            return "does not decode"
        arr = frames[0].to_ndarray(format="rgb24")
    except (av.FFmpegError, ValueError) as exc:
        return f"does not decode ({exc})"
    if tuple(arr.shape) != tuple(shape):
        return f"decodes to shape {list(arr.shape)}, the feature declares {list(shape)}"
    return ""
