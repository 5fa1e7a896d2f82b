"""The ROS-free capture engine's lifecycle: intake queue, align worker, save worker.

The per-episode work itself (checks, alignment, decoding, writing, commit) is
``EpisodeRun`` (episode.py), shared with bag ingest; payloads and decoding are in intake.py,
per-stream state in stream.py.

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

import dataclasses
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import confine
from ..config import CollectionConfig, check_name
from ..dataset.meta import INFO, read_info, read_meta
from ..dataset.records import EpisodeRow
from ..dataset.writer import DatasetWriter
from ..errors import ConfigError, DatasetError, EvaError, UnsafeNameError
from ..fsutil import storage_guard
from ..jobs import Job, JobEngine, JobStore
from .align import GridAligner
from .checks import EpisodeChecker, QualityResult
from .episode import EpisodeRun
from .features import capture_features, video_settings
from .intake import ImageDecoder, RawImage, RawVector, StreamSpec, fingerprint, streams_from_config
from .room import start_refusal, stop_refusal
from .stream import states_for

__all__ = ["ImageDecoder", "RawImage", "RawVector", "Recorder", "StreamSpec", "fingerprint",
           "streams_from_config"]

log = logging.getLogger(__name__)

#: Seconds after START before the grid starts without a stream that never delivered.
START_GRACE_S = 1.0
#: Received-but-unprocessed frames allowed per camera before new ones count as overflow.
INTAKE_FRAMES_PER_CAMERA = 45
INTAKE_ITEMS = 20000
STOP_WAIT_S = 15.0


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


@dataclass
class _SaveJob:
    ep: EpisodeRun
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
        self._lock = threading.Lock()  # counters and state shared with offer()
        self._state = states_for(self.streams)  # one object per stream (counters, clock offset, decoder)
        self._epoch = 0
        self._accepting = False
        self._episode: EpisodeRun | None = None
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
        self._closed = threading.Event()
        self._ingesting = ""  # the running ingest job's id ("" = none): START is refused meanwhile
        self._jobs: JobEngine | None = None
        self.recovered = self.recover_datasets()
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
    def _writer_for(self, name: str, create: bool) -> DatasetWriter | None:
        root = self.col.dataset_dir(name)
        with self._writers_lock:
            dw = self._writers.get(name)
            if dw is not None:
                if create:  # it may have been opened at start-up with the features on disk
                    dw.check_matches(self.col.fps, self.features)
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
            dw = self._writer_for(spec.dataset_name, create=True)
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

    # ---- bag ingest (same EpisodeRun path as live capture) -------------------------------------
    @property
    def jobs(self) -> JobEngine:
        """Ingest jobs on the same engine as export and upload jobs (states, claims, saves);
        a job a previous process left unfinished is failed as interrupted when it opens."""
        if self._jobs is None:
            self._jobs = JobEngine(JobStore(self.col.log_dir / ".jobs" / "ingest"), name="ingest", claim=True)
        return self._jobs

    def ingest_roots(self) -> list[Path]:
        return [Path(r).expanduser().absolute() for r in self.col.capture.ingest_roots] or [self.col.log_dir]

    def ingest(self, bag_path: str, dataset_name: str = "", task: str = "", episodes: str = "") -> Job:
        """Check the request and the bag, then ingest it in a background thread; returns the job.

        Raises EvaError (with the reason) when refused: recording, another ingest running, a
        bag outside the ingest roots, a bag that is not a ROS 2 MCAP bag, a missing topic.
        """
        from .ingest import BagIngest

        confine.check_request_path(bag_path, "bag_path")
        path = Path(bag_path)
        roots = self.ingest_roots()
        if not path.is_absolute() or not any(confine.is_inside(r, path) for r in roots):
            raise UnsafeNameError(f"bag_path {confine.short_repr(bag_path)} is not inside the ingest roots "
                                  f"{[str(r) for r in roots]} (collection.capture.ingest_roots)")
        with self._lock:
            if self._episode is not None or self._save_depth:
                raise EvaError("an episode is being recorded or saved; ingest when capture is idle")
            if self._ingesting:
                raise EvaError(f"another bag is being ingested (job {self._ingesting})")
            self._ingesting = "starting"
        try:
            job = Job.new("ingest", str(path), "lerobot_v21")
            job_id = job.job_id
            ing = BagIngest(self.col, path, dataset_name, task, episodes, roots=roots,
                            writer_for=lambda name: self._writer_for(name, create=True),
                            progress=lambda p: self._ingest_progress(job_id, p))
            job = self.jobs.add(dataclasses.replace(job, accepted_dir=str(self.col.dataset_dir(ing.dataset_name)),
                                                    bytes_total=ing.progress.bytes_total))
        except BaseException:
            with self._lock:
                self._ingesting = ""
            raise
        with self._lock:
            self._ingesting = job_id
        threading.Thread(target=self._run_ingest, args=(job_id, ing), name="capture-ingest", daemon=True).start()
        return job

    def _ingest_progress(self, job_id: str, p: Any) -> None:
        self.jobs.update(job_id, messages_done=p.messages_done, episodes_done=p.episodes_done,
                         bytes_done=p.bytes_done,
                         accepted_episodes=sum(1 for e in p.episodes if e["quality"] == "green"),
                         rejected_episodes=sum(1 for e in p.episodes if e["quality"] == "red"),
                         reused_episodes=p.episodes_skipped)
        self.jobs.save(job_id)

    def _run_ingest(self, job_id: str, ing: Any) -> None:
        def body(_job_id: str) -> dict[str, Any]:
            res = ing.run()
            self._ingest_progress(job_id, res)
            self.last_message = res.message
            return {"last_error": res.damage}

        try:
            job = self.jobs.execute(job_id, body)  # RUNNING (claimed), then COMPLETED or FAILED with the reason
            if job.error:
                self.last_message = f"ingest failed: {job.error}"
        finally:
            with self._lock:
                self._ingesting = ""

    def wait_ingested(self, timeout: float = 120.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self._ingesting:
                return True
            time.sleep(0.05)
        return False

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
                      f"ingesting a bag (job {self._ingesting})" if self._ingesting else self.last_message)

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
            with self._lock:
                pending = self._pending.get(ep.dataset_name, 0)
                expected = ep.dw.next_episode_index + pending
                self._pending[ep.dataset_name] = pending + 1
                self._save_depth += 1
                depth = self._save_depth
            self._save_q.put(_SaveJob(ep, rows, expected, ep.t_stop, latency, overflow))
            msg = f"episode of {rows} frames queued for saving as episode {expected}"
            if depth > 1:
                log.warning("saving falls behind: %d episodes waiting (capacity %d)", depth,
                            self.col.capture.save_queue_size)
                msg += f"; warning: {depth} episodes waiting to be saved"
            ep.result = StopResult(True, msg, expected, rows, depth)
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
                with storage_guard(ep.dw.root, f"saving episode {job.expected_index} into"):
                    row, result = ep.save()
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
                self.last_quality, self.last_message = "failed", (f"saving episode {job.expected_index} failed, it is "
                                                                  f"not in the dataset: {exc}")
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
        encode_s = ep.writer.encode_seconds()
        enc = {k: (duration / v if v > 0 else math.inf) for k, v in encode_s.items()}
        rec = {"dataset": ep.dataset_name, "episode_index": row.episode_index, "frames": row.length,
               "duration_s": duration, "quality": result.quality, "codes": result.codes,
               "stream_stats": result.stream_stats, "callback_latency": lat,
               "stop_to_durable_s": committed - job.stopped_at, "save_s": committed - t_begin,
               "encode_seconds": encode_s, "encode_speed_x_realtime": enc,
               "intake_overflow": job.overflow}
        try:
            self.stats_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.stats_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
        except OSError as exc:
            log.warning("cannot write capture stats to %s: %s", self.stats_file, exc)
