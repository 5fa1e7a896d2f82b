"""Automatic quality checks of one captured episode: the live driver of eva_export.quality.

An ``EpisodeChecker`` is fed while the episode is recorded (every received message, every
grid slot with the row written for it) and ``finish`` turns what it saw into the row fields
the dataset keeps: ``quality`` ("green" when there is no issue of severity "error", else
"red"), ``quality_issues`` (``[{code, severity, detail, ...}]``) and ``stream_stats``
(``{name: {received, rate_hz, max_gap_s, dropped, late, jitter_p50_ms, jitter_p99_ms, max_gap_ms,
time_base}}`` when the aligner's per-stream timing is given: ``dropped`` counts grid slots no
message of the stream was stamped for, ``late`` messages that arrived after their slot was
final — late is not lost and never makes an episode red by itself).

The data rules (too_short, non_finite, vector_dimension_change, non_monotonic_clock,
duplicate_timestamp, frozen_camera, video_frame_count_mismatch and the kinematic rules) are
``eva_export.quality.judge.evaluate``, the code ``eva-export check`` runs on files; the checker
only collects their evidence. Transport rules only capture can see stay here: dropped_frames,
camera_skew, missing_stream, image_shape_change, intake_overflow, source_damaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..formats.common.records import Quality, QualityIssue, Severity
from ..quality import judge, rules
from ..quality.rules import CameraSeries, EpisodeEvidence, MessageStamps, Thresholds, VectorSeries
from .align_types import Slot, StreamTiming

#: Fraction of slots whose camera-to-camera stamp skew may exceed the tolerance before red.
SKEW_FRACTION = 0.05
#: A stream silent for longer than this (or MISSING_PERIODS grid periods) is "missing".
MISSING_GAP_S = 0.5
MISSING_PERIODS = 5
#: A vector row held over this many dropped slots is no evidence for the kinematic rules
#: (a stream that went quiet would otherwise look frozen, and its return like a jump).
HELD_ROWS = 3

CODES = ("too_short", "dropped_frames", "camera_skew", "frozen_camera", "missing_stream",
         "image_shape_change", "vector_dimension_change", "non_finite", "non_monotonic_clock",
         "duplicate_timestamp", "video_frame_count_mismatch", "intake_overflow", "source_damaged",
         "frozen_signal", "idle_start", "idle_end", "stuck_joint", "spike", "saturation")


@dataclass
class StreamCounters:
    name: str
    is_camera: bool
    received: int = 0
    first_recv: float | None = None
    last_recv: float | None = None
    max_gap_s: float = 0.0
    dropped: int = 0
    shapes: dict[str, int] = field(default_factory=dict)
    overflow: int = 0
    max_latency_s: float | None = None  # receive time minus header stamp (same host clock)
    # evidence for the shared rules
    stamps: list[float] = field(default_factory=list)
    stamp_recv: list[float] = field(default_factory=list)  # receive time of each stamped message
    rejected: list[tuple[float, int, str]] = field(default_factory=list)  # (receive time, width, why)
    anchor: tuple[int, float] | None = None  # (row, receive time) of the stream's first placed message
    values: list[Any] = field(default_factory=list)  # vector rows
    valid: list[bool] = field(default_factory=list)
    age: int = 0  # slots since the held vector was fresh
    change: list[float] = field(default_factory=list)  # camera rows: rules.frame_change
    last_sig: Any = None
    last_img: Any = None

    def rate_hz(self) -> float:
        if self.received < 2 or self.first_recv is None or self.last_recv is None:
            return 0.0
        span = self.last_recv - self.first_recv
        return (self.received - 1) / span if span > 0 else 0.0

    def add_row(self, value: Any, repeat: bool) -> None:
        """The value written for this stream in one row (None: the placeholder)."""
        if self.is_camera:
            if value is None or repeat or value is self.last_img:
                # a held or placeholder frame is no evidence: a camera that drops or stops is
                # dropped_frames / missing_stream, not frozen
                self.change.append(float("nan"))
                return
            sig = rules.signature(value)
            self.change.append(rules.frame_change(self.last_sig, sig))
            self.last_sig, self.last_img = sig, value
            return
        self.age = self.age + 1 if repeat else 0
        self.values.append(value)
        self.valid.append(value is not None and self.age < HELD_ROWS)


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
                 camera_skew_tolerance_s: float = 0.0, wall_offset: float | None = None,
                 widths: Sequence[int] | None = None, dim_names: Sequence[Sequence[str]] | None = None) -> None:
        self.streams = [StreamCounters(n, c) for n, c in zip(names, cameras, strict=True)]
        self.fps = float(fps)
        self.start = start
        self.min_frames = min_frames
        self.max_drop_ratio = max_drop_ratio
        self.thresholds = Thresholds(min_frames=min_frames, frozen_frames=max(2, frozen_frames))
        self.widths = list(widths) if widths is not None else [0] * len(self.streams)
        self.dim_names = [tuple(d) for d in dim_names] if dim_names is not None else [()] * len(self.streams)
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
            s.stamps.append(stamp)
            s.stamp_recv.append(recv)
            if self.wall_offset is not None:
                lat = recv + self.wall_offset - stamp
                s.max_latency_s = lat if s.max_latency_s is None else max(s.max_latency_s, lat)

    def on_dimension(self, i: int, detail: str, width: int = -1) -> None:
        """A vector message of the wrong width (it cannot go into the row: the row holds the last)."""
        s = self.streams[i]
        s.rejected.append((s.last_recv if s.last_recv is not None else self.start, width, detail))

    def on_shape(self, i: int, detail: str) -> None:
        d = self.streams[i].shapes
        d[detail] = d.get(detail, 0) + 1

    def on_source_damage(self, detail: str) -> None:
        """The recording this episode is read from is damaged (a bag cut short by a killed recorder)."""
        self.source_damage.append(detail)

    def on_overflow(self, i: int) -> None:
        self.streams[i].overflow += 1

    # ---- per slot ------------------------------------------------------------------------
    def on_slot(self, slot: Slot, row: Sequence[Any] | None = None) -> None:
        """One grid slot; ``row``: per stream, the value written for it (a vector, an RGB frame,
        or None for the placeholder before the stream's first message)."""
        self.slots += 1
        stamps = []
        for k, (s, pick) in enumerate(zip(self.streams, slot.picks, strict=True)):
            if pick.dropped:
                s.dropped += 1
            elif s.anchor is None and pick.sample is not None:
                s.anchor = (self.slots - 1, pick.sample.recv)
            if s.is_camera and pick.sample is not None and pick.sample.stamp is not None:
                stamps.append(pick.sample.stamp)
            if row is not None:
                s.add_row(row[k], pick.dropped)
        if len(stamps) >= 2:
            skew = max(stamps) - min(stamps)
            self.worst_skew_s = max(self.worst_skew_s, skew)
            if skew > self.skew_tol:
                self.skewed_slots += 1

    # ---- verdict -------------------------------------------------------------------------
    def evidence(self, rows: int, video_frames: dict[str, int] | None = None) -> EpisodeEvidence:
        """What the shared rules judge: the rows as written, the messages' stamps."""
        vectors: list[VectorSeries] = []
        cameras: list[CameraSeries] = []
        messages: list[MessageStamps] = []
        for k, s in enumerate(self.streams):
            rejected = tuple((int(self._row_at(s, np.array([r]), rows)[0]), w, why) for r, w, why in s.rejected)
            messages.append(MessageStamps(s.name, np.asarray(s.stamps, np.float64),
                                          self._row_at(s, np.asarray(s.stamp_recv, np.float64), rows),
                                          rejected, self.widths[k]))
            if s.is_camera:
                frames = (video_frames or {}).get(s.name)
                cameras.append(CameraSeries(s.name, np.asarray(s.change, np.float64), frames))
            elif s.values:
                width = next((len(v) for v in s.values if v is not None), 0)
                vals = np.array([np.full(width, np.nan) if v is None else np.asarray(v, np.float64)
                                 for v in s.values]).reshape(len(s.values), width)
                vectors.append(VectorSeries(s.name, vals, valid=np.asarray(s.valid, bool),
                                            dim_names=self.dim_names[k]))
        return EpisodeEvidence(self.fps, rows, None, tuple(vectors), tuple(cameras), tuple(messages))

    def finish(self, rows: int, stop: float, video_frames: dict[str, int] | None = None,
               timing: Sequence[StreamTiming] | None = None) -> QualityResult:
        """The verdict. ``video_frames`` maps camera stream names to encoded frame counts;
        ``timing`` is the aligner's per-stream evidence (its drop counts replace the per-slot
        ones, because a late message takes back the drop of its slot)."""
        if timing is not None:
            for s, tm in zip(self.streams, timing, strict=True):
                s.dropped = tm.dropped
        issues = self._transport(rows, stop, timing)
        found = judge.evaluate(self.evidence(rows, video_frames), self.thresholds)
        issues += [f.issue("live") for f in found]
        quality = Quality.RED if any(i.severity == Severity.ERROR for i in issues) else Quality.GREEN
        return QualityResult(quality, issues, self._stats(stop, timing))

    def _transport(self, rows: int, stop: float, timing: Sequence[StreamTiming] | None) -> list[QualityIssue]:
        """The rules only capture can judge: what the streams did on the wire."""
        issues: list[QualityIssue] = []

        def add(code: str, detail: str) -> None:
            issues.append(QualityIssue(code, Severity.ERROR, detail, {"source": "live"}))

        over = {s.name: s.dropped for s in self.streams if s.dropped and rows and s.dropped / rows > self.max_drop_ratio}
        if over:
            cams = ", ".join(f"{n}: {d}/{rows}" for n, d in over.items() if self._stream(n).is_camera)
            vecs = ", ".join(f"{n}: {d}/{rows}" for n, d in over.items() if not self._stream(n).is_camera)
            parts = [p for p in (f"cameras {cams}" if cams else "", f"streams {vecs}" if vecs else "") if p]
            late = sum(t.late for t in timing) if timing is not None else 0
            add("dropped_frames", f"dropped grid slots ({'; '.join(parts)}); allowed ratio {self.max_drop_ratio}"
                + (f"; {late} late messages were not counted as drops" if late else ""))
        if self.slots and self.skewed_slots / self.slots > SKEW_FRACTION:
            add("camera_skew", f"camera header stamps differ by more than {self.skew_tol:.4f} s in "
                               f"{self.skewed_slots}/{self.slots} slots (worst {self.worst_skew_s:.4f} s)")
        limit_gap = max(MISSING_GAP_S, MISSING_PERIODS / self.fps)
        for i, s in enumerate(self.streams):
            tail = stop - (s.last_recv if s.last_recv is not None else self.start)
            inner = s.max_gap_s
            if timing is not None and timing[i].time_base == "stamp":
                # on the sensor's own clock: messages delivered late in a burst (a busy host)
                # are no silence; the first one placed by its stamp with the least delivery delay
                off = min((r - t for r, t in zip(s.stamp_recv, s.stamps, strict=True)), default=0.0)
                first = s.stamps[0] + off - self.start if s.stamps else stop - self.start
                inner = max(first, timing[i].max_gap_ms / 1e3)
            gap = max(inner, tail)
            if s.received == 0:
                add("missing_stream", f"{s.name}: no message received during the episode")
            elif gap > limit_gap:
                where = "stopped before STOP" if tail >= inner else "went silent"
                add("missing_stream", f"{s.name}: {where} for {gap:.3f} s (limit {limit_gap:.3f} s)")
            for detail, n in s.shapes.items():
                add("image_shape_change", f"{s.name}: {detail} ({n} messages)")
            if s.overflow:
                add("intake_overflow", f"{s.name}: {s.overflow} messages lost because the capture "
                                       f"queue was full (host too slow)")
        for detail in self.source_damage:
            add("source_damaged", detail)
        return issues

    def _stats(self, stop: float, timing: Sequence[StreamTiming] | None) -> dict[str, dict[str, Any]]:
        stats: dict[str, dict[str, Any]] = {
            s.name: {"received": s.received, "rate_hz": round(s.rate_hz(), 3),
                     "max_gap_s": round(max(s.max_gap_s, stop - (s.last_recv or self.start)), 4),
                     "dropped": s.dropped}
            for s in self.streams}
        timings: list[StreamTiming | None] = list(timing) if timing else [None] * len(self.streams)
        for s, st in zip(self.streams, timings, strict=True):
            if st is not None:
                stats[s.name].update(st.to_stats())
            if s.max_latency_s is not None:
                stats[s.name]["max_latency_s"] = round(s.max_latency_s, 4)
        return stats

    def _row_at(self, s: StreamCounters, recv: NDArray[np.float64], rows: int) -> NDArray[np.int64]:
        """The rows messages received at ``recv`` went into (estimated on the receive clock from
        the stream's first placed message; the aligner places by source time)."""
        row0, recv0 = s.anchor if s.anchor is not None else (0, self.start)
        est = row0 + np.round((recv - recv0) * self.fps)
        return np.clip(est, 0, max(rows - 1, 0)).astype(np.int64)

    def _stream(self, name: str) -> StreamCounters:
        return next(s for s in self.streams if s.name == name)
