"""Kinematic rules on one vector feature (state, action): frozen, stuck joint, spike, saturation.

Every rule judges a signal against its own motion, so that ramps, sinusoids (up to the frame
rate), constant velocity, a gripper held closed, an arm at rest and sensor noise never trip it:

* ``frozen_signal`` (error): every dimension unchanged (within a few float32 ulps) for at least
  ``frozen_s`` while the episode moves before and after; at the very start or end it is
  ``idle_start`` / ``idle_end`` (warning). An episode that never moves gets nothing: an arm at
  rest is a valid recording, and too_short still applies.
* ``stuck_joint`` (error): one dimension unchanged for ``stuck_s`` while another moves, entered
  and left while moving (a stuck encoder freezes mid-motion and catches up); a gripper that
  settles and holds is entered at rest and is not stuck.
* ``spike`` (error): the second difference deviates from its local median by more than
  ``spike_k`` times the local scale: the larger of the MAD of the second difference and the
  90th percentile of the step size, in a ``spike_window``-row window. A velocity kink or a fast
  sinusoid moves the scale with it; a one-frame blip or a jump does not.
* ``saturation`` (error): at least two plateaus of ``saturation_frames`` rows pinned at the
  dimension's episode extreme, each entered and left while moving (a clipped motion).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from .rules import F64, Finding, Thresholds, VectorSeries, error, runs, spans, warning

#: Minimum rows of a segment the rules look at (second differences need a neighbourhood).
MIN_ROWS = 5
#: A step this many times a dimension's median step leaving a constant stretch is a catch-up.
CATCH_UP = 3.0


def kinematic_rules(v: VectorSeries, fps: float, th: Thresholds, breaks: NDArray[np.intp] | None = None
                    ) -> list[Finding]:
    """The four rules on every segment of ``v`` (split at invalid rows and at ``breaks``: the rows
    after a timestamp gap), with frames counted from the episode's first row."""
    x = np.asarray(v.values, np.float64)
    if x.ndim != 2 or x.shape[0] < MIN_ROWS or x.shape[1] == 0:
        return []
    ok = np.ones(x.shape[0], bool) if v.valid is None else np.asarray(v.valid, bool).copy()
    if v.widths.size:
        ok &= v.widths == x.shape[1]
    ok &= np.all(np.isfinite(x), axis=1)
    out: list[Finding] = []
    n = x.shape[0]
    for a, b in _segments(ok, breaks):
        seg = x[a:b + 1]
        if seg.shape[0] < MIN_ROWS:
            continue
        out += _frozen(v.name, seg, a, n, fps, th)
        out += _stuck(v, seg, a, fps, th)
        out += _spikes(v, seg, a, th)
        out += _saturation(v, seg, a, th)
    return _merge(_without_catch_ups(out))


def _without_catch_ups(found: list[Finding]) -> list[Finding]:
    """Drop the spikes that are the catch-up at the end of a frozen or stuck stretch (one fault,
    reported once, by the rule that names it)."""
    ends = [(f.stream, b) for f in found if f.code in ("frozen_signal", "stuck_joint", "idle_start")
            for _, b in f.ranges]
    out: list[Finding] = []
    for f in found:
        if f.code == "spike":
            base = f.stream.split("[")[0]
            keep = tuple(r for r in f.ranges if not any(s in (f.stream, base) and r[0] - 1 <= b <= r[1] + 1
                                                        for s, b in ends))
            if not keep:
                continue
            f = Finding(f.code, f.severity, f.stream, f.detail, keep)
        out.append(f)
    return out


def _segments(ok: NDArray[np.bool_], breaks: NDArray[np.intp] | None) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    starts = set() if breaks is None else {int(b) for b in breaks}
    for a, b in runs(ok):
        cuts = sorted(s for s in starts if a < s <= b)
        edges = [a, *cuts, b + 1]
        out += [(s, e - 1) for s, e in pairwise(edges)]
    return out


def _eps(x: F64) -> F64:
    """Per-dimension "unchanged" tolerance: a few float32 ulps of the values' magnitude."""
    mag = np.nanmax(np.abs(x), axis=0) if x.size else np.zeros(x.shape[1])
    return np.asarray(4 * np.spacing(mag.astype(np.float32)).astype(np.float64) + 1e-12)


def _name(v: VectorSeries, j: int) -> str:
    return f"{v.name}[{v.dim_names[j] if j < len(v.dim_names) else j}]"


def _frozen(name: str, x: F64, off: int, n: int, fps: float, th: Thresholds) -> list[Finding]:
    same = np.all(np.abs(np.diff(x, axis=0)) <= _eps(x), axis=1)  # same[t]: row t+1 == row t
    need = max(1, round(th.frozen_s * fps))
    out: list[Finding] = []
    for a, b in runs(same):
        first, last = off + a, off + b + 1
        if b - a + 2 < need or (first == 0 and last == n - 1):
            continue  # short, or an episode that never moves (an arm at rest)
        secs = (b - a + 2) / fps  # rows a..b+1 are equal
        if first == 0:
            out.append(warning("idle_start", name, f"{name}: unchanged for the first {secs:.2f} s",
                               [(first, last)]))
        elif last == n - 1:
            out.append(warning("idle_end", name, f"{name}: unchanged for the last {secs:.2f} s",
                               [(first, last)]))
        else:
            out.append(error("frozen_signal", name, f"{name}: every dimension unchanged for {secs:.2f} s "
                             f"(frames {first}-{last}) while the episode goes on (limit {th.frozen_s} s)",
                             [(first, last)]))
    return out


