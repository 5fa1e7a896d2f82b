"""One read of each episode MP4 per v3 job: its codec parameters, reorder depth and (small files) packets.

The v3 shards need every camera's reorder delay before the first shard opens (v3_video), which
took one open of every episode MP4 before the one that copies it: on 1000 short episodes that
second open was most of the video time. ``probe`` reads a file once; a small file
(``KEEP_FILE_BYTES``) that fits the job's byte budget keeps its packets (``Probe.packets``), which
``VideoShards.add`` then copies without opening the file again. Only small files: the open saved
is a few milliseconds, worth keeping a few KB for, not megabytes (long episodes held up to the
budget made the peak memory grow with the episode length). The budget is fixed
(``PACKET_BUDGET``), so memory does not grow with the episode count either: past it, and for
larger files, files are probed as before (the first ``DELAY_PROBE_PACKETS``) and opened again
when copied.

Times are integers in the stream's time base (``num/den`` seconds per tick); the grid and
tolerance tests below are exact integer forms of the Fraction ones (10^5 packets of Fraction
arithmetic cost seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av

DELAY_PROBE_PACKETS = 64
PACKET_BUDGET = 16 * 1024 * 1024  # bytes of packets kept per camera and job, whatever the episode count
KEEP_FILE_BYTES = 1024 * 1024  # larger files are opened again to copy (an open is ~1% of reading them)
TOLERANCE_DEN = 10000  # LeRobotDataset's tolerance_s = 1 / 10000 s


@dataclass(frozen=True)
class CodecParams:
    codec: str
    width: int
    height: int
    pix_fmt: str
    extradata: bytes


@dataclass(frozen=True)
class Pkt:
    """A demuxed packet's bytes and times (stream time base), kept after its file is closed."""

    data: bytes
    pts: int | None
    dts: int | None
    keyframe: bool


@dataclass(frozen=True)
class Probe:
    params: CodecParams
    time_base: Fraction
    lead_frames: int  # how many frames decoding runs ahead of presentation (first packets)
    size: int  # the file's bytes
    packets: tuple[Pkt, ...] | None  # every packet with data, or None (not kept: read again)


def codec_params(stream: Any) -> CodecParams:
    """The stream's codec parameters, named by codec id (AV1, H.264...), never by the decoder.

    PyAV opens AV1 with the decoder ``libdav1d``; its name is not a codec anything can mux.
    """
    cc = stream.codec_context
    return CodecParams(f"id{cc.codec.id}:{cc.codec.type}", cc.width, cc.height, str(cc.pix_fmt),
                       bytes(cc.extradata or b""))


def round_div(a: int, b: int) -> int:
    """round(a / b) for b > 0, halves to even (as ``round`` of a Fraction)."""
    q, r = divmod(a, b)
    if 2 * r > b or (2 * r == b and q % 2 == 1):
        q += 1
    return q


def frame_slot(ticks: int, tb: Fraction, fps: int) -> tuple[int, bool]:
    """The frame number ``ticks`` (since the first frame) is closest to, and whether it is
    within LeRobot's tolerance of that frame's time: |ticks*tb - i/fps| <= 1/10000."""
    x = ticks * tb.numerator * fps  # the time in frames, times tb.denominator
    i = round_div(x, tb.denominator)
    return i, abs(x - i * tb.denominator) * TOLERANCE_DEN <= tb.denominator * fps


def lead_of(pts: list[int], tb: Fraction, fps: int) -> int:
    """Frames decoding must run ahead: max over decode position k of k - frame shown k-th."""
    if not pts:
        return 0
    base = min(pts)
    return max(0, max(k - frame_slot(t - base, tb, fps)[0] for k, t in enumerate(pts)))


def open_input(path: Path) -> Any:
    """``av.open`` for reading; a ``.mp4`` is opened with the MP4 demuxer named, which skips
    FFmpeg's format probe (a fifth of opening a small file). A file that is not what its name
    says is opened again with the probe, as before."""
    if path.suffix.lower() == ".mp4":
        try:
            return av.open(str(path), format="mp4")
        except av.FFmpegError:
            pass
    return av.open(str(path))


def packets_of(container: Any, stream: Any) -> list[Pkt]:
    return [Pkt(bytes(p), p.pts, p.dts, bool(p.is_keyframe)) for p in container.demux(stream) if p.size > 0]


def probe(path: Path, fps: int, keep: bool) -> Probe | None:
    """Read ``path`` once (all packets when ``keep``, else the first few); None when unreadable
    (the copy names the file when it opens it again)."""
    try:
        size = path.stat().st_size
        with open_input(path) as src:
            s = src.streams.video[0]
            params = codec_params(s)
            tb = Fraction(s.time_base or Fraction(1, fps))
            kept: list[Pkt] | None = packets_of(src, s) if keep else None
            if kept is not None:
                pts = [p.pts for p in kept[:DELAY_PROBE_PACKETS] if p.pts is not None]
            else:
                pts = []
                for p in src.demux(s):
                    if p.size and p.pts is not None:
                        pts.append(p.pts)
                        if len(pts) >= DELAY_PROBE_PACKETS:
                            break
    except (av.FFmpegError, OSError, IndexError):
        return None
    return Probe(params, tb, lead_of(pts, tb, fps), size, None if kept is None else tuple(kept))


class Probes:
    """One camera's probes, taken before its shards open and handed out once each."""

    def __init__(self, fps: int, budget: int | None = None) -> None:
        self.fps = fps
        self.left = PACKET_BUDGET if budget is None else budget  # read when a job starts (tests set it)
        self.lead = 0  # the largest lead seen, in frames
        self._held: dict[int, Probe] = {}

    def take_all(self, paths: list[tuple[int, Path]]) -> None:
        for episode_index, path in paths:
            try:
                small = path.stat().st_size <= min(self.left, KEEP_FILE_BYTES)
            except OSError:
                continue  # missing: the copy names it
            p = probe(path, self.fps, keep=small)
            if p is None:
                continue
            if p.packets is not None:
                self.left -= sum(len(k.data) for k in p.packets)
            self.lead = max(self.lead, p.lead_frames)
            self._held[episode_index] = p

    def pop(self, episode_index: int) -> Probe | None:
        return self._held.pop(episode_index, None)
