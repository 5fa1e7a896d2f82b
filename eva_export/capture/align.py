"""Alignment of asynchronous streams on the target fps grid.

The rule (one definition, used by the recorder and tested in tests/test_capture_core.py):

* Times are **receive times** on one monotonic clock (the node stamps each message when its
  callback runs). Header stamps are kept for the checks but never move a sample on the grid.
* **t0**: the grid starts once every stream has delivered at least one message since START.
  With a reference stream (the first camera), t0 is the receive time of the first reference
  message that arrives when all streams are present (or the reference message that completes
  the set), so camera frames sit in the middle of their slot windows. Without a reference, t0
  is the receive time of the message that completes the set. If some stream is still silent
  ``grace_s`` after START, the grid starts anyway (t0 = receive time of the newest message of
  the reference stream, else of any stream) and the silent stream contributes placeholders.
* **Slot k** is at ``t_k = t0 + k / fps`` for every k with ``t_k <= t_stop``.
* **Pick**: each stream contributes its newest message received at or before
  ``t_k + tolerance`` (default tolerance: half a period).
* **Drop**: the slot counts as a drop for a stream when the picked message is the same one the
  previous slot used (repeat), when it is older than ``1/fps + tolerance`` at ``t_k`` (stale), or
  when the stream has no message at all. The held value is still written, so the number of
  table rows always equals the number of video frames.
* **Emission**: slot k is final once a message with a receive time after ``t_k + tolerance``
  has been pushed (messages are pushed in receive order), or once the clock passed
  ``t_k + tolerance + margin`` (quiet streams). So picks never depend on worker lag.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One received message: receive time, header stamp (None: no header), payload."""

    recv: float
    stamp: float | None
    payload: Any
    seq: int = 0  # arrival number within the episode, per stream (set by the aligner)


@dataclass(frozen=True, slots=True)
class Pick:
    sample: Sample | None
    repeat: bool  # same message as the previous slot
    stale: bool  # older than one period + tolerance at the slot time

    @property
    def dropped(self) -> bool:
        return self.sample is None or self.repeat or self.stale


@dataclass(frozen=True, slots=True)
class Slot:
    index: int
    t: float
    picks: tuple[Pick, ...]


class GridAligner:
    """Streaming aligner: ``push`` samples in receive order, ``poll`` finished slots.

    Holds only the newest sample per stream, so memory does not grow with episode length.
    """

    def __init__(self, n_streams: int, fps: float, start: float, *, tolerance: float = 0.0,
                 reference: int | None = None, grace_s: float = 1.0, margin_s: float = 0.02) -> None:
        if n_streams <= 0:
            raise ValueError("at least one stream is needed")
        self.n = n_streams
        self.period = 1.0 / float(fps)
        self.tol = tolerance if tolerance > 0 else self.period / 2
        self.start = start
        self.reference = reference
        self.grace_s = grace_s
        self.margin_s = margin_s
        self.t0: float | None = None
        self.t_stop: float | None = None
        self.next_k = 0
        self.latest: list[Sample | None] = [None] * n_streams
        self._counts = [0] * n_streams
        self._prev_seq: list[int | None] = [None] * n_streams

    # ---- grid -------------------------------------------------------------------------------
    def slot_time(self, k: int) -> float:
        assert self.t0 is not None
        return self.t0 + k * self.period

    def planned_slots(self) -> int:
        """Slots of the episode: emitted so far while recording, all of them once stopped."""
        if self.t0 is None:
            return 0
        if self.t_stop is None:
            return self.next_k
        if self.t_stop < self.t0:
            return 0
        return int(math.floor((self.t_stop - self.t0) / self.period + 1e-9)) + 1

    def _complete(self) -> bool:
        return all(s is not None for s in self.latest)

    # ---- input ------------------------------------------------------------------------------
    def push(self, stream: int, sample: Sample) -> list[Slot]:
        """Add one message; returns the slots that became final before it."""
        out = self._emit_until(sample.recv, strict=True)
        self._counts[stream] += 1
        s = Sample(sample.recv, sample.stamp, sample.payload, self._counts[stream])
        was_complete = self._complete()
        self.latest[stream] = s
        if self.t0 is None and (self.t_stop is None or s.recv <= self.t_stop):
            if self.reference is None:
                if self._complete():
                    self.t0 = s.recv
            elif stream == self.reference and (was_complete or self._complete()):
                self.t0 = s.recv
        return out

    def poll(self, now: float) -> list[Slot]:
        """Slots final at clock time ``now`` (quiet streams, the grace start, the stop)."""
        if self.t0 is None and now - self.start >= self.grace_s:
            present = [s for s in self.latest if s is not None]
            if present:
                ref = self.latest[self.reference] if self.reference is not None else None
                self.t0 = ref.recv if ref is not None else max(s.recv for s in present)
        return self._emit_until(now - self.margin_s, strict=False)

    def stop(self, t_stop: float) -> None:
        self.t_stop = t_stop

    def done(self) -> bool:
        """True once stopped and every slot up to t_stop has been emitted."""
        if self.t_stop is None:
            return False
        if self.t0 is None:
            return True
        return self.next_k >= self.planned_slots()

    def finish(self) -> list[Slot]:
        """After stop: emit the remaining slots with what has been received (end of episode)."""
        if self.t_stop is None:
            raise RuntimeError("finish() before stop()")
        return self._emit_until(math.inf, strict=False)

    # ---- output -----------------------------------------------------------------------------
    def _emit_until(self, t: float, *, strict: bool) -> list[Slot]:
        out: list[Slot] = []
        if self.t0 is None:
            return out
        while True:
            tk = self.slot_time(self.next_k)
            if self.t_stop is not None and tk > self.t_stop + 1e-9:
                break
            deadline = tk + self.tol
            if not (deadline < t if strict else deadline <= t):
                break
            out.append(self._make_slot(self.next_k, tk))
            self.next_k += 1
        return out

    def _make_slot(self, k: int, tk: float) -> Slot:
        picks = []
        for i, s in enumerate(self.latest):
            if s is None:
                picks.append(Pick(None, False, False))
                continue
            repeat = self._prev_seq[i] == s.seq
            stale = tk - s.recv > self.period + self.tol
            picks.append(Pick(s, repeat, stale))
            self._prev_seq[i] = s.seq
        return Slot(k, tk, tuple(picks))


def align_offline(streams: Sequence[Sequence[tuple[float, float | None]]], fps: float, start: float,
                  stop: float, *, tolerance: float = 0.0, reference: int | None = None,
                  grace_s: float = 1.0) -> list[Slot]:
    """Align complete lists of (recv, stamp) per stream with the same rule (tests, tools).

    Payloads are the (stream, position) of each message.
    """
    events = sorted((recv, i, j, stamp) for i, msgs in enumerate(streams)
                    for j, (recv, stamp) in enumerate(msgs) if recv >= start)
    al = GridAligner(len(streams), fps, start, tolerance=tolerance, reference=reference, grace_s=grace_s)
    al.stop(stop)
    slots: list[Slot] = []
    for recv, i, j, stamp in events:
        if recv > stop + al.tol:
            break
        slots += al.poll(recv)
        slots += al.push(i, Sample(recv, stamp, (i, j)))
    slots += al.poll(stop + al.tol + al.margin_s)
    slots += al.finish()
    return slots