def _speed(d1: F64) -> float:
    """A dimension's own typical speed: the median of its non-zero step sizes."""
    moving = np.abs(d1[np.abs(d1) > 0])
    return float(np.median(moving)) if moving.size else 0.0


def _moving_at(d1: F64, steps: tuple[int, int], speed: float, th: Thresholds) -> bool:
    """Whether either of two adjacent steps is a moving one: a clipped motion's last step into
    the limit covers only part of a frame, the one before it is whole."""
    vals = [abs(float(d1[i])) for i in steps if 0 <= i < d1.size]
    return bool(vals) and speed > 0 and max(vals) > th.moving_fraction * speed


def _stuck(v: VectorSeries, x: F64, off: int, fps: float, th: Thresholds) -> list[Finding]:
    d = np.diff(x, axis=0)
    same = np.abs(d) <= _eps(x)
    need = max(1, round(th.stuck_s * fps))
    out: list[Finding] = []
    for j in range(x.shape[1]):
        speed = _speed(d[:, j])
        lo, hi = float(np.min(x[:, j])), float(np.max(x[:, j]))
        others = np.delete(same, j, axis=1)
        for a, b in runs(same[:, j]):
            if b - a + 2 < need:  # rows a..b+1 are equal
                continue
            if others.size == 0 or np.mean(~np.all(others[a:b + 1], axis=1)) < 0.5:
                continue  # the others are not moving either (frozen_signal's case)
            entered = _moving_at(d[:, j], (a - 2, a - 1), speed, th)
            # frozen at a turning point, a stuck encoder still shows by catching up with a jump
            caught_up = b + 1 < d.shape[0] and abs(float(d[b + 1, j])) > CATCH_UP * speed
            if x[a, j] in (lo, hi) and not caught_up:
                continue  # pinned at the extreme and left smoothly: saturation's case
            if (entered or caught_up) and _moving_at(d[:, j], (b + 1, b + 2), speed, th):
                first, last = off + a, off + b + 1
                out.append(error("stuck_joint", _name(v, j), f"{_name(v, j)}: unchanged for "
                                 f"{(b - a + 2) / fps:.2f} s (frames {first}-{last}) while other dimensions "
                                 f"move (limit {th.stuck_s} s)", [(first, last)]))
    return out


def _rolling(a: F64, w: int) -> NDArray[np.float64]:
    half = min(w // 2, max(a.size - 1, 0))
    return sliding_window_view(np.pad(a, half, mode="reflect"), 2 * half + 1)


def _spikes(v: VectorSeries, x: F64, off: int, th: Thresholds) -> list[Finding]:
    d1 = np.diff(x, axis=0)
    d2 = np.diff(d1, axis=0)  # d2[i] is centred on row i + 1
    out: list[Finding] = []
    floor = 8 * _eps(x)
    for j in range(x.shape[1]):
        win2 = _rolling(d2[:, j], th.spike_window)
        med = np.median(win2, axis=1)
        mad = 1.4826 * np.median(np.abs(win2 - med[:, None]), axis=1)
        step = np.percentile(_rolling(np.abs(d1[:, j]), th.spike_window), 90, axis=1)
        # the step scale of row i + 1 is the window around steps i and i + 1
        scale = np.maximum(np.maximum(mad, np.maximum(step[:-1], step[1:])), floor[j])
        hit = np.abs(d2[:, j] - med) > th.spike_k * scale
        if not hit.any():
            continue
        ranges = [(off + a + 1, off + b + 1) for a, b in runs(hit)]
        worst = float(np.max(np.abs(d2[hit, j] - med[hit]) / scale[hit]))
        out.append(error("spike", _name(v, j), f"{_name(v, j)}: {len(ranges)} spike(s)/jump(s) at frames "
                         f"{spans(ranges)} (up to {worst:.1f} x the local motion scale, limit {th.spike_k})",
                         ranges))
    return out


def _saturation(v: VectorSeries, x: F64, off: int, th: Thresholds) -> list[Finding]:
    d = np.diff(x, axis=0)
    eps = _eps(x)
    out: list[Finding] = []
    for j in range(x.shape[1]):
        speed = _speed(d[:, j])
        for limit in (float(np.max(x[:, j])), float(np.min(x[:, j]))):
            pinned = np.abs(x[:, j] - limit) <= eps[j]
            plateaus = [(a, b) for a, b in runs(pinned) if b - a + 1 >= th.saturation_frames
                        and _moving_at(d[:, j], (a - 2, a - 1), speed, th)
                        and _moving_at(d[:, j], (b, b + 1), speed, th)]
            if len(plateaus) >= 2:
                ranges = [(off + a, off + b) for a, b in plateaus]
                out.append(error("saturation", _name(v, j), f"{_name(v, j)}: pinned at {limit:.6g} in "
                                 f"{len(plateaus)} plateaus (frames {spans(ranges)}), entered and left while "
                                 "moving", ranges))
    return out


def _merge(found: list[Finding]) -> list[Finding]:
    """One finding per (code, stream): segments of one episode report together."""
    by: dict[tuple[str, str], Finding] = {}
    for f in found:
        k = (f.code, f.stream)
        if k in by:
            old = by[k]
            by[k] = Finding(old.code, old.severity, old.stream, old.detail, old.ranges + f.ranges)
        else:
            by[k] = f
    return list(by.values())
