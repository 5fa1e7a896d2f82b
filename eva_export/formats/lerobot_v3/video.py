"""LeRobot v3.0 camera shards: episode MP4s joined by stream copy, timed like one encode.

Each episode's packets are copied (never decoded) and re-timed in the shard's time base
(``T`` ticks per second, ``F = T / fps`` ticks per frame):

- presentation: frame i of an episode with ``before`` frames ahead of it in the shard is shown
  at exactly ``(before + i) * F``; the source's own times only say which frame a packet is,
  and must be on the fps grid within LeRobot's 1e-4 s tolerance, once each;
- decoding: the k-th packet of the shard is decoded at ``k * F - D``, one frame apart, where
  ``D`` is the largest reorder delay of the episodes probed ahead when the shard opens (an
  episode needing more later starts a new shard; v3_probe.Probes). B-frame episodes start their decode clock ``D`` early (H.264/HEVC written by
  LeRobot) while 1- and 2-frame episodes have none; re-timing every packet on one clock keeps
  decode times strictly increasing at every join and makes the MP4 sample durations add up
  to exactly the shard's frames, so its duration and average rate are what the episodes'
  from/to timestamps assume (a shard one frame short breaks LeRobot's frame lookup).

An episode that cannot be placed exactly (off-grid or missing frames, decode order needing
more than ``D``, no keyframe first, codec parameters other than the shard's) is re-encoded
alone and recorded in ``reencoded``. Messages name the raw dataset's file and episode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ...errors import ExportError, VideoError
from ..common.mp4_write import PlainMp4
from ..common.provenance import RawNames
from ..common.video import VideoEncoder, VideoSettings, is_ffmpeg_error, iter_frames
from .layout import VIDEO_PATH_V30
from .probe import H264_NAME, CodecParams, Pkt, Probe, codec_params, frame_slots, open_input, packets_of, probe

if TYPE_CHECKING:
    from av.container import OutputContainer
    from av.video.stream import VideoStream

log = logging.getLogger(__name__)

MIN_TIMESCALE = 10000  # what FFmpeg's MP4 muxer raises a coarse video time base to
__all__ = ["CodecParams", "Locator", "Numbering", "VideoShards", "codec_params", "reorder_delay", "shard_timescale"]


@dataclass(frozen=True)
class Locator:
    chunk_index: int
    file_index: int


class Numbering:
    """file-NNN inside chunk-NNN, ``chunks_size`` files per chunk folder."""

    def __init__(self, chunks_size: int) -> None:
        self.chunks_size = chunks_size
        self.chunk = 0
        self.file = -1

    def next(self) -> Locator:
        self.file += 1
        if self.file >= self.chunks_size:
            self.chunk, self.file = self.chunk + 1, 0
        return Locator(self.chunk, self.file)

    def undo(self) -> None:
        """Give the last number back (its file was never used)."""
        self.file -= 1
        if self.file < 0 and self.chunk > 0:
            self.chunk, self.file = self.chunk - 1, self.chunks_size - 1


def shard_timescale(fps: int) -> int:
    """Ticks per second of a shard: a multiple of fps (frame times exact) the muxer keeps."""
    t = fps
    while t < MIN_TIMESCALE:
        t *= 2
    return t


def reorder_delay(path: Path, fps: int, timescale: int) -> int:
    """How far (in ticks) decoding must run ahead of presentation for this file's frame order.

    Measured from the presentation times in decode order (the k-th packet decoded must not be
    shown before frame k), not from the file's own decode times, which an encoder may have
    placed anywhere below its presentation times. Only the first ``DELAY_PROBE_PACKETS`` are
    read (the reorder depth shows in the first GOPs); an episode needing more later is caught
    when it is placed, and re-encoded. (The exporter takes it from ``Probes``, one read per file.)
    """
    p = probe(path, fps, keep=False)
    return 0 if p is None else p.lead_frames * (timescale // fps)


class NotPlaceable(Exception):
    """The episode's packets cannot be put on the shard's grid as they are."""


class Placed(NamedTuple):
    data: bytes
    pts: int
    keyframe: bool


class VideoShards:
    """One camera's MP4 shards, built by stream copy (re-encoding only what cannot be placed)."""

    def __init__(self, out: Path, key: str, fps: int, shape: tuple[int, ...], limit_bytes: int,
                 chunks_size: int, reencode: VideoSettings, tmp_dir: Path, delay: int = 0,
                 names: RawNames | None = None) -> None:
        self.out, self.key, self.fps = out, key, fps
        self.height, self.width = int(shape[0]), int(shape[1])
        self.limit = limit_bytes
        self.numbering = Numbering(chunks_size)
        self.reencode = reencode
        self.tmp_dir = tmp_dir
        self.timescale = shard_timescale(fps)
        self.tick = self.timescale // fps  # ticks per frame
        self.delay = delay  # D: the decode clock's lead over the presentation clock, in ticks
        # D for the next shard opened (ticks), when the caller knows the episodes ahead
        # (Probes.next); None: every shard keeps ``delay``
        self.ahead: int | None = None
        self.names = names
        self.container: OutputContainer | None = None  # a shard muxed by PyAV, or
        self.stream: VideoStream | None = None
        self.plain: PlainMp4 | None = None  # one written by mp4_write (no reordering)
        self.params: CodecParams | None = None
        self.only_reencoded = False
        self.loc = Locator(0, 0)
        self.frames = 0
        self.size = 0
        self.reencoded: list[int] = []
        self.files: list[Path] = []

    def _name(self, episode_index: int, path: Path) -> str:
        """'episode 4 (<raw file>)': the raw dataset's, never the staged subset's."""
        if self.names is None:
            return f"episode {episode_index} ({path})"
        return f"{self.names.episode(episode_index)} ({self.names.video(self.key, episode_index)})"

    def _open(self, template: Path, params: CodecParams) -> None:
        """A new shard whose stream copies the codec parameters of ``template``'s stream."""
        self.loc = self.numbering.next()
        path = self.out / VIDEO_PATH_V30.format(video_key=self.key, chunk_index=self.loc.chunk_index,
                                                file_index=self.loc.file_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.files.append(path)
        self.params, self.frames, self.size = params, 0, 0
        if self.ahead is not None:
            self.delay = self.ahead
        self.only_reencoded = False  # set when a re-encoded episode had to open this shard
        if self.delay == 0 and params.codec == H264_NAME and params.extradata[:1] == b"\x01":
            # decode order is presentation order: every sample's times are its frame's
            self.plain = PlainMp4(path, params.extradata, self.width, self.height, self.timescale, self.tick)
            return
        import av

        self.container = av.open(str(path), mode="w", format="mp4", options={"movflags": "faststart"})
        with av.open(str(template)) as src:  # once per shard, not per episode
            # opaque=True copies the codec parameters (codec id, extradata, size, pix_fmt) without
            # opening an encoder: building it from the DECODER's name fails for AV1 (libdav1d).
            self.stream = self.container.add_stream_from_template(src.streams.video[0], opaque=True)
        self.stream.time_base = Fraction(1, self.timescale)

    @property
    def is_open(self) -> bool:
        return self.container is not None or self.plain is not None

    def close(self) -> None:
        if self.is_open:
            try:
                if self.plain is not None and self.frames:
                    self.plain.close()
                elif self.plain is not None:
                    self.plain.abort()
                elif self.container is not None:
                    self.container.close()
            except Exception as exc:
                if not (isinstance(exc, OSError) or is_ffmpeg_error(exc)):
                    raise
                raise ExportError(f"{self.key}: cannot finish a video shard ({exc})") from exc
            self.container = self.stream = self.plain = None
            if self.frames == 0:  # opened for an episode that went elsewhere: no empty shard
                self.files.pop().unlink(missing_ok=True)
                self.numbering.undo()

    def add(self, episode_index: int, path: Path, rows: int, probed: Probe | None = None) -> tuple[Locator, int]:
        """Append one episode MP4; returns the shard locator and the frames before it in the shard.

        ``probed``: the file's probe (v3_probe); when it kept the packets the file is not read again.
        """
        if not path.is_file():
            raise ExportError(f"{self._name(episode_index, path)}: the {self.key} video is missing")
        size = probed.size if probed is not None else path.stat().st_size
        if self.is_open and self.size + size > self.limit:
            self.close()
        elif (self.is_open and self.ahead is not None and probed is not None
              and probed.lead_frames * self.tick > self.delay):
            # its decode order needs a clock further ahead than this shard's: a new shard
            log.info("%s %s: starting a new shard (reorder lead %d frames)", self.key,
                     self._name(episode_index, path), probed.lead_frames)
            self.close()
        try:
            if probed is not None and probed.packets is not None:
                why = self._join(episode_index, path, rows, probed.params, probed.time_base, list(probed.packets))
            else:
                with open_input(path) as src:
                    s = src.streams.video[0]
                    params, tb = codec_params(s), Fraction(s.time_base or Fraction(1, self.fps))
                    pkts = packets_of(src, s)
                why = self._join(episode_index, path, rows, params, tb, pkts)
            if not why:
                return Locator(self.loc.chunk_index, self.loc.file_index), self.frames - rows
        except Exception as exc:
            if not is_ffmpeg_error(exc):
                raise
            raise ExportError(f"{self._name(episode_index, path)}: cannot read the {self.key} video ({exc})") from exc
        log.info("%s %s: re-encoding (%s)", self.key, self._name(episode_index, path), why)
        return self._add_reencoded(episode_index, path, rows)

    def _join(self, episode_index: int, path: Path, rows: int, params: CodecParams, tb: Fraction,
              pkts: list[Pkt]) -> str:
        """Stream-copy the packets into the open shard (opening one if needed); "" when done,
        else why they cannot be copied as they are."""
        if (params.width, params.height) != (self.width, self.height):
            raise ExportError(f"{self._name(episode_index, path)}: {self.key} video is "
                              f"{params.width}x{params.height}, the feature is {self.width}x{self.height}")
        if not self.is_open or (params != self.params and self.only_reencoded):
            # A shard opened for a re-encoded episode does not make the next original
            # one foreign: it starts its own shard rather than being re-encoded too.
            self.close()
            self._open(path, params)
        if params != self.params:
            return "its codec parameters differ from the shard's"
        try:
            self._mux(self._place(pkts, tb, rows, episode_index, path))
        except NotPlaceable as exc:
            return str(exc)
        return ""

    def _place(self, pkts: list[Pkt], tb: Fraction, rows: int, episode_index: int, path: Path) -> list[Placed]:
        """The episode's packets in decode order with their frame numbers, checked for the grid."""
        if len(pkts) != rows:
            raise ExportError(f"{self._name(episode_index, path)}: {self.key} video has {len(pkts)} frames, "
                              f"the table has {rows} rows")
        if any(p.pts is None or p.dts is None for p in pkts):
            raise NotPlaceable("a packet has no timestamp")
        if not pkts[0].keyframe:
            raise NotPlaceable("it does not start with a keyframe")
        base = min(int(p.pts or 0) for p in pkts)
        out: list[Placed] = []
        for p, (i, on_grid) in zip(pkts, frame_slots([int(p.pts or 0) - base for p in pkts], tb, self.fps),
                                   strict=True):
            if not on_grid:
                t = (int(p.pts or 0) - base) * tb
                raise NotPlaceable(f"a frame at {float(t):.6f} s is off the {self.fps} fps grid")
            out.append(Placed(p.data, i, p.keyframe))
        if sorted(q.pts for q in out) != list(range(rows)):
            raise NotPlaceable("its frames are not one per frame slot")
        for k, q in enumerate(out):  # decode clock k*F - D must not pass the frame's own time
            if k * self.tick - self.delay > q.pts * self.tick:
                raise NotPlaceable(f"its decode order needs more than {self.delay} ticks of delay")
        return out

    def _mux(self, placed: list[Placed]) -> tuple[Locator, int]:
        before = self.frames
        if self.plain is not None:  # placed with delay 0: decode position k is frame k
            self.plain.add([p.data for p in placed], [p.keyframe for p in placed])
            self.size += sum(len(p.data) for p in placed)
            self.frames += len(placed)
            return Locator(self.loc.chunk_index, self.loc.file_index), before
        import av

        tb = Fraction(1, self.timescale)
        container, stream = self.container, self.stream
        assert container is not None and stream is not None  # add() opened the shard (narrowing)
        for k, p in enumerate(placed):
            pkt = av.Packet(p.data)
            pkt.time_base = tb
            pkt.pts = (before + p.pts) * self.tick
            pkt.dts = (before + k) * self.tick - self.delay
            pkt.duration = self.tick
            pkt.is_keyframe = p.keyframe
            pkt.stream = stream
            container.mux(pkt)
            self.size += len(p.data)
        self.frames += len(placed)
        return Locator(self.loc.chunk_index, self.loc.file_index), before

    def _add_reencoded(self, episode_index: int, path: Path, rows: int) -> tuple[Locator, int]:
        """Re-encode only this episode (no B-frames: it fits any decode clock), then place it."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_dir / f"{self.key}-{episode_index:06d}.mp4"
        enc = VideoEncoder(tmp, self.width, self.height, self.fps, self.reencode)
        try:
            for frame in iter_frames(path):
                enc.add(frame)
            n = enc.close()
        except VideoError as exc:
            enc.abort()
            raise ExportError(f"{self._name(episode_index, path)}: re-encoding {self.key} failed "
                              f"({str(exc).replace(str(path), 'the file')})") from exc
        if n != rows:
            raise ExportError(f"{self._name(episode_index, path)}: {self.key} video decodes to {n} frames, "
                              f"the table has {rows} rows")
        self.reencoded.append(episode_index)
        import av

        try:
            with av.open(str(tmp)) as src:
                s = src.streams.video[0]
                params, tb, pkts = codec_params(s), Fraction(s.time_base or Fraction(1, self.fps)), packets_of(src, s)
            if params != self.params:
                # Still not joinable (the shard came from other encoder settings): new shard.
                log.warning("%s %s: codec parameters differ from the open shard; starting a new one",
                            self.key, self._name(episode_index, path))
                self.close()
                self._open(tmp, params)
                self.only_reencoded = True
            try:
                return self._mux(self._place(pkts, tb, rows, episode_index, path))
            except NotPlaceable as exc:  # our own encoder's output: a bug, not the source's fault
                raise ExportError(f"{self._name(episode_index, path)}: the re-encoded {self.key} video "
                                  f"cannot be placed ({exc})") from exc
        finally:
            tmp.unlink(missing_ok=True)
