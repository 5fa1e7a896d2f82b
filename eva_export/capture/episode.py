"""One episode on its way from messages to a committed v2.1 episode (no threads, no clock).

``EpisodeRun`` is the single code path that live capture (the Recorder's align and save workers)
and bag ingest (eva_export.capture.ingest) share: messages in receive order go through
``push`` (checks, vector conversion, the ``GridAligner``), grid slots through ``emit`` (image
decoding, held values, the ``EpisodeChecker``) into the ``EpisodeWriter``, and ``save`` finishes
the encoders, computes the verdict and commits through the dataset's ``DatasetWriter`` journal.
Whoever drives it decides what "now" is: the receive clock live, the bag's log time in ingest.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np

from ..config import CollectionConfig
from ..formats.common.records import EpisodeRow
from ..formats.lerobot_v21.episode_writer import EpisodeWriter
from ..formats.lerobot_v21.writer import DatasetWriter
from .align import LATENCY_BUDGET_S, GridAligner, Sample, Slot
from .checks import EpisodeChecker, QualityResult
from .features import CAPTURE_TIME
from .intake import RawImage, RawVector
from .stream import StreamState


def _key_or_not_video(payload: Any) -> bool:
    """Row 0 of an H.264 reference camera is a keyframe: the episode's video can then be the
    source's own packets (a start inside a GOP would need the frames before it)."""
    return not isinstance(payload, RawImage) or payload.frame_no < 0 or payload.key


