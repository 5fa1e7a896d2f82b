"""Per-stream clock offset of the capture grid (the "Time base" part of align.py's rule).

``ClockOffset`` estimates ``recv - stamp`` robustly online and places unstamped messages by
their sample number (``ReceiveTrack``, track.py); ``GridAligner`` (align.py) reads it to place
every message on the grid.
"""

from __future__ import annotations

import math

from .track import ReceiveTrack


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
        self._track = ReceiveTrack()

    @property
    def period(self) -> float | None:
        """Mean interval of the recent unstamped arrivals (robust to jitter, not to loss)."""
        return self._track.period

    def observe(self, recv: float, stamp: float | None) -> float | None:
        """Learn from one message; for a message without a stamp, return its source time."""
        if not stamp:  # no header or a zero stamp: placed by its sample number (track.py)
            return self._track.place(recv)
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

    @property
    def offset(self) -> float | None:
        v = min(self._cur, self._prev)
        return None if v == math.inf else v
