"""The ROS-free capture engine: intake queue, align worker, save worker, episode lifecycle.

Threads and what they own:

* **callers of** ``offer`` (the node's subscription callbacks): stamp, count and enqueue. Nothing
  else; a full queue counts an overflow instead of blocking.
* **align worker** (one per Recorder): converts vectors, fingerprints frames, runs the
  ``GridAligner`` and the ``EpisodeChecker``, and streams every grid frame into the episode's
  ``EpisodeWriter`` (whose encoder threads, one per camera, encode while recording). At STOP
  it emits the last slots and hands the episode to the save queue; at CANCEL it aborts it.
* **save worker** (one per Recorder): finishes the encoders, computes the verdict and commits
  the episode through the dataset's ``DatasetWriter`` (the single writer of its meta files;
  reviews go through the same object and lock).

Service-side calls (``start``, ``stop``, ``cancel``, ``list_episodes``, ``review``, ``status``)
are thread-safe and never wait on encoding; ``stop`` waits only for the last grid slot
(tolerance plus a few milliseconds).
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np

from ..config import CollectionConfig, check_name
from ..dataset.meta import INFO, read_info, read_meta
from ..dataset.records import EpisodeRow
from ..dataset.writer import DatasetWriter, EpisodeWriter
from ..errors import ConfigError, DatasetError, EvaError
from .align import LATENCY_BUDGET_S, ClockOffset, GridAligner, Sample, Slot
from .checks import EpisodeChecker, QualityResult
from .features import (
    ACTION,
    CAPTURE_TIME,
    EE_POSE,
    STATE,
    capture_features,
    video_settings,
)

log = logging.getLogger(__name__)

#: Seconds after START before the grid starts without a stream that never delivered.
START_GRACE_S = 1.0
#: Received-but-unprocessed frames allowed per camera before new ones count as overflow.
INTAKE_FRAMES_PER_CAMERA = 45
INTAKE_ITEMS = 20000
STOP_WAIT_S = 15.0


# ---- payloads produced by the ROS side (ros_convert) -------------------------------------------
@dataclass(frozen=True, slots=True)
class RawVector:
    """A vector message: values (float64 view) and, for JointState, the element names."""

    values: np.ndarray
    names: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class RawImage:
    """An image message without copies: ``data`` is a uint8 view of the message buffer."""

    data: np.ndarray
    height: int = 0
    width: int = 0
    encoding: str = ""
    step: int = 0
    compressed: bool = False


_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8uc1": 1, "8uc3": 3}


class ImageDecoder:
    """RGB frames from raw or compressed (JPEG/PNG, decoded with PyAV) messages."""

    def __init__(self) -> None:
        self._ctx: dict[str, Any] = {}

    def rgb(self, raw: RawImage) -> np.ndarray:
        if raw.compressed:
            return self._decode(raw.data)
        enc = raw.encoding.lower()
        n = _CHANNELS.get(enc)
        if n is None:
            raise ValueError(f"unsupported image encoding {raw.encoding!r}")
        h, w, step = raw.height, raw.width, raw.step or raw.width * n
        if raw.data.size < h * step or step < w * n:
            raise ValueError(f"image buffer of {raw.data.size} bytes too small for {w}x{h} {enc} step {step}")
        img = raw.data[: h * step].reshape(h, step)[:, : w * n].reshape(h, w, n)
        if enc in ("rgb8", "8uc3"):
            return img
        if enc == "bgr8":
            return img[..., ::-1]
        if enc == "rgba8":
            return img[..., :3]
        if enc == "bgra8":
            return img[..., 2::-1]
        return np.repeat(img, 3, axis=2)

    def _decode(self, data: np.ndarray) -> np.ndarray:
        head = bytes(data[:8])
        if head.startswith(b"\xff\xd8"):
            codec = "mjpeg"
        elif head.startswith(b"\x89PNG"):
            codec = "png"
        else:
            raise ValueError("compressed image is neither JPEG nor PNG")
        ctx = self._ctx.get(codec)
        if ctx is None:
            ctx = self._ctx[codec] = av.CodecContext.create(codec, "r")
        frames = ctx.decode(av.Packet(data.tobytes()))
        if not frames:
            raise ValueError(f"{codec} decoder returned no frame")
        return frames[-1].to_ndarray(format="rgb24")


def fingerprint(raw: RawImage) -> int:
    """A cheap content hash: identical frames always match (a strided subsample of raw bytes)."""
    d = raw.data
    sub = d if raw.compressed or d.size <= 65536 else d[::31]
    return zlib.crc32(sub.tobytes()) ^ (d.size << 32)


# ---- streams -----------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamSpec:
    name: str  # state, action, ee_pose or the camera name
    topic: str
    kind: str  # "vector", "pose" or "camera"
    msg_type: str  # JointState, Float64MultiArray, PoseStamped, Image, CompressedImage
    feature: str
    names: tuple[str, ...] = ()
    field: str = "position"
    width: int = 0
    height: int = 0

    @property
    def is_camera(self) -> bool:
        return self.kind == "camera"


def streams_from_config(col: CollectionConfig) -> list[StreamSpec]:
    out: list[StreamSpec] = []
    if col.state is not None:
        out.append(StreamSpec("state", col.state.topic, "vector", col.state.type, STATE, col.state.names,
                              col.state.field))
    if col.action is not None:
        out.append(StreamSpec("action", col.action.topic, "vector", col.action.type, ACTION,
                              col.action.names, col.action.field))
    if col.ee_pose is not None:
        out.append(StreamSpec("ee_pose", col.ee_pose.topic, "pose", "PoseStamped", EE_POSE))
    for cam in col.cameras:
        out.append(StreamSpec(cam.name, cam.topic, "camera", cam.type, cam.key, width=cam.width,
                              height=cam.height))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"stream names must be unique (a camera may not be named state/action/ee_pose): {names}")
    return out


# ---- results -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartResult:
    ok: bool
    message: str
    dataset_name: str = ""
    dataset_dir: str = ""
    task: str = ""


@dataclass(frozen=True)
class StopResult:
    ok: bool
    message: str
    episode_index: int = -1
    frames: int = 0
    save_queue_depth: int = 0


@dataclass(frozen=True)
class CancelResult:
    ok: bool
    message: str
    frames_discarded: int = 0


@dataclass
class StreamStatus:
    name: str
    topic: str
    received: int
    dropped: int
    rate_hz: float
    late: int = 0
    jitter_p50_ms: float = 0.0
    jitter_p99_ms: float = 0.0
    max_gap_ms: float = 0.0


@dataclass
class Status:
    state: str
    dataset_name: str
    dataset_dir: str
    task: str
    frames: int
    save_queue_depth: int
    save_queue_capacity: int
    streams: list[StreamStatus]
    last_episode_index: int
    last_episode_quality: str
    last_message: str


# ---- episode (owned by the align worker after START) ---------------------------------------
@dataclass
class _Episode:
    epoch: int
    dataset_name: str
    task: str
    dw: DatasetWriter
    writer: EpisodeWriter
    aligner: GridAligner
    checker: EpisodeChecker
    start: float
    wall_offset: float
    encode_s: dict[str, float]
    held: list[Any]
    held_seq: list[int]
    t_stop: float | None = None
    cancel: bool = False
    finalized: threading.Event = field(default_factory=threading.Event)
    result: StopResult | CancelResult | None = None
    latencies: list[list[float]] = field(default_factory=list)


@dataclass
class _SaveJob:
    ep: _Episode
    rows: int
    expected_index: int
    stopped_at: float
    callback_latency_s: dict[str, list[float]]
    overflow: int


class Recorder:
    """Episode lifecycle and background work for one collection config."""

    def __init__(self, col: CollectionConfig, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, stats_file: str | Path | None = None,
                 start_grace_s: float = START_GRACE_S) -> None:
        self.col = col
        self.streams = streams_from_config(col)
        if not self.streams:
            raise ConfigError("collection.streams configures no stream to record")
        self.features = capture_features(col)
        self.video = video_settings(col.capture)
        self.clock = clock
        self.wall = wall
        self.stats_file = Path(stats_file) if stats_file else None
        self.start_grace_s = start_grace_s
        # diagnostic knob: slow every save down (tests kill the process in the middle of one)
        self.save_delay_s = float(os.environ.get("EVA_CAPTURE_SAVE_DELAY_S", "0") or 0)
        cams = [i for i, s in enumerate(self.streams) if s.is_camera]
        self.reference = cams[0] if cams else None
        self._lock = threading.Lock()  # counters and state shared with offer()
        self._received = [0] * len(self.streams)
        self._inflight = [0] * len(self.streams)
        self._overflow = [0] * len(self.streams)
        self._latency: list[list[float]] = [[] for _ in self.streams]
        # clock offset of each stream's header stamps, learnt from every message (also between
        # episodes), so it is settled when START comes
        self._offsets = [ClockOffset() for _ in self.streams]
        self._epoch = 0
        self._accepting = False
        self._episode: _Episode | None = None
        self._last_checker: EpisodeChecker | None = None
        self._last_aligner: GridAligner | None = None
        self._intake: queue.Queue[tuple[int, int, float, float | None, Any, float | None] | None] = \
            queue.Queue(INTAKE_ITEMS)
        self._writers: dict[str, DatasetWriter] = {}
        self._writers_lock = threading.Lock()
        self._save_q: queue.Queue[_SaveJob | None] = queue.Queue()
        self._save_depth = 0
        self._pending: dict[str, int] = {}
        self.last_index = -1
        self.last_quality = ""
        self.last_message = ""
        self._decoders = [ImageDecoder() for _ in self.streams]
        self._closed = threading.Event()
        self.recovered = self.recover_datasets()
        self._align_thread = threading.Thread(target=self._align_loop, name="capture-align", daemon=True)
        self._save_thread = threading.Thread(target=self._save_loop, name="capture-save", daemon=True)
        self._align_thread.start()
        self._save_thread.start()

    # ---- intake (subscription callbacks) ------------------------------------------------------
    def offer(self, i: int, recv: float, stamp: float | None, payload: Any) -> None:
        """Count and enqueue one message; never blocks. Called from subscription callbacks."""
        with self._lock:
            self._received[i] += 1
            t_src = self._offsets[i].observe(recv, stamp)  # unstamped: its source time
            if not self._accepting:
                return
            if self.streams[i].kind == "camera":
                if self._inflight[i] >= INTAKE_FRAMES_PER_CAMERA:
                    self._overflow[i] += 1
                    return
                self._inflight[i] += 1
            epoch = self._epoch
        try:
            self._intake.put_nowait((epoch, i, recv, stamp, payload, t_src))
        except queue.Full:
            with self._lock:
                self._overflow[i] += 1
                if self.streams[i].kind == "camera":
                    self._inflight[i] -= 1

    def note_latency(self, i: int, seconds: float) -> None:
        """Duration of one subscription callback (kept per episode, for diagnostics)."""
        if self._accepting:
            self._latency[i].append(seconds)

    # ---- datasets ------------------------------------------------------------------------------
    def _writer_for(self, name: str, create: bool) -> DatasetWriter | None:
        root = self.col.dataset_dir(name)
        with self._writers_lock:
            dw = self._writers.get(name)
            if dw is not None:
                return dw
            if create:
                dw = DatasetWriter.open(root, fps=self.col.fps, features=self.features,
                                        robot_type=self.col.robot_type, settings=self.video)
            elif (root / INFO).is_file():
                dw = DatasetWriter(root, read_info(root), self.video)
                dw.recovered = dw.recover()
            else:
                return None
            self._writers[name] = dw
            return dw

    def recover_datasets(self) -> dict[str, list[str]]:
        """Recover every configured dataset that exists, before any request is served, so
        readers (list_episodes, exports, LeRobot) never see the state a crash left."""
        out: dict[str, list[str]] = {}
        for name in dict.fromkeys(t.dataset_name for t in self.col.tasks):
            try:
                dw = self._writer_for(name, create=False)
            except (EvaError, OSError, ValueError) as exc:
                log.error("cannot recover dataset %s: %s", self.col.dataset_dir(name), exc)
                continue
            if dw is not None and dw.recovered:
                out[name] = dw.recovered
                log.warning("dataset %s recovered at start-up: %s", dw.root, "; ".join(dw.recovered))
        return out

    def _default_dataset(self, name: str) -> str:
        return name or self.col.tasks[0].dataset_name

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, dataset_name: str = "", task: str = "") -> StartResult:
        try:
            if dataset_name:
                check_name(dataset_name)
            spec = self.col.task_for(dataset_name, task)
            root = self.col.dataset_dir(spec.dataset_name)
        except ConfigError as exc:
            return StartResult(False, f"refused: {exc}", dataset_name, "", task)
        with self._lock:
            if self._episode is not None:
                state = "still being stopped" if self._episode.t_stop is not None else "already recording"
                return StartResult(False, f"refused: an episode is {state}", spec.dataset_name, str(root),
                                   spec.task)
            if self._save_depth >= self.col.capture.save_queue_size:
                return StartResult(False, f"refused: the save queue is full ({self._save_depth}/"
                                          f"{self.col.capture.save_queue_size} episodes waiting); "
                                          f"wait for saving to catch up", spec.dataset_name, str(root), spec.task)
        try:
            dw = self._writer_for(spec.dataset_name, create=True)
            assert dw is not None
            writer = dw.begin_episode(spec.task)
        except (EvaError, OSError) as exc:
            return StartResult(False, f"refused: cannot open dataset {root}: {exc}", spec.dataset_name,
                               str(root), spec.task)
        encode_s = self._time_encoders(writer)
        now = self.clock()
        cap = self.col.capture
        aligner = GridAligner(len(self.streams), self.col.fps, now, tolerance=cap.skew_tolerance_s,
                              reference=self.reference, grace_s=self.start_grace_s,
                              latency_budget=LATENCY_BUDGET_S, offsets=self._offsets)
        checker = EpisodeChecker([s.name for s in self.streams], [s.is_camera for s in self.streams],
                                 fps=self.col.fps, start=now, min_frames=cap.min_frames,
                                 max_drop_ratio=cap.max_drop_ratio, frozen_frames=cap.frozen_frames,
                                 camera_skew_tolerance_s=cap.camera_skew_tolerance_s,
                                 wall_offset=self.wall() - now)
        with self._lock:
            self._epoch += 1
            ep = _Episode(self._epoch, spec.dataset_name, spec.task, dw, writer, aligner, checker, now,
                          self.wall() - now, encode_s, [None] * len(self.streams), [-1] * len(self.streams))
            self._overflow = [0] * len(self.streams)
            self._latency = [[] for _ in self.streams]
            self._episode = ep
            self._last_checker = checker
            self._last_aligner = aligner
            self._accepting = True
        self._intake.put(None)  # wake the worker
        silent = [s.name for i, s in enumerate(self.streams) if self._received[i] == 0]
        msg = f"recording episode of {spec.dataset_name!r} (task {spec.task!r})"
        if silent:
            msg += f"; warning: nothing received yet on {silent}"
        log.info(msg)
        return StartResult(True, msg, spec.dataset_name, str(root), spec.task)

    def stop(self) -> StopResult:
        with self._lock:
            ep = self._episode
            if ep is None or ep.t_stop is not None or ep.cancel:
                return StopResult(False, "not recording", -1, 0, self._save_depth)
            ep.t_stop = self.clock()
        self._intake.put(None)
        if not ep.finalized.wait(STOP_WAIT_S):
            return StopResult(False, f"the episode is still being finalized after {STOP_WAIT_S} s "
                                     f"(host overloaded); it will be saved", -1, 0, self._save_depth)
        assert isinstance(ep.result, StopResult)
        return ep.result

    def cancel(self) -> CancelResult:
        with self._lock:
            ep = self._episode
            if ep is None or ep.t_stop is not None:
                return CancelResult(False, "not recording")
            ep.cancel = True
            self._accepting = False
        self._intake.put(None)
        ep.finalized.wait(STOP_WAIT_S)
        assert ep.result is None or isinstance(ep.result, CancelResult)
        return ep.result or CancelResult(True, "cancelled (still cleaning up)")

    # ---- queries -------------------------------------------------------------------------------
    def list_episodes(self, dataset_name: str = "") -> tuple[Path, list[EpisodeRow]]:
        name = self._default_dataset(dataset_name)
        root = self.col.dataset_dir(name)
        with self._writers_lock:
            dw = self._writers.get(name)
        if dw is not None:
            with dw.lock:
                return root, [EpisodeRow.from_dict(e.to_dict()) for e in dw.episodes]
        if not (root / INFO).is_file():
            return root, []
        return root, read_meta(root).episodes

    def review(self, dataset_name: str, episode_index: int, verdict: str, note: str | None) -> EpisodeRow:
        name = self._default_dataset(dataset_name)
        dw = self._writer_for(name, create=False)
        if dw is None:
            raise DatasetError(f"dataset {name!r} has no episodes yet ({self.col.dataset_dir(name)})")
        row = dw.review(episode_index, verdict, note)
        return EpisodeRow.from_dict(row.to_dict())

    def status(self) -> Status:
        with self._lock:
            ep = self._episode
            received = list(self._received)
            depth = self._save_depth
        checker = ep.checker if ep is not None else self._last_checker
        streams = []
        for i, s in enumerate(self.streams):
            c = checker.streams[i] if checker is not None else None
            al = self._last_aligner
            tm = al.timing(i) if al is not None else None
            streams.append(StreamStatus(s.name, s.topic, received[i], tm.dropped if tm else (c.dropped if c else 0),
                                        c.rate_hz() if c else 0.0, tm.late if tm else 0,
                                        tm.jitter_p50_ms if tm else 0.0, tm.jitter_p99_ms if tm else 0.0,
                                        tm.max_gap_ms if tm else 0.0))
        if ep is not None and not ep.cancel:
            state = "RECORDING"
        elif depth:
            state = "SAVING"
        else:
            state = "IDLE"
        return Status(state, ep.dataset_name if ep else "", str(self.col.dataset_dir(ep.dataset_name)) if ep else "",
                      ep.task if ep else "", ep.writer.rows if ep else 0, depth,
                      self.col.capture.save_queue_size, streams, self.last_index, self.last_quality,
                      self.last_message)

    @property
    def save_queue_depth(self) -> int:
        return self._save_depth

    def wait_saved(self, timeout: float = 60.0) -> bool:
        """Wait until no episode is recording, finalizing or waiting to be saved."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if self._episode is None and self._save_depth == 0:
                    return True
            time.sleep(0.02)
        return False

    def close(self, timeout: float = 120.0) -> None:
        """Discard an episode being recorded, finish queued saves, stop the workers."""
        with self._lock:
            ep = self._episode
        if ep is not None and ep.t_stop is None:
            self.cancel()
        self.wait_saved(timeout)
        self._closed.set()
        self._intake.put(None)
        self._save_q.put(None)
        self._align_thread.join(5)
        self._save_thread.join(timeout)

    # ---- align worker --------------------------------------------------------------------------
    def _align_loop(self) -> None:
        while not self._closed.is_set():
            try:
                item = self._intake.get(timeout=0.01)
            except queue.Empty:
                item = None
            ep = self._episode
            try:
                if item is not None:
                    epoch, i, recv, stamp, payload, t_src = item
                    if self.streams[i].kind == "camera":
                        with self._lock:
                            self._inflight[i] -= 1
                    if ep is not None and epoch == ep.epoch and not ep.cancel:
                        self._push(ep, i, recv, stamp, payload, t_src)
                if ep is None:
                    continue
                if ep.cancel:
                    self._abort(ep)
                    continue
                now = self.clock()
                if ep.t_stop is not None and ep.aligner.t_stop is None:
                    ep.aligner.stop(ep.t_stop)
                if not self._intake.qsize():  # caught up: clock-driven slots are safe to emit
                    self._emit(ep, ep.aligner.poll(now))
                if ep.t_stop is not None and (ep.aligner.done() or
                                              now > ep.t_stop + ep.aligner.tol + ep.aligner.stop_budget + 0.05):
                    if self._intake.qsize() and now < ep.t_stop + 2.0:
                        continue  # drain what was received before STOP first
                    self._emit(ep, ep.aligner.finish())
                    self._finalize(ep)
            except Exception as exc:
                log.exception("capture worker failed")
                if ep is not None and not ep.finalized.is_set():
                    self.last_quality, self.last_message = "failed", f"episode failed: {exc}"
                    self._abort(ep, failed=str(exc))

    def _push(self, ep: _Episode, i: int, recv: float, stamp: float | None, payload: Any,
              t_src: float | None = None) -> None:
        if ep.t_stop is not None:
            if ep.aligner.t_stop is None:
                ep.aligner.stop(ep.t_stop)
            # the STOP cut is on source time, like the grid: a frame stamped before STOP but
            # delivered after it still belongs to the episode
            if not ep.aligner.in_episode(i, recv, stamp, t_src):
                return
        spec = self.streams[i]
        ep.checker.on_message(i, recv, stamp)
        value: Any = None
        if spec.kind == "camera":
            raw: RawImage = payload
            ep.checker.on_fingerprint(i, fingerprint(raw))
            if not raw.compressed and (raw.width, raw.height) != (spec.width, spec.height):
                ep.checker.on_shape(i, f"{raw.width}x{raw.height} received, {spec.width}x{spec.height} configured")
            else:
                value = raw
        else:
            value = self._vector(ep, i, payload)
        self._emit(ep, ep.aligner.push(i, Sample(recv, stamp, value, t=t_src)))

    def _vector(self, ep: _Episode, i: int, raw: RawVector) -> np.ndarray | None:
        spec = self.streams[i]
        vals = np.asarray(raw.values, dtype=np.float64)
        if spec.kind == "pose":
            want = 7
            out = vals
        elif raw.names is not None and spec.msg_type == "JointState":
            index = {n: k for k, n in enumerate(raw.names)}
            missing = [n for n in spec.names if n not in index]
            if missing or len(vals) != len(raw.names):
                detail = (f"joints {missing} missing from the message" if missing
                          else f"{len(vals)} {spec.field} values for {len(raw.names)} joint names")
                ep.checker.on_dimension(i, detail)
                return None
            out = vals[[index[n] for n in spec.names]]
            want = len(spec.names)
        else:
            out = vals
            want = len(spec.names)
        if out.shape != (want,):
            ep.checker.on_dimension(i, f"{out.size} values, {want} configured")
            return None
        if not np.all(np.isfinite(out)):
            ep.checker.on_non_finite(i)
        return out.astype(np.float32)

    def _emit(self, ep: _Episode, slots: list[Slot]) -> None:
        for slot in slots:
            values: dict[str, Any] = {}
            images: dict[str, np.ndarray] = {}
            for i, pick in enumerate(slot.picks):
                spec = self.streams[i]
                s = pick.sample
                if s is not None and s.payload is not None and s.seq != ep.held_seq[i]:
                    if spec.is_camera:
                        try:
                            img = self._decoders[i].rgb(s.payload)
                            if img.shape != (spec.height, spec.width, 3):
                                ep.checker.on_shape(i, f"decoded {img.shape[1]}x{img.shape[0]}, "
                                                       f"{spec.width}x{spec.height} configured")
                            else:
                                ep.held[i] = img
                        except (ValueError, av.FFmpegError) as exc:
                            ep.checker.on_shape(i, f"undecodable frame: {exc}")
                    else:
                        ep.held[i] = s.payload
                    ep.held_seq[i] = s.seq
                if spec.is_camera:
                    if ep.held[i] is None:
                        ep.held[i] = np.zeros((spec.height, spec.width, 3), np.uint8)
                    images[spec.feature] = ep.held[i]
                else:
                    if ep.held[i] is None:
                        n = 7 if spec.kind == "pose" else len(spec.names)
                        ep.held[i] = np.zeros(n, np.float32)
                    values[spec.feature] = ep.held[i]
            ep.checker.on_slot(slot)
            # Seconds since START, not epoch seconds: LeRobot hands columns out as float32, which
            # keeps ~1e-5 s here but only 128 s steps for epoch values. The episode row carries
            # capture_time_origin_unix, so origin + capture_time is the observed wall time.
            values[CAPTURE_TIME] = np.array([self._capture_recv(slot) - ep.start], np.float64)
            ep.writer.add_frame(values, images)

    def _capture_recv(self, slot: Slot) -> float:
        """Observed time of the row: receive time of the state message used (else the slot)."""
        pick = slot.picks[0]
        if self.streams[0].name == "state" and pick.sample is not None:
            return pick.sample.recv
        return slot.t

    def _finalize(self, ep: _Episode) -> None:
        rows = ep.writer.rows
        with self._lock:
            self._accepting = False
            overflow = list(self._overflow)
            latency = {s.name: list(self._latency[i]) for i, s in enumerate(self.streams)}
        for i, n in enumerate(overflow):
            for _ in range(n):
                ep.checker.on_overflow(i)
        assert ep.t_stop is not None
        if rows == 0:
            ep.writer.abort()
            silent = [s.name for i, s in enumerate(self.streams) if ep.checker.streams[i].received == 0]
            why = f"; never received: {silent}" if silent else ""
            ep.result = StopResult(True, f"zero-frame episode: nothing written{why}", -1, 0, self._save_depth)
            self.last_quality, self.last_message = "empty", ep.result.message
        else:
            with self._lock:
                pending = self._pending.get(ep.dataset_name, 0)
                expected = ep.dw.next_episode_index + pending
                self._pending[ep.dataset_name] = pending + 1
                self._save_depth += 1
                depth = self._save_depth
            self._save_q.put(_SaveJob(ep, rows, expected, ep.t_stop, latency, sum(overflow)))
            msg = f"episode of {rows} frames queued for saving as episode {expected}"
            if depth > 1:
                log.warning("saving falls behind: %d episodes waiting (capacity %d)", depth,
                            self.col.capture.save_queue_size)
                msg += f"; warning: {depth} episodes waiting to be saved"
            ep.result = StopResult(True, msg, expected, rows, depth)
        with self._lock:
            self._episode = None
        ep.finalized.set()

    def _abort(self, ep: _Episode, failed: str = "") -> None:
        frames = ep.writer.rows
        with self._lock:
            self._accepting = False
        try:
            ep.writer.abort()
        finally:
            if failed:
                ep.result = StopResult(False, f"episode failed and was discarded: {failed}", -1, frames,
                                       self._save_depth)
            else:
                ep.result = CancelResult(True, f"cancelled: {frames} frames discarded, nothing written", frames)
                self.last_quality, self.last_message = "cancelled", ep.result.message
            with self._lock:
                self._episode = None
            ep.finalized.set()

    # ---- save worker ---------------------------------------------------------------------------
    def _save_loop(self) -> None:
        while True:
            job = self._save_q.get()
            if job is None:
                return
            ep = job.ep
            try:
                t_begin = self.clock()
                if self.save_delay_s > 0:
                    time.sleep(self.save_delay_s)
                done = ep.writer.finish()
                frames = {s.name: done.video_frames.get(s.feature, 0) for s in self.streams if s.is_camera}
                assert ep.t_stop is not None
                result = ep.checker.finish(done.rows, ep.t_stop, frames, ep.aligner.timings())
                row = ep.dw.commit(ep.writer, {**result.row_extra(),
                                               "capture_time_origin_unix": ep.wall_offset + ep.start})
                committed = self.clock()
                if row is None:
                    self.last_quality, self.last_message = "empty", "zero-frame episode: nothing written"
                else:
                    self.last_index, self.last_quality = row.episode_index, result.quality
                    self.last_message = (f"episode {row.episode_index} saved: {row.length} frames, "
                                         f"{result.quality}" + (f" ({', '.join(result.codes)})" if result.codes else ""))
                    if row.episode_index != job.expected_index:
                        log.warning("episode saved as %d, announced as %d", row.episode_index, job.expected_index)
                    log.info(self.last_message)
                    self._write_stats(job, row, result, t_begin, committed)
            except Exception as exc:
                log.exception("saving an episode failed")
                self.last_quality, self.last_message = "failed", f"saving failed: {exc}"
                try:
                    ep.writer.abort()
                except Exception:  # noqa: BLE001
                    pass
            finally:
                with self._lock:
                    self._save_depth -= 1
                    self._pending[ep.dataset_name] -= 1

    def _write_stats(self, job: _SaveJob, row: EpisodeRow, result: QualityResult, t_begin: float,
                     committed: float) -> None:
        if self.stats_file is None:
            return
        ep = job.ep
        duration = row.length / self.col.fps
        lat = {}
        for name, vals in job.callback_latency_s.items():
            if vals:
                arr = np.asarray(vals)
                lat[name] = {"n": int(arr.size), "p50_ms": float(np.percentile(arr, 50) * 1e3),
                             "p99_ms": float(np.percentile(arr, 99) * 1e3), "max_ms": float(arr.max() * 1e3)}
        enc = {k: (duration / v if v > 0 else math.inf) for k, v in ep.encode_s.items()}
        rec = {"dataset": ep.dataset_name, "episode_index": row.episode_index, "frames": row.length,
               "duration_s": duration, "quality": result.quality, "codes": result.codes,
               "stream_stats": result.stream_stats, "callback_latency": lat,
               "stop_to_durable_s": committed - job.stopped_at, "save_s": committed - t_begin,
               "encode_seconds": ep.encode_s, "encode_speed_x_realtime": enc,
               "intake_overflow": job.overflow}
        try:
            self.stats_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.stats_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
        except OSError as exc:
            log.warning("cannot write capture stats to %s: %s", self.stats_file, exc)

    @staticmethod
    def _time_encoders(writer: EpisodeWriter) -> dict[str, float]:
        """Measure encoder busy time per camera (for the encoding-speed diagnostic)."""
        acc: dict[str, float] = {}
        for key, cam in getattr(writer, "_cams", {}).items():
            enc = getattr(cam, "encoder", None)
            if enc is None:
                continue
            acc[key] = 0.0
            inner = enc.add

            def timed(frame: np.ndarray, _inner: Callable[[np.ndarray], None] = inner, _key: str = key) -> None:
                t = time.perf_counter()
                try:
                    _inner(frame)
                finally:
                    acc[_key] += time.perf_counter() - t

            enc.add = timed
        return acc