@dataclass
class EpisodeRun:
    epoch: int
    dataset_name: str
    task: str
    dw: DatasetWriter
    writer: EpisodeWriter
    aligner: GridAligner
    checker: EpisodeChecker
    streams: Sequence[StreamState]
    start: float
    wall_offset: float
    t_stop: float | None = None
    cancel: bool = False
    finalized: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    row_extra: dict[str, Any] = field(default_factory=dict)  # added to the episode row at commit
    # per H.264 camera: the frame_no its next row must carry for the video to stay a copy of the
    # source (absent: row 0, a keyframe; -1: given up). Per episode: an episode still closing
    # and the next one share the streams, never this.
    copy_next: dict[int, int] = field(default_factory=dict)

    @classmethod
    def begin(cls, col: CollectionConfig, streams: Sequence[StreamState], dw: DatasetWriter, dataset_name: str,
              task: str, now: float, wall_offset: float, *, epoch: int = 0, grace_s: float = 1.0,
              writer: EpisodeWriter | None = None) -> EpisodeRun:
        """The episode's aligner and checker at ``now`` (START); ``writer``: an already opened
        episode writer (live capture opens it before taking START's time: opening the encoders
        takes milliseconds during which messages are not taken)."""
        cap = col.capture
        cams = [i for i, s in enumerate(streams) if s.spec.is_camera]
        aligner = GridAligner(len(streams), col.fps, now, tolerance=cap.skew_tolerance_s,
                              reference=cams[0] if cams else None, grace_s=grace_s,
                              latency_budget=LATENCY_BUDGET_S, offsets=[s.offset for s in streams],
                              may_start=_key_or_not_video)
        checker = EpisodeChecker([s.spec.name for s in streams], [s.spec.is_camera for s in streams],
                                 fps=col.fps, start=now, min_frames=cap.min_frames,
                                 max_drop_ratio=cap.max_drop_ratio, frozen_frames=cap.frozen_frames,
                                 camera_skew_tolerance_s=cap.camera_skew_tolerance_s, wall_offset=wall_offset,
                                 widths=[s.spec.width_values for s in streams],
                                 dim_names=[s.spec.names for s in streams])
        writer = writer or dw.begin_episode(task)
        for s in streams:
            s.begin_episode()
        return cls(epoch, dataset_name, task, dw, writer, aligner, checker, streams, now, wall_offset)

    # ---- messages ---------------------------------------------------------------------------
    def push(self, i: int, recv: float, stamp: float | None, payload: Any, t_src: float | None = None) -> None:
        """One message, in receive order (``t_src``: its source time when unstamped)."""
        if recv < self.start:
            # received before START but handed over after it (a callback racing START): not part
            # of the take, so the episode does not depend on that race (and a bag replay, which
            # cuts on receive time, gives the same episode)
            return
        if self.t_stop is not None:
            if self.aligner.t_stop is None:
                self.aligner.stop(self.t_stop)
            # the STOP cut is on source time, like the grid: a frame stamped before STOP but
            # delivered after it still belongs to the episode
            if not self.aligner.in_episode(i, recv, stamp, t_src):
                return
        spec = self.streams[i].spec
        self.checker.on_message(i, recv, stamp)
        value: Any = None
        if spec.is_camera:
            raw: RawImage = payload
            if raw.frame_no >= 0 and raw.packet is None:  # an H.264 message that did not decode
                self.checker.on_shape(i, f"undecodable frame: {raw.encoding}")
            elif not raw.compressed and (raw.width, raw.height) != (spec.width, spec.height):
                self.checker.on_shape(i, f"{raw.width}x{raw.height} received, {spec.width}x{spec.height} configured")
            else:
                value = raw
        else:
            value = self._vector(i, payload)
        self.emit(self.aligner.push(i, Sample(recv, stamp, value, t=t_src)))

    def _vector(self, i: int, raw: RawVector) -> np.ndarray[Any, Any] | None:
        spec = self.streams[i].spec
        vals = np.asarray(raw.values, dtype=np.float64)
        want = spec.width_values
        out = vals
        if spec.kind != "pose" and raw.names is not None and spec.msg_type == "JointState":
            index = {n: k for k, n in enumerate(raw.names)}
            missing = [n for n in spec.names if n not in index]
            if missing or len(vals) != len(raw.names):
                detail = (f"joints {missing} missing from the message" if missing
                          else f"{len(vals)} {spec.field} values for {len(raw.names)} joint names")
                self.checker.on_dimension(i, detail, len(vals))
                return None
            out = vals[[index[n] for n in spec.names]]
        if out.shape != (want,):
            self.checker.on_dimension(i, f"{out.size} values, {want} configured", out.size)
            return None
        return out.astype(np.float32)  # NaN/inf kept: the rows show them, the rules flag them

    # ---- grid slots -------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        """Emit the slots the clock made final (call only when caught up with the intake)."""
        self.emit(self.aligner.poll(now))

    def stop(self, t_stop: float) -> None:
        self.t_stop = t_stop
        if self.aligner.t_stop is None:
            self.aligner.stop(t_stop)

    def finish_slots(self) -> None:
        """Emit every remaining slot up to STOP (end of the episode's messages)."""
        self.emit(self.aligner.finish())

    def emit(self, slots: list[Slot]) -> None:
        for slot in slots:
            values: dict[str, Any] = {}
            images: dict[str, np.ndarray[Any, Any]] = {}
            packets: dict[str, bytes | None] = {}  # H.264 cameras: the source's packet for this row
            row: list[Any] = []  # what the rules see: the values written, None for placeholders
            for i, pick in enumerate(slot.picks):
                st = self.streams[i]
                spec = st.spec
                s = pick.sample
                fresh: RawImage | None = None  # a camera frame new in this row, as written
                if s is not None and s.payload is not None and s.seq != st.held_seq:
                    if spec.is_camera:
                        try:
                            img = st.decoder.rgb(s.payload, (spec.width, spec.height))
                            if img.shape != (spec.height, spec.width, 3):
                                self.checker.on_shape(i, f"decoded {img.shape[1]}x{img.shape[0]}, "
                                                         f"{spec.width}x{spec.height} configured")
                            else:
                                st.held, fresh = img, s.payload
                        except (ValueError, av.FFmpegError) as exc:
                            self.checker.on_shape(i, f"undecodable frame: {exc}")
                    else:
                        st.held = s.payload
                    st.held_seq = s.seq
                if st.held is None:
                    st.held = st.placeholder()
                row.append(st.held if st.held_seq >= 0 else None)
                if spec.is_camera:
                    images[spec.feature] = st.held
                    if st.video is not None:
                        packets[spec.feature] = self._copy_packet(i, fresh)
                else:
                    values[spec.feature] = st.held
            self.checker.on_slot(slot, row)
            # Seconds since START, not epoch seconds: LeRobot hands columns out as float32, which
            # keeps ~1e-5 s here but only 128 s steps for epoch values. The episode row carries
            # capture_time_origin_unix, so origin + capture_time is the observed wall time.
            values[CAPTURE_TIME] = np.array([self._capture_recv(slot) - self.start], np.float64)
            self.writer.add_frame(values, images, packets)

    def _copy_packet(self, i: int, raw: RawImage | None) -> bytes | None:
        """The row's H.264 packet while the episode's video is exactly the source's frames, one per
        row from a keyframe on; None from the first row that is not (a repeat, a drop, a frame that
        did not decode, a start inside a GOP), and the writer encodes the episode instead."""
        want = self.copy_next.get(i)
        if raw is None or raw.packet is None or not (raw.key if want is None else raw.frame_no == want):
            self.copy_next[i] = -1
            return None
        self.copy_next[i] = raw.frame_no + 1
        return raw.packet

    def _capture_recv(self, slot: Slot) -> float:
        """Observed time of the row: receive time of the state message used (else the slot)."""
        pick = slot.picks[0]
        if self.streams[0].spec.name == "state" and pick.sample is not None:
            return pick.sample.recv
        return slot.t

    # ---- end ----------------------------------------------------------------------------------
    def note_overflow(self) -> int:
        """Count the messages the intake could not take as checker issues; returns the total."""
        total = 0
        for i, st in enumerate(self.streams):
            for _ in range(st.overflow):
                self.checker.on_overflow(i)
            total += st.overflow
        return total

    def save(self) -> tuple[EpisodeRow | None, QualityResult]:
        """Finish the encoders, judge the episode and commit it (None: zero rows, nothing written)."""
        done = self.writer.finish()
        frames = {s.spec.name: done.video_frames.get(s.spec.feature, 0) for s in self.streams if s.spec.is_camera}
        assert self.t_stop is not None
        result = self.checker.finish(done.rows, self.t_stop, frames, self.aligner.timings())
        row = self.dw.commit(self.writer, {**result.row_extra(),
                                           "capture_time_origin_unix": self.wall_offset + self.start,
                                           **self.row_extra})
        return row, result

    def abort(self) -> None:
        self.writer.abort()
