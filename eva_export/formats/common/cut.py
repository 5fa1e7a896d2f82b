"""Cutting one episode's frames out of a camera MP4 shared with other episodes (v3.0 sources).

Frame k of the shared file is the packet shown at k / fps (LeRobot's v3 lookup rounds
``from_timestamp + timestamp`` to a frame of the whole file). The episode is stream-copied
when the cut is exact: its packets, in decode order, are one contiguous run that starts with a
keyframe and holds each of its frames exactly once (true for LeRobot's concatenations, whose
episodes were encoded separately). Otherwise only this episode is decoded and re-encoded
(libx264), and the caller reports it. Memory: one packet or frame at a time, plus one byte
per frame of the episode (the frames seen).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av

from ...errors import ExportError, VideoError
from .video import RgbConverter, VideoEncoder, VideoSettings, count_frames

#: Packets scanned past the episode's end for frames still to come in decode order (B-frames).
REORDER_MARGIN = 16


@dataclass(frozen=True)
class CutResult:
    frames: int
    reencoded: bool


def cut_episode(src: Path, first: int, count: int, fps: int, dst: Path, what: str,
                settings: VideoSettings = VideoSettings()) -> CutResult:
    """Write frames [first, first + count) of ``src`` to ``dst`` as a file of their own."""
    try:
        exact = _exact_cut(src, first, count, fps)
        if exact:
            _copy(src, first, count, fps, dst)
        else:
            _reencode(src, first, count, fps, dst, settings)
        n = count_frames(dst)
    except (av.FFmpegError, VideoError, OSError) as exc:
        dst.unlink(missing_ok=True)
        raise ExportError(f"{what}: cannot cut frames {first}..{first + count - 1} out of {src}: {exc}") from exc
    if n != count:
        dst.unlink(missing_ok=True)
        raise ExportError(f"{what}: the cut of {src} holds {n} frames, the episode has {count}")
    return CutResult(n, not exact)


def _frame_ratio(stream: Any, fps: int) -> float:
    """pts -> frame number factor (time base x fps), computed once per file."""
    return float(Fraction(stream.time_base) * fps)


def seek_to_frame(container: Any, stream: Any, first: int, fps: int) -> None:
    """To the last keyframe at or before frame ``first`` (nothing to do for frame 0)."""
    if first > 0:
        container.seek(int(Fraction(first, fps) / Fraction(stream.time_base)), stream=stream,
                       backward=True, any_frame=False)


def _exact_cut(src: Path, first: int, count: int, fps: int) -> bool:
    """Whether the episode's packets form one run, in decode order, starting at a keyframe."""
    end = first + count
    seen = bytearray(count)
    run_start = run_end = -1
    first_ok = False
    past = 0
    with av.open(str(src)) as c:
        s = c.streams.video[0]
        ratio = _frame_ratio(s, fps)
        seek_to_frame(c, s, first, fps)
        for pos, pkt in enumerate(c.demux(s)):
            if pkt.size == 0 or pkt.pts is None:
                continue
            k = round(pkt.pts * ratio)
            if first <= k < end:
                if run_start < 0:
                    run_start, first_ok = pos, bool(pkt.is_keyframe) and k == first
                if seen[k - first] or (run_end >= 0 and run_end != pos - 1):
                    return False  # a frame twice, or the run interrupted by another frame
                seen[k - first] = 1
                run_end = pos
            elif k >= end:
                past += 1
                if past > REORDER_MARGIN:
                    break
            elif run_start >= 0:
                return False  # an earlier frame decoded inside the run (open GOP)
    return first_ok and all(seen)


def _open_out(dst: Path, template: Any) -> tuple[Any, Any]:
    dst.parent.mkdir(parents=True, exist_ok=True)
    out = av.open(str(dst), mode="w", format="mp4", options={"movflags": "faststart"})
    # opaque: copy codec id and parameters, never look an encoder up by the decoder's name (AV1)
    return out, out.add_stream_from_template(template, opaque=True)


def _copy(src: Path, first: int, count: int, fps: int, dst: Path) -> None:
    end = first + count
    with av.open(str(src)) as c:
        s = c.streams.video[0]
        ratio = _frame_ratio(s, fps)
        seek_to_frame(c, s, first, fps)
        out, o = _open_out(dst, s)
        with out:
            shift: int | None = None
            done = 0
            for pkt in c.demux(s):
                if pkt.size == 0 or pkt.pts is None or pkt.dts is None:
                    continue
                k = round(pkt.pts * ratio)
                if not first <= k < end:
                    continue
                if shift is None:
                    shift = -pkt.pts  # the episode's frame 0 at time 0, as v2.1 readers expect
                pkt.pts += shift
                pkt.dts += shift
                pkt.stream = o
                out.mux(pkt)
                done += 1
                if done == count:
                    break


def _reencode(src: Path, first: int, count: int, fps: int, dst: Path, settings: VideoSettings) -> None:
    end = first + count
    with av.open(str(src)) as c:
        s = c.streams.video[0]
        ratio = _frame_ratio(s, fps)
        seek_to_frame(c, s, first, fps)
        cc = s.codec_context
        rgb = RgbConverter()
        with VideoEncoder(dst, cc.width, cc.height, fps, settings) as enc:
            for frame in c.decode(s):
                k = round((frame.pts or 0) * ratio)
                if first <= k < end:
                    enc.add(rgb(frame))
                if enc.frames == count or k >= end + REORDER_MARGIN:
                    break
