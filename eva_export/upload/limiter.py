"""A bandwidth cap shared by every transfer of one upload (token bucket on a virtual clock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """Lets bytes pass at ``rate`` bytes/s on average, with at most ``burst_s`` of slack.

    Every ``consume(n)`` books its bytes on a schedule: the n bytes start at the later of now
    (less the allowed burst) and the end of the previous booking, and the caller sleeps
    until that start. So the bytes let through up to any instant never exceed
    ``rate * (elapsed + burst_s)``. The accounting (``granted``, ``first_at``,
    ``schedule_end``) is kept so a test can check the cap without timing anything.
    """

    def __init__(self, rate: float, burst_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst_s = burst_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next = 0.0  # end of the last booking, on the clock's scale
        self.granted = 0  # bytes let through so far
        self.first_at: float | None = None  # when the first byte was asked for
        self.waited_s = 0.0  # total time callers slept

    def consume(self, n: int) -> None:
        """Block until ``n`` more bytes may be sent."""
        if n <= 0:
            return
        with self._lock:
            now = self._clock()
            if self.first_at is None:
                self.first_at = now
                self._next = now
            start = max(self._next, now - self.burst_s)
            self._next = start + n / self.rate
            self.granted += n
            delay = start - now
        if delay > 0:
            self.waited_s += delay
            self._sleep(delay)

    @property
    def schedule_end(self) -> float:
        """When the bytes granted so far are paid for at ``rate``."""
        return self._next

    def booked_rate(self) -> float:
        """Bytes granted per second of booked schedule (== rate once the cap is binding)."""
        if self.first_at is None:
            return 0.0
        span = self._next - self.first_at
        return self.granted / span if span > 0 else float("inf")
