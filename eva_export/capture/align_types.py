"""The values of the capture aligner (align.py): samples in, slots and picks out, per-stream
timing evidence, and the aligner's per-stream bookkeeping (``StreamTrack``)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .clock import ClockOffset

#: Delivery delays are kept in a histogram of 0.1 ms bins up to this many seconds (memory flat).
_JITTER_MAX_S = 2.0
_JITTER_BIN_S = 1e-4


@dataclass(frozen=True, slots=True)
class Sample:
    """One received message: receive time, header stamp (None: no header), payload.

    ``t`` is the source time on the grid's clock (set by the aligner); ``seq`` the arrival
    number within the episode, per stream (set by the aligner).
    """

    recv: float
    stamp: float | None
    payload: Any
    seq: int = 0
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Pick:
    sample: Sample | None  # the message placed in this slot, or the held one (repeat)
    repeat: bool  # no message of this stream in the slot's window: the previous one is held
    stale: bool = False  # kept for callers of the old rule; the window rule has no stale picks

    @property
    def dropped(self) -> bool:
        return self.sample is None or self.repeat or self.stale


@dataclass(frozen=True, slots=True)
class Slot:
    index: int
    t: float
    picks: tuple[Pick, ...]


@dataclass(frozen=True)
class StreamTiming:
    """Per-stream timing evidence of one episode (stream stats and the status topic)."""

    dropped: int
    late: int
    out_of_order: int
    jitter_p50_ms: float
    jitter_p99_ms: float
    max_gap_ms: float
    time_base: str
    clock_offset_s: float | None

    def to_stats(self) -> dict[str, object]:
        d: dict[str, object] = {"late": self.late, "jitter_p50_ms": round(self.jitter_p50_ms, 3),
                             "jitter_p99_ms": round(self.jitter_p99_ms, 3),
                             "max_gap_ms": round(self.max_gap_ms, 3), "time_base": self.time_base}
        if self.out_of_order:
            d["out_of_order"] = self.out_of_order
        return d


@dataclass
class StreamTrack:
    """What the aligner keeps per stream: its pending messages, the held value, evidence counters."""

    offset: ClockOffset
    own_offset: bool
    pending: deque[Sample] = field(default_factory=deque)
    held: Sample | None = None
    newest: Sample | None = None  # newest placed (or late) sample: its source time is the frontier
    last_stamp: float | None = None
    count: int = 0
    last_recv: float | None = None
    last_t: float | None = None
    max_gap: float = 0.0
    consumed_t: float = -math.inf  # source time of the newest sample used by a slot
    pending_drops: deque[int] = field(default_factory=deque)
    final_drops: int = 0
    late: int = 0
    out_of_order: int = 0
    stamped: int = 0
    zero_stamps: int = 0
    unstamped: int = 0
    hist: NDArray[np.int64] = field(default_factory=lambda: np.zeros(int(_JITTER_MAX_S / _JITTER_BIN_S) + 1,
                                                                np.int64))

    def note_jitter(self, delay: float) -> None:
        idx = int(max(delay, 0.0) / _JITTER_BIN_S)
        self.hist[min(idx, self.hist.size - 1)] += 1

    def percentile_ms(self, q: float) -> float:
        n = int(self.hist.sum())
        if n == 0:
            return 0.0
        idx = int(np.searchsorted(np.cumsum(self.hist), math.ceil(q / 100.0 * n)))
        return idx * _JITTER_BIN_S * 1e3

    def time_base(self) -> str:
        if self.stamped and not self.zero_stamps:
            return "stamp"
        if self.stamped:
            return f"stamp ({self.zero_stamps} zero stamps placed by receive time)"
        if self.zero_stamps:
            return "receive (all header stamps zero)"
        return "receive (no header stamp)"
