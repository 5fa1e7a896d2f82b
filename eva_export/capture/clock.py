"""Per-stream clock offset of the capture grid (the "Time base" part of align.py's rule).

``ClockOffset`` estimates ``recv - stamp`` robustly online and places unstamped messages by
their sample number; ``GridAligner`` (align.py) reads it to place every message on the grid.
"""

from __future__ import annotations

import math
from collections import deque

#: An unstamped message is placed at most this long before its arrival.
UNSTAMPED_HOLD_S = 0.5
_TRACK_STRETCH = 1.02


class ClockOffset:
    """Robust online estimate of ``recv - stamp`` for one stream (clock offset + least delay).

    A running minimum over a sliding window (two blocks of ``window_s``), so slow drift between
    two hosts' clocks is followed. A value more than ``outlier_s`` below the estimate (a stamp
    from the future) is ignored unless ``confirm`` such values come in a row (a clock step).
    """

    def __init__(self, window_s: float = 10.0, outlier_s: float = 0.5, confirm: int = 3) -> None:
        self.window_s = window_s
        self.outlier_s = outlier_s
        self.confirm = confirm
        self._cur = math.inf
        self._prev = math.inf
        self._block_start: float | None = None
        self._suspects = 0
        self.observed = 0
        self._arrivals: deque[float] = deque(maxlen=256)
        self._track: float | None = None

    @property
    def period(self) -> float | None:
        """Mean interval of the recent unstamped arrivals (robust to jitter, not to loss)."""
        a = self._arrivals
        return (a[-1] - a[0]) / (len(a) - 1) if len(a) >= 10 and a[-1] > a[0] else None

    def observe(self, recv: float, stamp: float | None) -> float | None:
        """Learn from one message; for a message without a stamp, return its source time."""
        if not stamp:  # no header or a zero stamp: learn the stream's period, follow the track
            if self._arrivals and recv - self._arrivals[-1] > 1.0:
                self._arrivals.clear()  # the stream paused: a new run
                self._track = None
            self._arrivals.append(recv)
            return self._follow(recv)
        d = recv - stamp
        if self._block_start is None or recv - self._block_start >= self.window_s:
            gap = recv - self._block_start if self._block_start is not None else math.inf
            self._prev = self._cur if gap < 2 * self.window_s else math.inf
            self._cur = math.inf
            self._block_start = recv
        est = self.offset
        if est is not None and d < est - self.outlier_s:
            self._suspects += 1
            if self._suspects < self.confirm:
                return None
            self._prev = math.inf  # a confirmed clock step: forget the old minimum
        self._suspects = 0
        self._cur = min(self._cur, d)
        self.observed += 1
        return None

    def _follow(self, recv: float) -> float:
        """Source time of an unstamped message: the previous one plus the stream's period, kept
        within ``[recv - UNSTAMPED_HOLD_S, recv]``.

        A message is never placed after its arrival, so the track follows the least-delayed
        messages (the running minimum of receive minus sample time, with sample k taken at
        k periods); late messages of a burst keep their period spacing instead of piling up on
        their arrival time. The period is the stream's mean interval times ``_TRACK_STRETCH``:
        the track drifts slowly towards the arrivals, so a lost message does not shift the
        stream for good. It is followed for every message, also between episodes, so a burst
        right after START is spread like any other.
        """
        period = self.period
        if period is not None and self._track is not None:
            t = min(max(self._track + period * _TRACK_STRETCH, recv - UNSTAMPED_HOLD_S), recv)
        else:
            t = recv
        self._track = t
        return t
    @property
    def offset(self) -> float | None:
        v = min(self._cur, self._prev)
        return None if v == math.inf else v
