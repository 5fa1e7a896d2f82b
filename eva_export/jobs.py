"""The job engine shared by the export, upload and ingest services, and (re-exported from
jobstore.py) the job records and their on-disk store.

Each job is one JSON file ``<jobs_dir>/<job_id>.json``, replaced atomically on every
state change, so after a restart the latest completed export of a source and format is
still known (the upload gate depends on it).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .errors import EvaError
from .fsutil import storage_error
from .jobstore import (
    COMPLETED,
    FAILED,
    FINISHED,
    HEARTBEAT_S,
    INTERRUPTED,
    JOB_STATES,
    QUEUED,
    RUNNING,
    STALL_AFTER_S,
    Job,
    JobKind,
    JobState,
    JobStore,
    stalled_for,
    state_text,
)

log = logging.getLogger(__name__)

__all__ = [
    "BUSY",
    "COMPLETED",
    "FAILED",
    "FINISHED",
    "HEARTBEAT_S",
    "IDLE",
    "INTERRUPTED",
    "JOB_STATES",
    "QUEUED",
    "RUNNING",
    "STALL_AFTER_S",
    "Job",
    "JobEngine",
    "JobKind",
    "JobState",
    "JobStore",
    "QueuePolicy",
    "ServiceStatus",
    "stalled_for",
    "state_text",
]

# ---- the job engine ---------------------------------------------------------------------------

IDLE = "IDLE"
BUSY = "BUSY"


class QueuePolicy(StrEnum):
    SERIAL = "serial"  # one worker thread runs the jobs one at a time, in order
    PARALLEL = "parallel"  # every job gets its own thread, started at once


@dataclass(frozen=True)
class ServiceStatus:
    """What a job node publishes on ~/status (JobQueueStatus)."""

    state: str  # IDLE or BUSY
    queued: int  # jobs waiting for the worker
    running: int
    current: Job | None  # the newest running job, else the last finished one


#: A job's work, given the job id; returns the fields to set when it completes.
JobBody = Callable[[str], Mapping[str, object] | None]
#: Given the failed job, the fields to add to it (e.g. the staging it leaves).
OnFailure = Callable[["Job"], Mapping[str, object]]


class JobEngine:
    """Live jobs of one service: queue policy, frozen snapshots, throttled saves, recovery, status.

    Knows nothing about what a job does: a service registers a job (``add``), hands the engine
    a body (``submit`` / ``execute``) and reports progress through ``update``/``count`` +
    ``save``. Every job the engine holds is a frozen ``Job``; readers get the current snapshot.
    ``lock`` is reentrant: a service may hold it around its own checks and ``add`` (two equal
    requests cannot both pass).
    """

    def __init__(self, store: JobStore, *, name: str, policy: QueuePolicy = QueuePolicy.SERIAL,
                 save_period_s: float = 0.25, recover: bool = True, claim: bool = False,
                 crash_prefix: str = "", on_change: Callable[[Job], None] | None = None,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        """Args:
        store: where the records live.
        name: for thread names and log lines ("export", "upload").
        policy: SERIAL (one worker, FIFO) or PARALLEL (a thread per job).
        save_period_s: ``save`` without ``force`` writes a job at most this often.
        recover: fail the jobs a previous process left unfinished (``self.interrupted``).
        claim: record this process (pid/host) in a running job, so that a later JobStore marks
            it interrupted if the process dies.
        crash_prefix: put before "<Type>: <message>" of an unexpected exception in ``error``.
        on_change: called with the snapshot after every save (from the job's thread).
        heartbeat_s: a running job is recorded at least this often, progress or not, so a
            reader of the store tells a stopped process (``stalled_for``) from a slow step.
        """
        self.store = store
        self.name = name
        self.policy = policy
        self.save_period_s = save_period_s
        self.claim = claim
        self.crash_prefix = crash_prefix
        self.on_change = on_change
        self.lock = threading.Condition(threading.RLock())
        self._jobs: dict[str, Job] = {}
        self._queue: collections.deque[tuple[str, JobBody, OnFailure | None]] = collections.deque()
        self._active: set[str] = set()  # submitted, not queued any more, not finished
        self._threads: dict[str, threading.Thread] = {}
        self._worker: threading.Thread | None = None
        self._last: str | None = None
        self._stop = False
        self._saved_at: dict[str, float] = {}
        self.heartbeat_s = heartbeat_s
        self._heartbeat: threading.Thread | None = None
        self.interrupted: list[Job] = store.mark_interrupted() if recover else []
        for job in self.interrupted:
            log.warning("%s job %s was interrupted by a restart: marked failed", name, job.job_id)

    # ---- registration and execution -----------------------------------------------------------
    def add(self, job: Job) -> Job:
        """Hold and record a new job. When the record cannot be written (a full disk) the job is
        not held either: a refused request leaves no phantom "queued" job behind."""
        with self.lock:
            self._jobs[job.job_id] = job
            try:
                self._save_now(job)
            except OSError as exc:
                del self._jobs[job.job_id]
                raise storage_error(self.store.path(job.job_id), exc, f"recording {self.name} job") from exc
        return job

    def start_worker(self) -> None:
        """SERIAL: start the worker thread (a service without one runs jobs with ``execute``)."""
        with self.lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name=f"{self.name}-worker", daemon=True)
                self._worker.start()

    @property
    def has_worker(self) -> bool:
        return self._worker is not None

    def submit(self, job_id: str, body: JobBody, on_failure: OnFailure | None = None) -> None:
        """Run ``body`` for a held job (see ``execute``): queued for the worker (SERIAL) or on
        its own thread (PARALLEL)."""
        with self.lock:
            if self.policy is QueuePolicy.SERIAL:
                self._queue.append((job_id, body, on_failure))
                self.lock.notify_all()
                return
            self._active.add(job_id)
            thread = threading.Thread(target=self.execute, args=(job_id, body, on_failure),
                                      name=f"{self.name}-{job_id}", daemon=False)
            self._threads[job_id] = thread
        thread.start()

    def execute(self, job_id: str, body: JobBody, on_failure: OnFailure | None = None) -> Job:
        """Run a job in this thread: RUNNING, then COMPLETED with what ``body`` returned, or
        FAILED with the error (an EvaError's message; anything else as ``<Type>: <message>``).
        ``on_failure`` adds fields to a failed job (e.g. the staging it leaves)."""
        with self.lock:
            self._active.add(job_id)
            if self._heartbeat is None:
                self._heartbeat = threading.Thread(target=self._beat, name=f"{self.name}-heartbeat", daemon=True)
                self._heartbeat.start()
        self.update(job_id, state=RUNNING, **self._claim_fields())
        changes: dict[str, object]
        try:
            self._save_or_fail(job_id)
            changes = {"state": COMPLETED, **(body(job_id) or {})}
        except EvaError as exc:
            changes = {"state": FAILED, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a job never takes its thread (or the worker) down
            log.exception("%s job %s crashed", self.name, job_id)
            changes = {"state": FAILED, "error": f"{self.crash_prefix}{type(exc).__name__}: {exc}"}
        if changes["state"] == FAILED and on_failure is not None:
            changes.update(on_failure(self.job(job_id)))
        return self.finish(job_id, **changes)

    def _claim_fields(self) -> dict[str, object]:
        return {"pid": os.getpid(), "host": socket.gethostname()} if self.claim else {}

    def _save_or_fail(self, job_id: str) -> None:
        try:
            self.save(job_id, force=True)
        except OSError as exc:
            raise storage_error(self.store.path(job_id), exc, f"recording {self.name} job") from exc

    def finish(self, job_id: str, **changes: Any) -> Job:
        """Set the final fields and record them before the job stops counting as active. A record
        that cannot be written (a full disk) is said in the held job's error; it never raises."""
        with self.lock:
            job = self.update(job_id, finished_at=time.time(), **changes)
            try:
                self._save_now(job)
            except OSError as exc:
                note = str(storage_error(self.store.path(job_id), exc, "recording the finished job"))
                log.error("%s job %s: %s", self.name, job_id, note)
                job = self.update(job_id, error=f"{job.error}; {note}" if job.error else note)
            self._active.discard(job_id)
            self._last = job_id
            self.lock.notify_all()
        return job

    def _beat(self) -> None:
        """Record each running job that was not recorded for ``heartbeat_s``. Under the lock:
        a heartbeat never writes a running snapshot over the record ``finish`` just wrote."""
        with self.lock:
            while not self._stop:
                self.lock.wait(self.heartbeat_s)
                now = time.monotonic()
                for job_id in list(self._active):
                    job = self._jobs.get(job_id)
                    if job is None or job.state != RUNNING or now - self._saved_at.get(job_id, 0.0) < self.heartbeat_s:
                        continue
                    self._saved_at[job_id] = now
                    try:
                        self._save_now(job)
                    except OSError as exc:  # a full disk: the job itself says so when it saves
                        log.warning("%s job %s: heartbeat not recorded: %s", self.name, job_id, exc)

    def _work(self) -> None:
        while True:
            with self.lock:
                while not self._queue and not self._stop:
                    self.lock.wait()
                if self._stop:
                    return
                job_id, body, on_failure = self._queue.popleft()
                self._active.add(job_id)
            self.execute(job_id, body, on_failure)

    # ---- progress -------------------------------------------------------------------------------
    def job(self, job_id: str) -> Job:
        """The held job's current snapshot (KeyError for one this engine does not hold)."""
        with self.lock:
            return self._jobs[job_id]

    def update(self, job_id: str, **changes: Any) -> Job:
        """Replace fields of a held job; returns the new snapshot."""
        with self.lock:
            job = dataclasses.replace(self._jobs[job_id], **changes)
            self._jobs[job_id] = job
            return job

    def count(self, job_id: str, **deltas: int) -> Job:
        """Add to counters of a held job (``episodes_done=1, bytes_done=n``)."""
        with self.lock:
            job = self._jobs[job_id]
            return self.update(job_id, **{k: getattr(job, k) + v for k, v in deltas.items()})

    def save(self, job_id: str, force: bool = False) -> None:
        """Record the job's snapshot; without ``force`` at most every ``save_period_s``."""
        now = time.monotonic()
        if force or now - self._saved_at.get(job_id, 0.0) >= self.save_period_s:
            self._saved_at[job_id] = now
            self._save_now(self.job(job_id))

    def _save_now(self, job: Job) -> None:
        self.store.save(job)
        if self.on_change is not None:
            try:
                self.on_change(job)
            except Exception:  # noqa: BLE001 - a status publisher must not break the job
                log.exception("%s job %s: on_change failed", self.name, job.job_id)

    # ---- queries --------------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        """A held job's live snapshot, else the stored record (None for an unknown or invalid id)."""
        with self.lock:
            job = self._jobs.get(job_id)
        return job if job is not None else self.store.get(job_id)

    def _newest(self, ids: Iterable[str]) -> Job | None:
        jobs = [self._jobs[i] for i in ids]
        return max(jobs, key=lambda j: (j.created_at, j.job_id)) if jobs else None

    def latest(self) -> Job | None:
        """The newest job this engine holds, else the newest stored one."""
        with self.lock:
            job = self._newest(self._jobs)
        return job if job is not None else self.store.latest()

    def unfinished(self) -> list[Job]:
        """The held jobs that are queued or running."""
        with self.lock:
            return [j for j in self._jobs.values() if not j.finished]

    def status(self, fall_back_to_store: bool = False) -> ServiceStatus:
        """IDLE/BUSY, queue length, running count and the job to show (newest running, else the
        last finished; else, with ``fall_back_to_store``, the newest stored one)."""
        with self.lock:
            current = self._newest(self._active)
            if current is None and self._last is not None:
                current = self._jobs[self._last]
            busy = bool(self._active or self._queue)
            status = ServiceStatus(BUSY if busy else IDLE, len(self._queue), len(self._active), current)
        if status.current is None and fall_back_to_store:
            status = dataclasses.replace(status, current=self.store.latest())
        return status

    def wait(self, job_id: str, timeout: float | None = None) -> Job | None:
        """Wait until a held job finished (and its own thread ended); the job as it is then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while True:
                job = self._jobs.get(job_id)
                if job is None or job.finished:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return job
                self.lock.wait(left if left is not None else 1.0)
            thread = self._threads.get(job_id)
        if thread is not None:  # the body's cleanup after finish() (e.g. a snapshot removed)
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.get(job_id)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the worker (queued jobs stay queued: the next start marks them failed) and wait
        for running jobs' threads, each up to ``timeout``."""
        with self.lock:
            self._stop = True
            self.lock.notify_all()
            threads = [t for t in (self._worker, self._heartbeat, *self._threads.values()) if t is not None]
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
