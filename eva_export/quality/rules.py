"""The quality rules of one episode, shared by live capture and the offline check (pure numpy).

Both drivers reduce an episode to the same ``EpisodeEvidence``: per-row arrays (the rows the
dataset holds) plus, live, the header stamps and rejected widths of the received messages.
``judge.evaluate`` turns it into ``Finding`` records; nothing else in the project decides these codes.
Live capture (capture/checks.py) feeds it while recording; ``eva-export check`` (offline.py)
feeds it from the files. Every threshold is a field of ``Thresholds`` (docs/quality_rules.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..formats.common.records import QualityIssue, Severity

#: Recorded with every verdict; bump when a rule or a default threshold changes.
RULE_VERSION = "2"

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class Thresholds:
    """Every rule's knob, with the documented default."""

    min_frames: int = 10  # too_short: fewer rows
    frozen_frames: int = 15  # frozen_camera: this many consecutive unchanged frames
    still_levels: float = 0.0  # "unchanged": mean sampled-pixel change at most this (0-255)
    gap_periods: float = 1.5  # timestamp_gap: a row step longer than this many periods
    grid_tolerance_s: float = 1e-4  # off_grid_timestamp: |t - k/fps| above this (LeRobot's)
    frozen_s: float = 2.0  # frozen_signal / idle_start / idle_end: every dimension unchanged
    stuck_s: float = 2.0  # stuck_joint: one dimension unchanged while another moves
    spike_k: float = 8.0  # spike: |second difference - local median| > k * local scale
    spike_window: int = 31  # rows of the local scale (median / MAD window)
    saturation_frames: int = 5  # saturation: rows pinned at the episode's extreme value
    moving_fraction: float = 0.5  # "moving": a step above this fraction of its own median step


#: The offline driver reads the luma of decoded lossy video, where a frozen camera's frames
#: differ by the encoder's refinements (corpus, H.264 crf 18: mean change <= 0.35 levels while
#: frozen, >= 1.5 for its slowest moving texture); live frames repeat exactly (0).
OFFLINE_THRESHOLDS = Thresholds(still_levels=0.75)


@dataclass(frozen=True)
class VectorSeries:
    """One vector feature (state, action, ...): one value row per dataset row."""

    name: str
    values: F64  # (rows, dims); NaN where a row carried no value of the expected width
    widths: I64 = field(default_factory=lambda: np.zeros(0, np.int64))  # per row, offline only
    valid: NDArray[np.bool_] | None = None  # rows holding a real sample (live: not a placeholder)
    dim_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class CameraSeries:
    """One camera: per-row change against the previous row (``frame_change``), and frame counts."""

    name: str
    change: F64  # (rows,); inf for the first frame, NaN for a row that is no evidence (held)
    video_frames: int | None = None  # encoded / decoded frame count (None: not known)


@dataclass(frozen=True)
class MessageStamps:
    """Live only: header stamps of one stream's received messages and the row each falls in."""

    name: str
    stamps: F64
    frames: I64
    rejected: tuple[tuple[int, int, str], ...] = ()  # (row, width, why) of wrong-width messages
    expected_width: int = 0


@dataclass(frozen=True)
class EpisodeEvidence:
    fps: float
    rows: int
    timestamps: F64 | None = None  # the table's timestamp column (offline); None live (on grid)
    vectors: tuple[VectorSeries, ...] = ()
    cameras: tuple[CameraSeries, ...] = ()
    messages: tuple[MessageStamps, ...] = ()


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # Severity
    stream: str
    detail: str
    ranges: tuple[tuple[int, int], ...] = ()  # inclusive frame ranges

    def issue(self, source: str) -> QualityIssue:
        extra: dict[str, object] = {"stream": self.stream, "source": source, "rule_version": RULE_VERSION}
        if self.ranges:
            extra["ranges"] = [[a, b] for a, b in self.ranges]
        return QualityIssue(self.code, self.severity, self.detail, extra)

    @property
    def key(self) -> tuple[str, str, tuple[tuple[int, int], ...]]:
        return self.code, self.stream, self.ranges


def error(code: str, stream: str, detail: str, ranges: list[tuple[int, int]] | None = None) -> Finding:
    return Finding(code, Severity.ERROR, stream, detail, tuple(ranges or ()))


def warning(code: str, stream: str, detail: str, ranges: list[tuple[int, int]] | None = None) -> Finding:
    return Finding(code, Severity.WARNING, stream, detail, tuple(ranges or ()))


# ---- helpers ------------------------------------------------------------------------------------
def runs(mask: NDArray[np.bool_]) -> list[tuple[int, int]]:
    """Inclusive [first, last] index ranges where ``mask`` is True."""
    if mask.size == 0:
        return []
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def spans(ranges: list[tuple[int, int]], limit: int = 5) -> str:
    text = ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in ranges[:limit])
    return text + (f" and {len(ranges) - limit} more" if len(ranges) > limit else "")


