"""Automatic quality checks of one captured episode.

An ``EpisodeChecker`` is fed while the episode is recorded (every received message, every
grid slot) and ``finish`` turns what it saw into the row fields the dataset keeps:
``quality`` ("green" when there is no issue of severity "error", else "red"),
``quality_issues`` (``[{code, severity, detail}]``) and ``stream_stats``
(``{name: {received, rate_hz, max_gap_s, dropped, late, jitter_p50_ms, jitter_p99_ms, max_gap_ms,
time_base}}`` when the aligner's per-stream timing is given: ``dropped`` counts grid slots no
message of the stream was stamped for, ``late`` messages that arrived after their slot was
final — late is not lost and never makes an episode red by itself).

Codes: too_short, dropped_frames, camera_skew, frozen_camera, missing_stream,
image_shape_change, vector_dimension_change, non_finite, non_monotonic_clock,
video_frame_count_mismatch, intake_overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dataset.records import Quality, QualityIssue, Severity
from .align import Slot, StreamTiming

#: Fraction of slots whose camera-to-camera stamp skew may exceed the tolerance before red.
SKEW_FRACTION = 0.05
#: A stream silent for longer than this (or MISSING_PERIODS grid periods) is "missing".
MISSING_GAP_S = 0.5
MISSING_PERIODS = 5

CODES = ("too_short", "dropped_frames", "camera_skew", "frozen_camera", "missing_stream",
         "image_shape_change", "vector_dimension_change", "non_finite", "non_monotonic_clock",
         "video_frame_count_mismatch", "intake_overflow")


@dataclass
class StreamCounters:
    name: str
    is_camera: bool
    received: int = 0
    first_recv: float | None = None
    last_recv: float | None = None
    max_gap_s: float = 0.0
    dropped: int = 0
    last_stamp: float | None = None
    clock_back: int = 0
    worst_back_s: float = 0.0
    non_finite: int = 0
    dims: dict[str, int] = field(default_factory=dict)  # detail -> count
    shapes: dict[str, int] = field(default_factory=dict)
    last_hash: Any = None
    run: int = 1
    max_run: int = 1
    overflow: int = 0
    max_latency_s: float | None = None  # receive time minus header stamp (same host clock)

    def rate_hz(self) -> float:
        if self.received < 2 or self.first_recv is None or self.last_recv is None:
            return 0.0
        span = self.last_recv - self.first_recv
        return (self.received - 1) / span if span > 0 else 0.0


@dataclass(frozen=True)
class QualityResult:
    quality: str
    issues: list[QualityIssue]
    stream_stats: dict[str, dict[str, Any]]

    @property
    def codes(self) -> list[str]:
        return [i.code for i in self.issues]

    def row_extra(self) -> dict[str, Any]:
        return {"quality": self.quality, "quality_issues": [i.to_dict() for i in self.issues],
                "stream_stats": self.stream_stats}


class EpisodeChecker:
    """Collects the evidence of one episode. Fed from a single worker thread."""

    def __init__(self, names: Sequence[str], cameras: Sequence[bool], *, fps: float, start: float,
                 min_frames: int = 10, max_drop_ratio: float = 0.0, frozen_frames: int = 15,
                 camera_skew_tolerance_s: float = 0.0, wall_offset: float | None = None) -> None:
        self.streams = [StreamCounters(n, c) for n, c in zip(names, cameras, strict=True)]
        self.fps = float(fps)
        self.start = start
        self.min_frames = min_frames
        self.max_drop_ratio = max_drop_ratio
        self.frozen_frames = max(2, frozen_frames)
        self.skew_tol = camera_skew_tolerance_s if camera_skew_tolerance_s > 0 else 1.0 / self.fps
        self.wall_offset = wall_offset
        self.slots = 0
        self.skewed_slots = 0
        self.worst_skew_s = 0.0
        self.source_damage: list[str] = []  # ingest: the recording is damaged (truncated bag ...)

    # ---- per message --------------------------------------------------------------------
    def on_message(self, i: int, recv: float, stamp: float | None) -> None:
        s = self.streams[i]
        s.received += 1
        prev = s.last_recv if s.last_recv is not None else self.start
        s.max_gap_s = max(s.max_gap_s, recv - prev)
        if s.first_recv is None:
            s.first_recv = recv
        s.last_recv = recv
        if stamp is not None:
            if s.last_stamp is not None and stamp < s.last_stamp:
                s.clock_back += 1
                s.worst_back_s = max(s.worst_back_s, s.last_stamp - stamp)
            s.last_stamp = stamp
            if self.wall_offset is not None:
                lat = recv + self.wall_offset - stamp
                s.max_latency_s = lat if s.max_latency_s is None else max(s.max_latency_s, lat)

    def on_non_finite(self, i: int) -> None:
        self.streams[i].non_finite += 1

    def on_dimension(self, i: int, detail: str) -> None:
        d = self.streams[i].dims
        d[detail] = d.get(detail, 0) + 1

    def on_shape(self, i: int, detail: str) -> None:
        d = self.streams[i].shapes
        d[detail] = d.get(detail, 0) + 1

    def on_fingerprint(self, i: int, fingerprint: Any) -> None:
        """A cheap hash of each received camera frame (identical frames -> identical hash)."""
        s = self.streams[i]
        if s.last_hash is not None and fingerprint == s.last_hash:
            s.run += 1
            s.max_run = max(s.max_run, s.run)
        else:
            s.run = 1
        s.last_hash = fingerprint

    def on_source_damage(self, detail: str) -> None:
        """The recording this episode is read from is damaged (a bag cut short by a killed recorder)."""
        self.source_damage.append(detail)

    def on_overflow(self, i: int) -> None:
        self.streams[i].overflow += 1

    # ---- per slot ------------------------------------------------------------------------
    def on_slot(self, slot: Slot) -> None:
        self.slots += 1
        stamps = []
        for s, pick in zip(self.streams, slot.picks, strict=True):
            if pick.dropped:
                s.dropped += 1
            if s.is_camera and pick.sample is not None and pick.sample.stamp is not None:
                stamps.append(pick.sample.stamp)
        if len(stamps) >= 2:
            skew = max(stamps) - min(stamps)
            self.worst_skew_s = max(self.worst_skew_s, skew)
            if skew > self.skew_tol:
                self.skewed_slots += 1

    # ---- verdict -------------------------------------------------------------------------
    def finish(self, rows: int, stop: float, video_frames: dict[str, int] | None = None,
               timing: Sequence[StreamTiming] | None = None) -> QualityResult:
        """The verdict. ``video_frames`` maps camera stream names to encoded frame counts;
        ``timing`` is the aligner's per-stream evidence (its drop counts replace the per-slot
        ones, because a late message takes back the drop of its slot)."""
        issues: list[QualityIssue] = []
        if timing is not None:
            for s, tm in zip(self.streams, timing, strict=True):
                s.dropped = tm.dropped

        def add(code: str, detail: str) -> None:
            issues.append(QualityIssue(code, Severity.ERROR, detail))

        if rows < self.min_frames:
            add("too_short", f"{rows} frames, fewer than min_frames={self.min_frames}")
        dropped = {s.name: s.dropped for s in self.streams if s.dropped}
        over = {n: d for n, d in dropped.items() if rows and d / rows > self.max_drop_ratio}
        if over:
            cams = ", ".join(f"{n}: {d}/{rows}" for n, d in over.items()
                             if self._stream(n).is_camera)
            vecs = ", ".join(f"{n}: {d}/{rows}" for n, d in over.items()
                             if not self._stream(n).is_camera)
            parts = [p for p in (f"cameras {cams}" if cams else "", f"streams {vecs}" if vecs else "") if p]
            late = sum(t.late for t in timing) if timing is not None else 0
            add("dropped_frames", f"dropped grid slots ({'; '.join(parts)}); allowed ratio "
                                  f"{self.max_drop_ratio}" + (f"; {late} late messages were not counted as "
                                                              f"drops" if late else ""))
        if self.slots and self.skewed_slots / self.slots > SKEW_FRACTION:
            add("camera_skew", f"camera header stamps differ by more than {self.skew_tol:.4f} s in "
                               f"{self.skewed_slots}/{self.slots} slots (worst {self.worst_skew_s:.4f} s)")
        limit_gap = max(MISSING_GAP_S, MISSING_PERIODS / self.fps)
        for s in self.streams:
            if s.is_camera and s.max_run >= self.frozen_frames:
                add("frozen_camera", f"{s.name}: {s.max_run} identical consecutive frames "
                                     f"(limit {self.frozen_frames})")
            tail = stop - (s.last_recv if s.last_recv is not None else self.start)
            gap = max(s.max_gap_s, tail)
            if s.received == 0:
                add("missing_stream", f"{s.name}: no message received during the episode")
            elif gap > limit_gap:
                where = "stopped before STOP" if tail >= s.max_gap_s else "went silent"
                add("missing_stream", f"{s.name}: {where} for {gap:.3f} s (limit {limit_gap:.3f} s)")
            for detail, n in s.shapes.items():
                add("image_shape_change", f"{s.name}: {detail} ({n} messages)")
            for detail, n in s.dims.items():
                add("vector_dimension_change", f"{s.name}: {detail} ({n} messages)")
            if s.non_finite:
                add("non_finite", f"{s.name}: {s.non_finite} messages with NaN or inf")
            if s.clock_back:
                add("non_monotonic_clock", f"{s.name}: header stamp went back {s.clock_back} times "
                                           f"(worst {s.worst_back_s:.4f} s)")
            if s.overflow:
                add("intake_overflow", f"{s.name}: {s.overflow} messages lost because the capture "
                                       f"queue was full (host too slow)")
        for detail in self.source_damage:
            add("source_damaged", detail)
        for name, n in (video_frames or {}).items():
            if n != rows:
                add("video_frame_count_mismatch", f"{name}: {n} video frames for {rows} rows")
        stats = {s.name: {"received": s.received, "rate_hz": round(s.rate_hz(), 3),
                          "max_gap_s": round(max(s.max_gap_s, stop - (s.last_recv or self.start)), 4),
                          "dropped": s.dropped}
                 for s in self.streams}
        timings: list[StreamTiming | None] = list(timing) if timing else [None] * len(self.streams)
        for s, st in zip(self.streams, timings, strict=True):
            if st is not None:
                stats[s.name].update(st.to_stats())
            if s.max_latency_s is not None:
                stats[s.name]["max_latency_s"] = round(s.max_latency_s, 4)
        quality = Quality.RED if any(i.severity == Severity.ERROR for i in issues) else Quality.GREEN
        return QualityResult(quality, issues, stats)

    def _stream(self, name: str) -> StreamCounters:
        return next(s for s in self.streams if s.name == name)
