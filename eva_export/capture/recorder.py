"""The ROS-free capture engine's lifecycle: intake queue, align worker, save worker.

The per-episode work itself (checks, alignment, decoding, writing, commit) is
``EpisodeRun`` (episode.py), shared with bag ingest; payloads and decoding are in intake.py,
per-stream state in stream.py. Recorder's parts: the replies in results.py, the open dataset
writers in writer_cache.py, the save worker in save_worker.py, bag ingest jobs in ingest_jobs.py.

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

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import CollectionConfig, check_name
from ..errors import ConfigError, EvaError
from ..formats.common.records import EpisodeRow
from ..jobs import JobEngine
from .align import GridAligner
from .checks import EpisodeChecker
from .episode import EpisodeRun
from .features import capture_features, video_settings
from .ingest_jobs import IngestJobs
from .intake import ImageDecoder, RawImage, RawVector, StreamSpec, fingerprint, streams_from_config
from .results import CancelResult, StartResult, Status, StopResult, StreamStatus
from .room import start_refusal, stop_refusal
from .save_worker import SaveJob, SaveWorker, save_seam
from .stream import states_for
from .writer_cache import DatasetWriters

__all__ = ["INTAKE_FRAMES_PER_CAMERA", "INTAKE_ITEMS", "START_GRACE_S", "STOP_WAIT_S", "CancelResult", "ImageDecoder",
           "RawImage", "RawVector", "Recorder", "StartResult", "Status", "StopResult", "StreamSpec", "StreamStatus",
           "fingerprint", "streams_from_config"]

log = logging.getLogger(__name__)

#: Seconds after START before the grid starts without a stream that never delivered.
START_GRACE_S = 1.0
#: Received-but-unprocessed frames allowed per camera before new ones count as overflow.
INTAKE_FRAMES_PER_CAMERA = 45
INTAKE_ITEMS = 20000
STOP_WAIT_S = 15.0


class Recorder(IngestJobs, SaveWorker):
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
        self.save_delay_s, self.save_hold = save_seam()  # the test seam (save_worker.py)
        self._lock = threading.Lock()  # counters and state shared with offer()
        self._state = states_for(self.streams)  # one object per stream (counters, clock offset, decoder)
        self._epoch = 0
        self._accepting = False
        self._episode: EpisodeRun | None = None
        self._last_checker: EpisodeChecker | None = None
        self._last_aligner: GridAligner | None = None
        self._intake: queue.Queue[tuple[int, int, float, float | None, Any, float | None] | None] = \
            queue.Queue(INTAKE_ITEMS)
        self.datasets = DatasetWriters(col, self.features, self.video)
        self._save_q: queue.Queue[SaveJob | None] = queue.Queue()
        self._save_depth = 0
        self.last_index = -1
        self.last_take_id = ""
        self.last_quality = ""
        self.last_message = ""
        self._closed = threading.Event()
        self._ingesting = ""  # the running ingest job's id ("" = none): START is refused meanwhile
        self._jobs: JobEngine | None = None
        self.recovered = self.recover_datasets()
        if self.recovered:  # on the status topic too: it names the promised takes a crash lost
            self.last_message = "recovered at start-up: " + "; ".join(
                f"{name}: {'; '.join(done)}" for name, done in self.recovered.items())
        self._align_thread = threading.Thread(target=self._align_loop, name="capture-align", daemon=True)
        self._save_thread = threading.Thread(target=self._save_loop, name="capture-save", daemon=True)
        self._align_thread.start()
        self._save_thread.start()

    # ---- intake (subscription callbacks) ------------------------------------------------------
    def offer(self, i: int, recv: float, stamp: float | None, payload: Any) -> None:
        """Count and enqueue one message; never blocks. Called from subscription callbacks."""
        st = self._state[i]
        with self._lock:
            st.received += 1
            t_src = st.offset.observe(recv, stamp)  # unstamped: its source time
            if not self._accepting:
                return
            if st.spec.is_camera:
                if st.inflight >= INTAKE_FRAMES_PER_CAMERA:
                    st.overflow += 1
                    return
                st.inflight += 1
            epoch = self._epoch
        try:
            self._intake.put_nowait((epoch, i, recv, stamp, payload, t_src))
        except queue.Full:
            with self._lock:
                st.overflow += 1
                if st.spec.is_camera:
                    st.inflight -= 1

    def note_latency(self, i: int, seconds: float) -> None:
        """Duration of one subscription callback (kept per episode, for diagnostics)."""
        if self._accepting:
            self._state[i].latency.append(seconds)

    # ---- datasets ------------------------------------------------------------------------------
    def recover_datasets(self) -> dict[str, list[str]]:
        """Recover every configured dataset that exists, before any request is served, so
        readers (list_episodes, exports, LeRobot) never see the state a crash left."""
        return self.datasets.recover_all()

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
            if self._ingesting:
                return StartResult(False, f"refused: a bag is being ingested (job {self._ingesting}); "
                                          f"wait for it to finish", spec.dataset_name, str(root), spec.task)
            if self._episode is not None:
                state = "still being stopped" if self._episode.t_stop is not None else "already recording"
                return StartResult(False, f"refused: an episode is {state}", spec.dataset_name, str(root),
                                   spec.task)
            if self._save_depth >= self.col.capture.save_queue_size:
                return StartResult(False, f"refused: the save queue is full ({self._save_depth}/"
                                          f"{self.col.capture.save_queue_size} episodes waiting); "
                                          f"wait for saving to catch up", spec.dataset_name, str(root), spec.task)
        if why := start_refusal(self.col, root):
            return StartResult(False, why, spec.dataset_name, str(root), spec.task)
        try:
            dw = self.datasets.writer_for(spec.dataset_name, create=True)
            assert dw is not None
            writer = dw.begin_episode(spec.task)
        except (EvaError, OSError) as exc:
            return StartResult(False, f"refused: cannot open dataset {root}: {exc}", spec.dataset_name,
                               str(root), spec.task)
        now = self.clock()
        with self._lock:
            ep = EpisodeRun.begin(self.col, self._state, dw, spec.dataset_name, spec.task, now,
                                  self.wall() - now, epoch=self._epoch + 1, grace_s=self.start_grace_s,
                                  writer=writer)
            self._epoch = ep.epoch
            self._episode = ep
            self._last_checker = ep.checker
            self._last_aligner = ep.aligner
            self._accepting = True
        self._intake.put(None)  # wake the worker
        silent = [st.spec.name for st in self._state if st.received == 0]
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
        return self.datasets.list_episodes(dataset_name)

    def review(self, dataset_name: str, episode_index: int, verdict: str, note: str | None,
               take_id: str = "") -> EpisodeRow:
        """Review by index; with ``take_id`` (STOP's), only if that index holds that take."""
        return self.datasets.review(dataset_name, episode_index, verdict, note, take_id)

    def status(self) -> Status:
        with self._lock:
            ep = self._episode
            received = [st.received for st in self._state]
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
                      f"ingesting a bag (job {self._ingesting})" if self._ingesting else self.last_message,
                      self.last_take_id)

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
        """Discard an episode being recorded, finish queued saves and a running ingest, stop the workers."""
        self.wait_ingested(timeout)
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
                    if self.streams[i].is_camera:
                        with self._lock:
                            self._state[i].inflight -= 1
                    if ep is not None and epoch == ep.epoch and not ep.cancel:
                        ep.push(i, recv, stamp, payload, t_src)
                if ep is None:
                    continue
                if ep.cancel:
                    self._abort(ep)
                    continue
                now = self.clock()
                if ep.t_stop is not None and ep.aligner.t_stop is None:
                    ep.aligner.stop(ep.t_stop)
                if not self._intake.qsize():  # caught up: clock-driven slots are safe to emit
                    ep.poll(now)
                if ep.t_stop is not None and (ep.aligner.done() or
                                              now > ep.t_stop + ep.aligner.tol + ep.aligner.stop_budget + 0.05):
                    if self._intake.qsize() and now < ep.t_stop + 2.0:
                        continue  # drain what was received before STOP first
                    ep.finish_slots()
                    self._finalize(ep)
            except Exception as exc:
                log.exception("capture worker failed")
                if ep is not None and not ep.finalized.is_set():
                    self.last_quality, self.last_message = "failed", f"episode failed: {exc}"
                    self._abort(ep, failed=str(exc))

    def _finalize(self, ep: EpisodeRun) -> None:
        rows = ep.writer.rows
        with self._lock:
            self._accepting = False
            latency = {st.spec.name: list(st.latency) for st in self._state}
            overflow = ep.note_overflow()
        assert ep.t_stop is not None
        if rows == 0:
            ep.writer.abort()
            silent = [s.name for i, s in enumerate(self.streams) if ep.checker.streams[i].received == 0]
            why = f"; never received: {silent}" if silent else ""
            ep.result = StopResult(True, f"zero-frame episode: nothing written{why}", -1, 0, self._save_depth)
            self.last_quality, self.last_message = "empty", ep.result.message
        elif lost := stop_refusal(ep.dw.root, ep.dw.info, ep.writer):  # never "queued" for a save that cannot fit
            ep.writer.abort()
            ep.result = StopResult(False, f"{lost}; the episode ({rows} frames) was discarded", -1, rows,
                                   self._save_depth)
            self.last_quality, self.last_message = "failed", ep.result.message
        else:
            # promised under the dataset writer's lock and kept with the take: its save commits
            # exactly this index, whatever the backlog or a failed save before it
            expected = ep.dw.reserve_index(ep.writer)
            with self._lock:
                self._save_depth += 1
                depth = self._save_depth
            self._save_q.put(SaveJob(ep, rows, expected, ep.t_stop, latency, overflow))
            msg = f"episode of {rows} frames queued for saving as episode {expected} (take {ep.writer.staging.name})"
            if depth > 1:
                log.warning("saving falls behind: %d episodes waiting (capacity %d)", depth,
                            self.col.capture.save_queue_size)
                msg += f"; warning: {depth} episodes waiting to be saved"
            ep.result = StopResult(True, msg, expected, rows, depth, ep.writer.staging.name)
        with self._lock:
            self._episode = None
        ep.finalized.set()

    def _abort(self, ep: EpisodeRun, failed: str = "") -> None:
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
