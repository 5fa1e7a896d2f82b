"""Job records, their on-disk store and the job engine shared by the export and upload services.

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
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from .confine import check_job_id
from .errors import EvaError, UnsafeNameError
from .fsutil import atomic_write_json, read_json, storage_error

log = logging.getLogger(__name__)

class JobState(StrEnum):
    """A job's state; the value is what the JSON record and the Job message carry."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # the process running it died (pid/host recorded); never resumed by itself


class JobKind(StrEnum):
    EXPORT = "export"
    UPLOAD = "upload"
    INGEST = "ingest"


QUEUED, RUNNING, COMPLETED, FAILED, INTERRUPTED = (JobState.QUEUED, JobState.RUNNING, JobState.COMPLETED,
                                                   JobState.FAILED, JobState.INTERRUPTED)
JOB_STATES = tuple(JobState)
FINISHED = frozenset({COMPLETED, FAILED, INTERRUPTED})


@dataclass(frozen=True)
class Job:
    """One export, upload or ingest job; field names match ``eva_export_interfaces/msg/Job``.

    Frozen: a change is ``dataclasses.replace(job, ...)``, so a job handed to another thread (a
    status message, a saved record) never changes under it.
    """

    job_id: str
    kind: str  # a JobKind value
    source_dir: str
    format: str
    state: JobState = QUEUED
    episodes_done: int = 0
    episodes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    accepted_dir: str = ""
    rejected_dir: str = ""
    accepted_episodes: int = 0
    accepted_frames: int = 0
    rejected_episodes: int = 0
    rejected_frames: int = 0
    reused_episodes: int = 0
    remote_path: str = ""
    error: str = ""
    created_at: float = field(default_factory=time.time)
    finished_at: float = 0.0
    unrated_episodes: int = 0  # export: no quality field and no verdict (rejected by the rule)
    attempts: int = 0  # upload: connection attempts so far
    last_error: str = ""  # upload: error of the last failed attempt, kept while retrying
    messages_done: int = 0  # ingest: bag messages read so far
    pid: int = 0  # the process running the job (0: not recorded), to detect a dead runner
    host: str = ""
    staging_dir: str = ""  # export: staging left by a failed job (reused or removed by the next run)
    staging_bytes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", JobState(self.state))  # a record's string -> the enum

    @classmethod
    def new(cls, kind: str, source_dir: str, fmt: str, **kw: Any) -> Job:
        job_id = f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        return cls(job_id=job_id, kind=kind, source_dir=source_dir, format=fmt, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["state"] = str(self.state)  # plain JSON strings on disk, as before
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict):
            raise TypeError("a job record is a JSON object")
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def claimed(self) -> Job:
        """This job with this process recorded as its runner (see JobStore.mark_dead_runners)."""
        return dataclasses.replace(self, pid=os.getpid(), host=socket.gethostname())


class JobStore:
    """Thread-safe store of job records in one directory."""

    def __init__(self, jobs_dir: Path) -> None:
        self.dir = Path(jobs_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.mark_dead_runners()

    def path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.json"

    def save(self, job: Job) -> None:
        with self._lock:
            atomic_write_json(self.path(job.job_id), job.to_dict())

    def get(self, job_id: str) -> Job | None:
        """The job record named ``job_id``; None for an invalid id, a missing file or a file
        that is not this job's record (ids are checked, so nothing outside ``dir`` is read)."""
        try:
            check_job_id(job_id)
        except UnsafeNameError:
            return None
        p = self.path(job_id)
        if not p.is_file() or p.is_symlink():
            return None
        try:
            job = Job.from_dict(read_json(p))
        except (OSError, ValueError, TypeError, AttributeError):
            return None  # a foreign or damaged JSON file is not a job
        return job if job.job_id == job_id else None

    def all(self) -> list[Job]:
        """Every recorded job, oldest first."""
        jobs = []
        for p in self.dir.glob("*.json"):
            try:
                jobs.append(Job.from_dict(read_json(p)))
            except (OSError, ValueError, TypeError):
                continue  # a foreign or damaged file is not a job
        jobs.sort(key=lambda j: (j.created_at, j.job_id))
        return jobs

    def latest(self) -> Job | None:
        jobs = self.all()
        return jobs[-1] if jobs else None

    def latest_completed(self, kind: str, source_dir: str, fmt: str) -> Job | None:
        """The newest completed job of ``kind`` for this source (resolved) and format."""
        want = str(Path(source_dir).resolve())
        best = None
        for job in self.all():
            if job.kind != kind or job.format != fmt or job.state != COMPLETED:
                continue
            if str(Path(job.source_dir).resolve()) != want:
                continue
            if best is None or job.finished_at >= best.finished_at:
                best = job
        return best

    def mark_dead_runners(self) -> list[Job]:
        """Mark ``interrupted`` the unfinished jobs whose recorded process is gone.

        Runs whenever a process opens the store (CLI or node), so a killed ``eva-export
        export`` does not leave its job ``running`` forever. Only jobs of this host with a
        recorded pid are judged; a pid that is alive (possibly reused) is left alone.
        """
        out = []
        host = socket.gethostname()
        for job in self.all():
            if job.finished or not job.pid or job.host != host or _alive(job.pid):
                continue
            job = dataclasses.replace(
                job, state=INTERRUPTED, finished_at=time.time(),
                error=(f"interrupted: process {job.pid} on {job.host} died before the job finished; "
                       "start the export again (its staging is reused)"))
            try:
                self.save(job)
            except OSError:
                continue  # a read-only store: report it as it is
            out.append(job)
        return out

    def mark_interrupted(self) -> list[Job]:
        """Fail the jobs a previous process left queued or running (called at start-up)."""
        out = []
        for job in self.all():
            if not job.finished:
                job = dataclasses.replace(job, state=FAILED, finished_at=time.time(),
                                          error="interrupted: the node stopped before the job finished; start it again")
                try:
                    self.save(job)
                except OSError as exc:  # a full disk must not keep the node from starting
                    log.error("cannot record job %s as interrupted: %s", job.job_id, exc)
                out.append(job)
        return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


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
JobBody = Callable[[str], Mapping[str, Any] | None]
#: Given the failed job, the fields to add to it (e.g. the staging it leaves).
OnFailure = Callable[["Job"], Mapping[str, Any]]


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
                 crash_prefix: str = "", on_change: Callable[[Job], None] | None = None) -> None:
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
        self.update(job_id, state=RUNNING, **self._claim_fields())
        changes: dict[str, Any]
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

    def _claim_fields(self) -> dict[str, Any]:
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
            threads = [t for t in (self._worker, *self._threads.values()) if t is not None]
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
