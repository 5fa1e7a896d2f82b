"""Alignment of asynchronous streams on the target fps grid, on the sensors' own time.

This module is the rule and ``GridAligner``; the clock offset estimate is in clock.py, the
values (``Sample``, ``Slot``, ``Pick``, ``StreamTiming``) and per-stream state in align_types.py.

The rule (one definition, used by the recorder and tested in tests/test_capture_core.py):

* **Time base.** The grid lives on the capture node's monotonic receive clock (START, STOP and
  the clock-driven deadlines are measured there). Every message gets a *source time* ``t`` in
  that base, the moment the sensor sampled it:

  - a message with a header stamp (Image, CompressedImage, JointState, PoseStamped) is placed by
    its stamp: ``t = stamp + offset``, where ``offset`` is the stream's clock offset, estimated
    online as a robust running minimum of ``recv - stamp`` (``ClockOffset``: the minimum over a
    sliding window of two blocks, a lone value far below it ignored until it repeats). The
    minimum is the offset between the two clocks plus the smallest delivery delay, so
    ``t`` is "when the message would have arrived without any scheduling or transport delay"
    and delivery jitter does not move a message on the grid.
  - a message without a stamp (Float64MultiArray) or with a zero stamp is placed by its receive
    time corrected the same way, with the stamp it does not carry replaced by its sample
    number (``ReceiveTrack``, track.py): message n is taken one period after message n-1, and
    never after it arrived. The count of messages received against the periods elapsed tells
    lateness from loss. Messages that arrive bunched after a gap or behind a backlog (a starved
    host, a held sample) fill the slots they missed, by order, however long the backlog grew
    (up to ``UNSTAMPED_BACKLOG_S``, what the node's subscription keeps), so they are late, not
    lost. Lost messages never catch up: when every arrival of the last ``LOSS_WINDOW_S`` was
    behind the track by whole periods, the track moves up by those periods and the slots in
    between are drops. A silence longer than ``PAUSE_S`` is a pause: the track starts over.

  Cases: stamps from another host's clock (a constant offset, seconds or hours) are absorbed by
  the offset estimate; a clock that steps forward is followed at once (the minimum drops), one
  that steps *backwards* makes the samples older than the stream's newest one: they are not
  placed (``out_of_order``) and the checker reports ``non_monotonic_clock`` (red); a stream whose
  stamps are all zero is placed by receive time, and the episode's stream stats say so
  (``time_base``).
* **t0**: the grid starts once every stream has delivered at least one message since START.
  With a reference stream (the first camera), t0 is the source time of the first reference
  message taken after START (not one in flight at START) that arrives when all streams are
  present (or the one that completes the set), so
  camera frames sit in the middle of their slot windows. Without a reference, t0 is the source
  time of the message that completes the set. If some stream is still silent ``grace_s`` after
  START, the grid starts anyway and the silent stream contributes placeholders.
* **Slot k** is at ``t_k = t0 + k / fps`` for every k with ``t_k <= t_stop`` (STOP's receive
  time, same base). Messages with ``t > t_stop + tolerance`` are not part of the episode.
* **Window and pick**: slot k owns the source times ``(t_k - tol, t_k + tol]`` (default
  tolerance half a period; older messages, before slot 0, only give the value to hold). Each stream contributes the
  message of that window nearest to ``t_k``; the others are superseded (faster streams).
* **Drop**: a slot whose window holds no message of a stream is a drop for that stream (the
  previous value is held, so the table rows always equal the video frames). ``dropped`` means a
  slot that no message was stamped for. Before a stream's first placed message there is nothing
  to hold: a message already received for a later slot stands in (still a drop), and only a
  stream with no message at all contributes a placeholder.
* **Late**: a message that arrives after its slot was final (see emission) is *late*, not lost:
  if its slot had been counted as a drop, the drop is taken back and the message counts as late
  (the held value stays in the data). Per stream the aligner also keeps the delivery delay
  distribution (``recv - t``, "jitter", p50/p99) and the largest gap between source times.
* **Emission**: slot k is final once every stream delivered a message with a source time after
  ``t_k + tol`` (per-publisher order: nothing older can come), or once the receive clock passed
  ``t_k + tol + latency_budget`` (a silent or very late stream; after STOP the remaining slots
  wait up to ``STOP_BUDGET_S`` instead). Messages are pushed in receive order, so picks never
  depend on worker lag.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .align_types import Pick, Sample, Slot, StreamTiming, StreamTrack
from .clock import ClockOffset

__all__ = ["LATENCY_BUDGET_S", "SAME_CLOCK_S", "STOP_BUDGET_S", "ClockOffset", "GridAligner", "Pick", "Sample",
           "Slot", "StreamTiming", "align_offline"]

#: Default time a slot waits for a late stream before it is final (receive clock, seconds): as
#: long as the node's subscriptions keep messages (nodes/intake.py HISTORY_S), so a message
#: delivered late by a busy host, and not lost, still lands in its own slot.
LATENCY_BUDGET_S = 2.0
#: After STOP the last slots wait longer for streams that are behind (a starved publisher
#: catching up), so a late tail is not counted as lost; STOP answers when they are final.
STOP_BUDGET_S = 3.0
#: A drop older than this many slots is final even if its message still turns up later.
_PENDING_DROP_SLOTS = 600
#: Streams whose offsets differ by less than this share the anchor stream's clock.
SAME_CLOCK_S = 0.5


class GridAligner:
    """Streaming aligner: ``push`` samples in receive order, ``poll`` finished slots.

    Holds only the messages not yet final per stream (about ``latency_budget`` worth at most),
    so memory does not grow with episode length. ``offsets`` (one ``ClockOffset`` per stream)
    may be shared with a caller that feeds them with every message, also outside episodes, so
    the estimate is settled at START; without it the aligner keeps and feeds its own.
    """

    def __init__(self, n_streams: int, fps: float, start: float, *, tolerance: float = 0.0,
                 reference: int | None = None, grace_s: float = 1.0, margin_s: float = 0.02,
                 latency_budget: float = LATENCY_BUDGET_S, stop_budget: float = STOP_BUDGET_S,
                 offsets: Sequence[ClockOffset] | None = None,
                 may_start: Callable[[Any], bool] | None = None) -> None:
        if n_streams <= 0:
            raise ValueError("at least one stream is needed")
        if offsets is not None and len(offsets) != n_streams:
            raise ValueError("one ClockOffset per stream is needed")
        self.n = n_streams
        self.period = 1.0 / float(fps)
        self.tol = tolerance if tolerance > 0 else self.period / 2
        self.start = start
        self.reference = reference
        self.grace_s = grace_s
        # which reference payloads may be row 0 (an H.264 camera: a keyframe, so its video can be a copy)
        self.may_start = may_start
        self.margin_s = margin_s
        self.budget = latency_budget
        self.stop_budget = max(stop_budget, latency_budget)
        self._t0_sample: tuple[int, Sample] | None = None
        self.t_stop: float | None = None
        self.next_k = 0
        self._s = [StreamTrack(offsets[i] if offsets is not None else ClockOffset(), offsets is None)
                   for i in range(n_streams)]

    # ---- grid -------------------------------------------------------------------------------
    @property
    def t0(self) -> float | None:
        """Source time of the grid's first slot. It follows the anchor stream's offset estimate,
        so streams on the anchor's clock keep their exact places while the estimate settles."""
        if self._t0_sample is None:
            return None
        return self._t(*self._t0_sample)

    def _set_t0(self, stream: int, sample: Sample) -> None:
        self._t0_sample = (stream, sample)

    def slot_time(self, k: int) -> float:
        t0 = self.t0
        assert t0 is not None
        return t0 + k * self.period

    def _effective_offset(self, stream: int) -> float | None:
        """The stream's clock offset; the anchor's when both are the same clock (exact relative
        placement of stamps from one host, whatever the delivery delays were)."""
        own = self._s[stream].offset.offset
        anchor = self.reference if self.reference is not None else 0
        if own is None or stream == anchor:
            return own
        ref = self._s[anchor].offset.offset
        if ref is not None and abs(own - ref) < SAME_CLOCK_S:
            return ref
        return own

    def _t(self, stream: int, s: Sample) -> float:
        if s.stamp:
            off = self._effective_offset(stream)
            if off is not None:
                return s.stamp + off
        assert s.t is not None
        return s.t

    def _frontier(self, st: StreamTrack, stream: int) -> float:
        """Source time up to which the stream is known complete (sources are in order)."""
        return -math.inf if st.newest is None else self._t(stream, st.newest)

    def planned_slots(self) -> int:
        """Slots of the episode: emitted so far while recording, all of them once stopped."""
        if self.t0 is None:
            return 0
        if self.t_stop is None:
            return self.next_k
        if self.t_stop < self.t0:
            return 0
        return int(math.floor((self.t_stop - self.t0) / self.period + 1e-9)) + 1

    @property
    def latest(self) -> list[Sample | None]:
        """Newest known sample per stream (pending or held)."""
        return [st.pending[-1] if st.pending else st.held for st in self._s]

    def _complete(self) -> bool:
        return all(st.count > 0 for st in self._s)

    def source_time(self, stream: int, recv: float, stamp: float | None) -> float:
        """Where a message belongs on the grid's clock (see the module rule)."""
        if not stamp:
            return recv
        off = self._effective_offset(stream)
        return recv if off is None else stamp + off

    # ---- input ------------------------------------------------------------------------------
    def push(self, stream: int, sample: Sample) -> list[Slot]:
        """Add one message (in receive order); returns the slots that became final."""
        st = self._s[stream]
        tracked = st.offset.observe(sample.recv, sample.stamp) if st.own_offset else None
        if sample.stamp is None:
            st.unstamped += 1
        elif sample.stamp == 0:
            st.zero_stamps += 1
        else:
            st.stamped += 1
        t = self.source_time(stream, sample.recv, sample.stamp)
        if not sample.stamp:  # the owner of the offsets followed the track when it received it
            t = sample.t if sample.t is not None else tracked if tracked is not None else sample.recv
        st.last_recv = sample.recv
        if self.t_stop is not None and t > self.t_stop + self.tol:
            return self._emit_until(sample.recv, strict=True)  # after STOP: not in the episode
        raw = sample.stamp if sample.stamp else t
        if sample.stamp and st.last_stamp is not None and sample.stamp <= st.last_stamp:
            st.out_of_order += 1  # stamp went back (or a duplicate): never reorder the grid
            return self._emit_until(sample.recv, strict=True)
        if sample.stamp:
            st.last_stamp = sample.stamp
        was_complete = self._complete()
        st.count += 1
        s = replace(sample, seq=st.count, t=t)
        if st.last_t is not None:
            st.max_gap = max(st.max_gap, raw - st.last_t)  # on the source's own clock
        st.last_t = raw
        st.newest = s
        if self.t0 is not None and self.next_k > 0 and t <= self.slot_time(self.next_k - 1) + self.tol:
            self._late(stream, st, s)
        else:
            st.pending.append(s)
        # t0 is a sample taken after START (a frame in flight at START is not part of the take)
        if self.t0 is None and t >= self.start and (self.t_stop is None or t <= self.t_stop):
            if self.reference is None:
                if self._complete():
                    self._set_t0(stream, s)
            elif stream == self.reference and (was_complete or self._complete()):
                first = self._first_sample(st, s)
                if first is not None:
                    self._set_t0(stream, first)
        return self._emit_until(sample.recv, strict=True)

    def _first_sample(self, st: StreamTrack, s: Sample) -> Sample | None:
        """The reference sample row 0 is placed on: ``s``, or when ``s`` may not start the grid
        (``may_start``) the newest earlier one since START that may, if any (the frames between
        it and ``s`` are still pending: nothing was emitted before t0)."""
        if self.may_start is None or self.may_start(s.payload):
            return s
        return next((p for p in reversed(st.pending) if p.t is not None and p.t >= self.start
                     and self.may_start(p.payload)), None)

    def in_episode(self, stream: int, recv: float, stamp: float | None, t: float | None = None) -> bool:
        """False for a message whose source time is after the STOP cut (not part of the take).
        ``t``: the source time of an unstamped message (``ClockOffset.observe``)."""
        if self.t_stop is None:
            return True
        src = self.source_time(stream, recv, stamp) if stamp or t is None else t
        return src <= self.t_stop + self.tol

    def _delay(self, stream: int, s: Sample) -> float:
        """Delivery delay beyond the stream's least one (its own offset estimate)."""
        off = self._s[stream].offset.offset
        if s.stamp and off is not None:
            return s.recv - (s.stamp + off)
        assert s.t is not None
        return s.recv - s.t

    def _late(self, stream: int, st: StreamTrack, s: Sample) -> None:
        """A message whose slot is already final: late, and no longer a drop of that slot."""
        assert s.t is not None and self.t0 is not None
        st.late += 1
        st.note_jitter(self._delay(stream, s))
        k = max(0, min(self.next_k - 1, round((s.t - self.t0) / self.period)))
        if k in st.pending_drops:
            st.pending_drops.remove(k)
        if st.held is None or (st.held.t is not None and st.held.seq < s.seq):
            st.held = s  # newer data for the slots to come (still a repeat if nothing else comes)

    def poll(self, now: float) -> list[Slot]:
        """Slots final at clock time ``now`` (quiet streams, the grace start, the stop)."""
        if self.t0 is None and now - self.start >= self.grace_s:
            present = self.latest
            if any(s is not None for s in present):
                ref = present[self.reference] if self.reference is not None else None
                if ref is not None:
                    self._set_t0(self.reference, ref)  # type: ignore[arg-type]
                else:
                    i = max((j for j, s in enumerate(present) if s is not None),
                            key=lambda j: self._t(j, present[j]))  # type: ignore[arg-type]
                    self._set_t0(i, present[i])  # type: ignore[arg-type]
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
        out = self._emit_until(math.inf, strict=False, force=True)
        return out

    # ---- evidence ---------------------------------------------------------------------------
    def timing(self, stream: int) -> StreamTiming:
        st = self._s[stream]
        return StreamTiming(dropped=st.final_drops + len(st.pending_drops), late=st.late,
                            out_of_order=st.out_of_order, jitter_p50_ms=st.percentile_ms(50),
                            jitter_p99_ms=st.percentile_ms(99), max_gap_ms=st.max_gap * 1e3,
                            time_base=st.time_base(), clock_offset_s=st.offset.offset)

    def timings(self) -> list[StreamTiming]:
        return [self.timing(i) for i in range(self.n)]

    # ---- output -----------------------------------------------------------------------------
    def _emit_until(self, now: float, *, strict: bool, force: bool = False) -> list[Slot]:
        out: list[Slot] = []
        if self.t0 is None:
            return out
        while True:
            tk = self.slot_time(self.next_k)
            if self.t_stop is not None and tk > self.t_stop + 1e-9:
                break
            deadline = tk + self.tol
            if not force:
                waited = now - (self.budget if self.t_stop is None else self.stop_budget)
                timed_out = deadline < waited if strict else deadline <= waited
                if not timed_out and not all(self._frontier(st, i) > deadline for i, st in enumerate(self._s)):
                    break
            out.append(self._make_slot(self.next_k, tk))
            self.next_k += 1
        return out

    def _make_slot(self, k: int, tk: float) -> Slot:
        picks = []
        deadline = tk + self.tol
        for i, st in enumerate(self._s):
            best: Sample | None = None
            best_t = math.inf
            while st.pending and self._t(i, st.pending[0]) <= deadline:
                s = st.pending.popleft()
                t = self._t(i, s)
                st.note_jitter(self._delay(i, s))
                st.consumed_t = t
                if t <= tk - self.tol:
                    st.held = s  # before the window (before slot 0): only a value to hold
                elif best is None or abs(t - tk) < abs(best_t - tk):
                    best, best_t = s, t
            if best is not None:
                st.held = best
                picks.append(Pick(best, False))
                continue
            st.pending_drops.append(k)
            while st.pending_drops and st.pending_drops[0] < k - _PENDING_DROP_SLOTS:
                st.pending_drops.popleft()
                st.final_drops += 1
            if st.held is None and st.pending:
                # Nothing to hold yet but a later message is already here (an unstamped stream
                # placed a little after t0): its value is a truer stand-in than a zero placeholder.
                picks.append(Pick(st.pending[0], True))
                continue
            picks.append(Pick(st.held, st.held is not None))
        return Slot(k, tk, tuple(picks))


