"""Short-episode video fixtures encoded the way LeRobot's recorder encodes them: libx264 or
libx265 through PyAV with B-frames (decode times start below zero), except where the episode is
too short to have any (1 frame for H.264, 1-2 frames for HEVC)."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also run as a script (the HEVC child)
from dsfactory import Ep, image, make_subset  # noqa: E402


def encode_bframes(path: Path, frames: list[np.ndarray], fps: int, codec: str, gop: int = 2) -> None:
    """An MP4 as LeRobot's recorder writes it (g=2, libx264/libx265 preset medium, B-frames on).

    libx265 in PyAV carries decode-time state from one encoder to the next in a process (a
    second 2-frame encode came out with decode times 448 frames early, which the MP4 muxer
    then refuses), so every HEVC file is encoded in a fresh interpreter.
    """
    if codec == "libx265" and os.environ.get("SHORT_VIDEOS_CHILD") != "1":
        npy = path.with_suffix(".npy")
        np.save(npy, np.stack(frames))
        subprocess.run([sys.executable, __file__, str(path), str(npy), str(fps), codec, str(gop)], check=True,
                       timeout=120, env={**os.environ, "SHORT_VIDEOS_CHILD": "1"}, capture_output=True)
        npy.unlink()
        return
    h, w = frames[0].shape[:2]
    with av.open(str(path), "w", format="mp4") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.codec_context.gop_size = gop
        s.thread_count = 1  # one thread: the same bytes on every run
        s.options = {"preset": "medium", "crf": "23", "threads": "1"}
        if codec == "libx265":
            s.options = {"preset": "medium", "crf": "23",
                         "x265-params": "log-level=error:pools=none:frame-threads=1:lookahead-threads=0"}
        packets = []
        for i, img in enumerate(frames):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = i, Fraction(1, fps)
            packets += s.encode(f)
        packets += s.encode(None)
        for p in with_decode_times(packets):
            c.mux(p)


def with_decode_times(packets: list[av.Packet]) -> list[av.Packet]:
    """The packets with decode times rebuilt from their presentation times: libx265 through PyAV
    sometimes hands out a flushed packet's dts from uninitialised memory (seen as -9.4e13), which
    the MP4 muxer then refuses. dts k is the k-th smallest pts less the reorder delay: the
    encoder's own first dts when it is plausible (LeRobot's files decode from below zero), else
    the least delay that keeps every dts at or before its pts."""
    if not packets:
        return packets
    pts = [int(p.pts) for p in packets]
    order = sorted(pts)
    first = packets[0].dts
    delay = max(0, *(o - q for o, q in zip(order, pts, strict=True)))
    if first is not None and -16 <= first - order[0] <= -delay:
        delay = order[0] - first
    for p, o in zip(packets, order, strict=True):
        p.dts = o - delay
    return packets


def textured(episode: int, frame: int, width: int, height: int) -> np.ndarray:
    """dsfactory's colour code plus a moving bar, so the encoder really predicts between frames."""
    img = image(episode, frame, 0, width, height)
    img[:, (frame * 3) % width, 2] = 255
    return img


def short_subset(root: Path, lengths: list[int], codec: str = "libx264", fps: int = 30, width: int = 64,
                 height: int = 48) -> Path:
    """A one-camera staged subset whose episode MP4s are B-frame encodes of the given lengths."""
    make_subset(root, [Ep(frames=n) for n in lengths], cameras=1, width=width, height=height, fps=fps)
    for e, n in enumerate(lengths):
        path = root / f"videos/chunk-000/observation.images.cam0/episode_{e:06d}.mp4"
        path.unlink()
        encode_bframes(path, [textured(e, i, width, height) for i in range(n)], fps, codec)
    return root


if __name__ == "__main__":  # the HEVC child: path, frames.npy, fps, codec, gop
    encode_bframes(Path(sys.argv[1]), list(np.load(sys.argv[2])), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
