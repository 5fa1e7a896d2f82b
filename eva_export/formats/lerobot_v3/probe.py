"""One read of each episode MP4 per v3 job: its codec parameters, reorder depth and (small files) packets.

A v3 shard's decode clock must run as far ahead as the reorder lead of every episode it holds,
known when the shard opens (v3_video). ``Probes`` reads each file ``PROBE_WINDOW`` episodes
before the copy reaches it: the shard opens with the largest lead in that window, and an
episode needing more later starts a new shard (it is not re-encoded). A small file
(``KEEP_FILE_BYTES``) that fits the window's byte budget keeps its packets (``Probe.packets``),
which ``VideoShards.add`` copies without opening the file again. Only small files: the open
saved is a few milliseconds, worth keeping a few KB for, not megabytes. Memory is the window
(at most ``PACKET_BUDGET`` of packets), whatever the episode count or length: no probe is
kept for an episode once it is copied (probing every file before the first shard opened held
one per episode, and the budget ran out on long jobs, whose later files were opened twice).

Times are integers in the stream's time base (``num/den`` seconds per tick); the grid and
tolerance tests below are exact integer forms of the Fraction ones (10^5 packets of Fraction
arithmetic cost seconds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..common import mp4_index
from ..common.mp4_sps import avcc_pix_fmt

if TYPE_CHECKING:
    from av.container import InputContainer
    from av.video.stream import VideoStream

DELAY_PROBE_PACKETS = 64
PACKET_BUDGET = 16 * 1024 * 1024  # bytes of packets kept per camera in the window, whatever the episode count
PROBE_WINDOW = 64  # episodes probed ahead of the copy (Probes.next)
KEEP_FILE_BYTES = 1024 * 1024  # larger files are opened again to copy (an open is ~1% of reading them)
TOLERANCE_DEN = 10000  # LeRobotDataset's tolerance_s = 1 / 10000 s


@dataclass(frozen=True)
class CodecParams:
    codec: str
    width: int
    height: int
    pix_fmt: str
    extradata: bytes


class Pkt(NamedTuple):
    """A demuxed packet's bytes and times (stream time base), kept after its file is closed
    (a tuple: a long episode makes one per frame)."""

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


def codec_params(stream: VideoStream) -> CodecParams:
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


def frame_slots(ticks: Iterable[int], tb: Fraction, fps: int) -> list[tuple[int, bool]]:
    """For each of ``ticks`` (since the first frame): the frame number it is closest to, and
    whether it is within LeRobot's tolerance of that frame's time: |ticks*tb - i/fps| <= 1/10000.
    The time base's parts are read once (per packet, they were most of placing a long episode)."""
    num, den = tb.numerator * fps, tb.denominator
    tolerance = den * fps
    out: list[tuple[int, bool]] = []
    for t in ticks:
        x = t * num  # the time in frames, times den
        i = round_div(x, den)
        out.append((i, abs(x - i * den) * TOLERANCE_DEN <= tolerance))
    return out


def lead_of(pts: list[int], tb: Fraction, fps: int) -> int:
    """Frames decoding must run ahead: max over decode position k of k - frame shown k-th."""
    if not pts:
        return 0
    base = min(pts)
    return max(0, max(k - i for k, (i, _) in enumerate(frame_slots([t - base for t in pts], tb, fps))))


def open_input(path: Path) -> InputContainer:
    """``av.open`` for reading; a ``.mp4`` is opened with the MP4 demuxer named, which skips
    FFmpeg's format probe (a fifth of opening a small file). A file that is not what its name
    says is opened again with the probe, as before."""
    import av  # here, not at module import: the plain shape is read and written without PyAV

    if path.suffix.lower() == ".mp4":
        try:
            return av.open(str(path), format="mp4")
        except av.FFmpegError:
            pass
    return av.open(str(path))


def packets_of(container: InputContainer, stream: VideoStream) -> list[Pkt]:
    return [Pkt(bytes(p), p.pts, p.dts, bool(p.is_keyframe)) for p in container.demux(stream) if p.size > 0]


def probe(path: Path, fps: int, keep: bool) -> Probe | None:
    """Read ``path`` once (all packets when ``keep``, else the first few); None when unreadable
    (the copy names the file when it opens it again)."""
    if keep:
        known = index_probe(path, fps)
        if known is not None:
            return known
    import av

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