def align_offline(streams: Sequence[Sequence[tuple[float, float | None]]], fps: float, start: float,
                  stop: float, *, tolerance: float = 0.0, reference: int | None = None,
                  grace_s: float = 1.0, latency_budget: float = LATENCY_BUDGET_S,
                  aligner: GridAligner | None = None) -> list[Slot]:
    """Align complete lists of (recv, stamp) per stream with the same rule (tests, tools).

    Payloads are the (stream, position) of each message.
    """
    events = sorted((recv, i, j, stamp) for i, msgs in enumerate(streams)
                    for j, (recv, stamp) in enumerate(msgs))
    al = aligner or GridAligner(len(streams), fps, start, tolerance=tolerance, reference=reference,
                                grace_s=grace_s, latency_budget=latency_budget)
    for recv, i, _j, stamp in events:  # before START: only the clock estimates learn (as live)
        if recv < start and al._s[i].own_offset:
            al._s[i].offset.observe(recv, stamp)
    events = [e for e in events if e[0] >= start]
    slots: list[Slot] = []
    for recv, i, j, stamp in events:
        if recv > stop and al.t_stop is None:
            al.stop(stop)  # STOP happens at its time, as live
        if recv > stop + al.tol + al.stop_budget:
            break
        slots += al.poll(recv)
        slots += al.push(i, Sample(recv, stamp, (i, j)))
    if al.t_stop is None:
        al.stop(stop)
    slots += al.poll(stop + al.tol + al.stop_budget + al.margin_s)
    slots += al.finish()
    return slots
