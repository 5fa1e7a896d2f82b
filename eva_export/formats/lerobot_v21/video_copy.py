"""An episode MP4 made of the source's own H.264 packets (stream copy), for cameras recorded as
compressed video: no decode-and-encode of the pixels, and the bitstream is the camera's.

Packets (Annex B access units, one per row) go to a raw ``.h264`` side file as they come; ``close``
remuxes it into the MP4 with frame i at pts i in a 1/fps time base (the same constant-rate grid
as video.VideoEncoder). ``decoded`` gives the frames written so far, for the writer that has to
give up the copy mid-episode and encode instead (episode_writer.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
from numpy.typing import NDArray

from ...errors import VideoError
from ..common.video import RgbConverter


class PacketCopy:
    """H.264 packets in, an MP4 out; ``close`` returns the frame count (checked against the input)."""

    def __init__(self, path: Path, fps: int) -> None:
        self.path = Path(path)
        self.side = self.path.with_suffix(".h264")
        self.fps = fps
        self.frames = 0
        self._fh = open(self.side, "wb")  # noqa: SIM115 - closed by close() / abort()

    def add(self, packet: bytes) -> None:
        self._fh.write(packet)
        self.frames += 1

    def decoded(self) -> Iterator[NDArray[Any]]:
        """The frames written so far, decoded (RGB), in order."""
        self._fh.flush()
        n = 0
        rgb = RgbConverter()
        try:
            with av.open(str(self.side), format="h264") as src:
                for f in src.decode(video=0):
                    n += 1
                    yield rgb(f)
        except av.FFmpegError as exc:
            raise VideoError(f"{self.path.name}: cannot decode the copied packets: {exc}") from exc
        if n != self.frames:
            raise VideoError(f"{self.path.name}: {self.frames} packets copied decode to {n} frames")

    def close(self) -> int:
        self._fh.close()
        n = 0
        try:
            with av.open(str(self.side), format="h264") as src, av.open(str(self.path), "w", format="mp4") as out:
                ins = src.streams.video[0]
                st = out.add_stream_from_template(ins)
                st.time_base = Fraction(1, self.fps)
                for pkt in src.demux(ins):
                    if pkt.size == 0:
                        continue  # the demuxer's end-of-stream packet
                    pkt.pts = pkt.dts = n
                    pkt.time_base = Fraction(1, self.fps)
                    pkt.stream = st
                    out.mux(pkt)
                    n += 1
        except (av.FFmpegError, ValueError) as exc:
            raise VideoError(f"{self.path.name}: cannot remux the copied H.264 packets: {exc}") from exc
        finally:
            self.side.unlink(missing_ok=True)
        if n != self.frames:
            raise VideoError(f"{self.path.name}: {self.frames} H.264 packets copied, the MP4 holds {n} frames")
        return n

    def discard(self) -> None:
        self._fh.close()
        self.side.unlink(missing_ok=True)