#: codec_params' name of H.264 (FFmpeg's AV_CODEC_ID_H264, fixed in its ABI; a test compares)
H264_NAME = "id27:video"


def index_probe(path: Path, fps: int) -> Probe | None:
    """A plain MP4's probe read from its boxes (mp4_index: the writer's shape), every packet
    kept, equal to PyAV's open and demux of it (tests/test_v3_probe_index.py compares them);
    None for any other file. A PyAV open was most of a short episode's probe."""
    data = mp4_index.file_bytes(path)
    found = mp4_index.samples(data) if data is not None else None
    if data is None or found is None:
        return None
    try:
        pix_fmt = avcc_pix_fmt(found.avcc)
    except ValueError:
        return None
    if pix_fmt is None:
        return None
    facts, keys = found.facts, found.keyframes
    params = CodecParams(H264_NAME, facts.width, facts.height, pix_fmt, found.avcc)
    tb = Fraction(1, facts.timescale)
    # no composition offsets in the plain shape: each packet's pts is its dts
    kept = tuple(Pkt(data[at:at + n], t, t, keys is None or i in keys)
                 for i, ((at, n), t) in enumerate(zip(found.spans, facts.dts, strict=True)))
    pts = list(facts.dts[:DELAY_PROBE_PACKETS])
    return Probe(params, tb, lead_of(pts, tb, fps), len(data), kept)


class Probes:
    """One camera's probes, read a window of episodes ahead of the copy and handed out once each.

    ``stream`` + ``next``: the exporter's path. Each file is probed ``window`` episodes before it
    is copied, so a shard opening knows the reorder lead of the episodes about to join it (its
    decode clock), and only the window's probes (and kept packets, within the byte budget) are
    in memory, whatever the episode count. ``take_all`` + ``pop``: every file at once."""

    def __init__(self, fps: int, budget: int | None = None, window: int | None = None) -> None:
        self.fps = fps
        self.left = PACKET_BUDGET if budget is None else budget  # read when a job starts (tests set it)
        self.window = PROBE_WINDOW if window is None else window
        self.lead = 0  # take_all: the largest lead seen, in frames
        self._held: dict[int, Probe] = {}
        self._ahead: deque[tuple[int, Path, Probe | None]] = deque()
        self._todo: Iterator[tuple[int, Path]] = iter(())

    def _take(self, path: Path) -> Probe | None:
        try:
            small = path.stat().st_size <= min(self.left, KEEP_FILE_BYTES)
        except OSError:
            return None  # missing: the copy names it
        p = probe(path, self.fps, keep=small)
        self.left -= _kept_bytes(p)
        return p

    def take_all(self, paths: list[tuple[int, Path]]) -> None:
        for episode_index, path in paths:
            p = self._take(path)
            if p is not None:
                self.lead = max(self.lead, p.lead_frames)
                self._held[episode_index] = p

    def pop(self, episode_index: int) -> Probe | None:
        return self._held.pop(episode_index, None)

    def stream(self, paths: Iterable[tuple[int, Path]]) -> None:
        """The (episode, file) pairs ``next`` hands out, in copy order (read lazily)."""
        self._todo = iter(paths)

    def next(self) -> tuple[int, Path, Probe | None, int]:
        """The next episode, its file and probe (None: unreadable), and the largest reorder lead
        (frames) of it and the episodes probed behind it."""
        if len(self._ahead) <= self.window // 2:
            # refilled in runs of files: probing one file between each copy cost three times
            # as much per file as probing many in a row (measured on 1000 4-frame episodes)
            for item in islice(self._todo, self.window - len(self._ahead)):
                self._ahead.append((item[0], item[1], self._take(item[1])))
        episode_index, path, p = self._ahead.popleft()
        self.left += _kept_bytes(p)  # its packets leave the window with it
        lead = max((q.lead_frames for _, _, q in self._ahead if q is not None), default=0)
        return episode_index, path, p, max(lead, p.lead_frames if p is not None else 0)


def _kept_bytes(p: Probe | None) -> int:
    return 0 if p is None or p.packets is None else sum(len(k.data) for k in p.packets)
