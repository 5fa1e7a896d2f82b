"""Sample times of a stream without header stamps (the unstamped part of align.py's time base).

``ReceiveTrack`` places message n of a periodic publisher one period after message n-1 and
never after its arrival, so the messages of a backlog that arrive together fill the slots they
missed, by order. The count tells lateness from loss: a late backlog catches up (its messages
come faster than the period until the track is back at the arrivals), lost messages never do
(the track stays behind every arrival by whole periods). ``ClockOffset`` (clock.py) owns one
per stream.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

#: An unstamped message is placed at most this long before its arrival (a backlog of the
#: receiver: the capture node's vector subscriptions keep 2 s of a 100 Hz stream, so a longer
#: one has lost messages anyway).
UNSTAMPED_BACKLOG_S = 2.0
#: A track that stayed behind every arrival for this long, steadily and by whole periods, lost
#: that many messages: it moves up to the arrivals and the slots in between become drops.
LOSS_WINDOW_S = 2.0
#: A silence this long is a pause of the publisher: the track starts over at the arrivals.
PAUSE_S = 1.0
#: On-track arrivals the period is estimated from (about 2.5 s at 100 Hz).
_PERIOD_ARRIVALS = 256


class ReceiveTrack:
    """The source times of one unstamped stream, followed message by message."""

    def __init__(self) -> None:
        self._arrivals: deque[float] = deque(maxlen=_PERIOD_ARRIVALS)
        self._t: float | None = None
        self._run_start = 0.0
        self._lags: deque[tuple[float, float]] = deque()  # (recv, lag): the window's least lag first
        self._highs: deque[tuple[float, float]] = deque()  # (recv, lag): its largest first
        self._moved = 0.0  # how far the track moved up since the lags were noted

    @property
    def period(self) -> float | None:
        """Mean interval of the recent arrivals (robust to jitter and bursts, not to loss)."""
        a = self._arrivals
        return (a[-1] - a[0]) / (len(a) - 1) if len(a) >= 10 and a[-1] > a[0] else None

    def place(self, recv: float) -> float:
        """Source time of the message received at ``recv`` (receive times come in order)."""
        if self._arrivals and recv - self._arrivals[-1] > PAUSE_S:
            self._t = None  # the publisher paused: a new run
        if self._t is None:
            self._arrivals.clear()
            self._run_start, self._moved = recv, 0.0
            self._lags.clear()
            self._highs.clear()
        self._arrivals.append(recv)
        period = self.period
        if period is None or self._t is None:
            t = recv
        else:
            t = min(max(self._t + period, recv - UNSTAMPED_BACKLOG_S), recv)
            t += self._lost(recv, recv - t, period)
        self._t = t
        return t

    def _lost(self, recv: float, lag: float, period: float) -> float:
        """How far to move the track up: the whole periods by which every arrival of the last
        ``LOSS_WINDOW_S`` was behind it, when that lag held steady (within a period). A backlog
        of a starved host is not steady (it grows while the host is starved and shrinks when it
        drains), loss is: the messages after it still come at the period."""
        noted = lag + self._moved
        _window_push(self._lags, recv, noted, lambda old: old >= noted)
        _window_push(self._highs, recv, noted, lambda old: old <= noted)
        if recv - self._run_start < LOSS_WINDOW_S or self._highs[0][1] - self._lags[0][1] >= period:
            return 0.0
        missing = math.floor((self._lags[0][1] - self._moved) / period + 1e-6)
        if missing < 1:
            return 0.0
        self._moved += missing * period
        return missing * period


def _window_push(q: deque[tuple[float, float]], recv: float, value: float,
                 dominated: Callable[[float], bool]) -> None:
    """A windowed extreme of the last ``LOSS_WINDOW_S``: entries a newer one dominates never
    matter again; the extreme is ``q[0]``."""
    while q and dominated(q[-1][1]):
        q.pop()
    q.append((recv, value))
    while q[0][0] < recv - LOSS_WINDOW_S:
        q.popleft()
