"""The timing a consumer's frame lookup relies on in a v3 camera shard, checked in integer ticks.

The same checks and messages as ``dataset.video.timing_problems(stream_timing(path), fps,
frames)``: packets demuxed (nothing decoded), decode times strictly increasing, presentation
times on the fps grid within LeRobot's 1e-4 s, one frame per slot, and a stated duration that
covers the last frame without reaching a frame past it. Times stay integers in the stream's
time base: a shard holds 10^4-10^5 packets, and a Fraction per packet cost seconds.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av

from ..dataset.video import TOLERANCE_S
from ..errors import VideoError
from .v3_probe import TOLERANCE_DEN


def shard_timing_problems(path: Path, fps: int, frames: int) -> list[str]:
    """Why a consumer reading ``frames`` frames at ``i / fps`` from ``path`` would fail ([] if not)."""
    pts: list[int] = []
    dts: list[int] = []
    try:
        with av.open(str(path)) as container:
            s = container.streams.video[0]
            tb = Fraction(s.time_base or 1)
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
    except av.FFmpegError as exc:
        raise VideoError(f"cannot read {path}: {exc}") from exc
    return tick_problems(pts, dts, tb, duration, fps, frames)


def tick_problems(pts: list[int], dts: list[int], tb: Fraction, duration: Fraction | None, fps: int,
                  frames: int) -> list[str]:
    out: list[str] = []
    if len(pts) != frames:
        out.append(f"{len(pts)} frames, {frames} expected")
    for k in range(1, len(dts)):
        if dts[k] <= dts[k - 1]:
            out.append(f"decode timestamps do not increase at packet {k} "
                       f"({float(dts[k - 1] * tb):.4f} s -> {float(dts[k] * tb):.4f} s)")
            break
    # |p*n/d - i/fps| <= 1/T  <=>  |p*n*fps*T - i*d*T| <= d*fps  (n/d = tb, T = 10000)
    n, d = tb.numerator, tb.denominator
    a, b, c = n * fps * TOLERANCE_DEN, d * TOLERANCE_DEN, d * fps
    for i, p in enumerate(sorted(pts)):
        if abs(p * a - i * b) > c:
            out.append(f"frame {i} is shown at {float(p * tb):.4f} s, not {float(Fraction(i, fps)):.4f} s "
                       f"({fps} fps from {0.0:.4f} s)")
            break
    if frames:
        end = Fraction(len(pts), fps)
        if duration is None:
            out.append("the stream states no duration")
        elif not end - TOLERANCE_S <= duration < end + Fraction(1, fps) - TOLERANCE_S:
            out.append(f"the stream lasts {float(duration):.4f} s, its {len(pts)} frames need "
                       f"{float(end):.4f} s")
    return out