def signature(img: NDArray[np.uint8]) -> NDArray[np.int16]:
    """A strided pixel sample of a frame (about 64 x 48, RGB live, luma offline), cheap enough
    for every live row."""
    h, w = img.shape[:2]
    sy, sx = max(1, h // 48), max(1, w // 64)
    return img[::sy, ::sx].astype(np.int16)


def frame_change(prev: NDArray[np.int16] | None, cur: NDArray[np.int16]) -> float:
    """Mean sampled-pixel difference: exactly 0 for a frozen camera's repeated buffer (live),
    below a level for its frames decoded from lossy video (the encoder keeps refining them)."""
    if prev is None or prev.shape != cur.shape:
        return float("inf")
    return float(np.mean(np.abs(cur - prev))) if cur.size else 0.0


# ---- rules on rows and stamps -------------------------------------------------------------------
def timestamp_rules(name: str, t: F64, frames: I64, fps: float, th: Thresholds, *,
                    on_grid: bool) -> list[Finding]:
    """Non-monotonic and duplicate stamps; on a grid (the table's timestamps) also gaps and
    off-grid values. ``frames``: the row each stamp belongs to."""
    out: list[Finding] = []
    if t.size == 0:
        return out
    d = np.diff(t)
    back = np.flatnonzero(d < 0)
    if back.size:
        out.append(error("non_monotonic_clock", name, f"{name}: timestamp went back {back.size} times "
                         f"(worst {float(-d[back].min()):.4f} s)", _at(frames, back + 1)))
    dup = np.flatnonzero(d == 0)
    if dup.size:
        out.append(error("duplicate_timestamp", name, f"{name}: {dup.size} rows repeat the previous "
                         "timestamp", _at(frames, dup + 1)))
    if not on_grid:
        return out
    period = 1.0 / fps
    gap = np.flatnonzero(d > th.gap_periods * period)
    if gap.size:
        out.append(error("timestamp_gap", name, f"{name}: {gap.size} gaps longer than "
                         f"{th.gap_periods} periods (longest {float(d[gap].max()):.4f} s)",
                         [(int(frames[g]), int(frames[g + 1])) for g in gap]))
    off = np.abs(t - np.round(t * fps) / fps) > th.grid_tolerance_s
    if off.any():
        out.append(error("off_grid_timestamp", name, f"{name}: {int(off.sum())} timestamps off the "
                         f"1/{fps:g} s grid by more than {th.grid_tolerance_s} s", _at(frames, np.flatnonzero(off))))
    return out


def _at(frames: I64, idx: NDArray[np.intp]) -> list[tuple[int, int]]:
    """Ranges of the rows named by message indices ``idx`` (consecutive rows merged)."""
    rows = np.unique(frames[idx])
    if rows.size == 0:
        return []
    mask = np.zeros(int(rows.max()) + 1, bool)
    mask[rows] = True
    return runs(mask)


def vector_row_rules(v: VectorSeries) -> list[Finding]:
    out: list[Finding] = []
    dims = v.values.shape[1] if v.values.ndim == 2 else 0
    if v.widths.size:
        bad = v.widths != dims
        if bad.any():
            got = sorted({int(w) for w in v.widths[bad]})
            out.append(error("vector_dimension_change", v.name, f"{v.name}: {int(bad.sum())} rows with "
                             f"{got} values, {dims} declared", runs(bad)))
    present = np.ones(v.values.shape[0], bool) if not v.widths.size else v.widths == dims
    nonfin = ~np.all(np.isfinite(v.values), axis=1) & present if dims else np.zeros(0, bool)
    if nonfin.any():
        out.append(error("non_finite", v.name, f"{v.name}: {int(nonfin.sum())} rows with NaN or inf",
                         runs(nonfin)))
    return out


def message_rules(m: MessageStamps, fps: float, th: Thresholds) -> list[Finding]:
    out = timestamp_rules(m.name, m.stamps, m.frames, fps, th, on_grid=False)
    if m.rejected:
        why = m.rejected[0][2] or f"{m.rejected[0][1]} values, {m.expected_width} configured"
        mask = np.zeros(max(f for f, _, _ in m.rejected) + 1, bool)
        mask[[f for f, _, _ in m.rejected]] = True
        out.append(error("vector_dimension_change", m.name, f"{m.name}: {why} ({len(m.rejected)} messages)",
                         runs(mask)))
    return out


def camera_rules(c: CameraSeries, rows: int, th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    known = np.flatnonzero(~np.isnan(c.change))  # NaN: a held frame (live), neither evidence nor a break
    still = c.change[known] <= th.still_levels
    # a run of k unchanged frames means k + 1 identical frames, from the one before the run
    long = [(int(known[a - 1]) if a else int(known[a]), int(known[b])) for a, b in runs(still)
            if b - a + 2 >= th.frozen_frames]
    if long:
        worst = max(b - a + 1 for a, b in long)
        out.append(error("frozen_camera", c.name, f"{c.name}: {worst} identical consecutive frames "
                         f"(limit {th.frozen_frames})", long))
    if c.video_frames is not None and c.video_frames != rows:
        out.append(error("video_frame_count_mismatch", c.name, f"{c.name}: {c.video_frames} video frames "
                         f"for {rows} rows"))
    return out
