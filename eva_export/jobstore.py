"""Job records and their on-disk store (one JSON file per job, replaced atomically), shared by
the export, upload and ingest services; ``jobs`` re-exports every name."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from .confine import check_job_id
from .errors import UnsafeNameError
from .fsutil import atomic_write_json, read_json
from .jsonbound import as_dict, as_int, as_str

log = logging.getLogger(__name__)
JOB_FILE_MODE = 0o600
#: A running process records its jobs at least this often, progress or not (JobEngine).
HEARTBEAT_S = 5.0
#: A running job whose record is older than this is shown as stalled: its process stopped
#: (SIGSTOP, a hung disk) or lost its clock; a few heartbeats missed, not one late write.
STALL_AFTER_S = 60.0
#: Longest text field of a job record (an error names a few paths; a path is at most 4 KiB).
JOB_TEXT_MAX = 64 << 10


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
    reencoded_episodes: int = 0  # export: v3.0 source episodes re-encoded (no exact stream-copy cut)
    nonfinite_cut_episodes: int = 0  # export: accepted episodes with NaN/inf exported as their finite runs
    nonfinite_dropped_frames: int = 0  # export: their frames left out (non-finite, or in a too-short run)
    nonfinite_kept_episodes: int = 0  # export: accepted episodes with NaN/inf kept as they are (keep policies)
    warning: str = ""  # export: what the user must know about a completed job (e.g. it will not train as is)
    attempts: int = 0  # upload: connection attempts so far
    last_error: str = ""  # upload: error of the last failed attempt, kept while retrying
    messages_done: int = 0  # ingest: bag messages read so far
    pid: int = 0  # the process running the job (0: not recorded), to detect a dead runner
    host: str = ""
    staging_dir: str = ""  # export: staging left by a failed job (reused or removed by the next run)
    staging_bytes: int = 0
    # when the process running it last recorded it (JobStore.save): bookkeeping, not the job's content
    heartbeat_at: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", JobState(self.state))  # a record's string -> the enum

    @classmethod
    def new(cls, kind: str, source_dir: str, fmt: str, **kw: Any) -> Job:
        job_id = f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        return cls(job_id=job_id, kind=kind, source_dir=source_dir, format=fmt, **kw)

    def to_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d["state"] = str(self.state)  # plain JSON strings on disk, as before
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        """The record with every known field of its exact type (ValueError naming the field);
        a count is an integer (not a boolean, float or string), a time a number, a text bounded."""
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        d = as_dict(d, "a job record")
        out: dict[str, Any] = {}
        for key, value in d.items():
            kind = kinds.get(key)
            if kind == "int":
                out[key] = as_int(value, key, 0)
            elif kind == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{key} is {type(value).__name__}, expected a number")
                out[key] = float(value)
            elif kind is not None:  # str, and the state's JobState (a str on disk)
                out[key] = as_str(value, key, JOB_TEXT_MAX)
                if key == "state" and value not in JOB_STATES:
                    raise ValueError(f"state is {value[:40]!r}, expected one of {', '.join(JOB_STATES)}")
        return cls(**out)

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
        """Record the job; a record of an unfinished job is its process's heartbeat."""
        d = job.to_dict()
        if not job.finished:
            d["heartbeat_at"] = time.time()
        with self._lock:
            # 0600: an upload job names the remote (user@host:port, key path, remote_dir), which
            # the service replies redact; the record on disk is for this account only
            atomic_write_json(self.path(job.job_id), d, JOB_FILE_MODE)

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
        host = socket.gethostname()
        for job in self.all():
            if job.pid and job.pid != os.getpid() and job.host == host and _alive(job.pid):
                continue  # run by another living process (the CLI beside the node): not ours to fail
            if not job.finished:
                job = dataclasses.replace(job, state=FAILED, finished_at=time.time(),
                                          error="interrupted: the node stopped before the job finished; start it again")
                try:
                    self.save(job)
                except OSError as exc:  # a full disk must not keep the node from starting
                    log.error("cannot record job %s as interrupted: %s", job.job_id, exc)
                out.append(job)
        return out


def stalled_for(job: Job, after_s: float = STALL_AFTER_S, now: float | None = None) -> float:
    """Seconds since the last heartbeat of a running job whose process stopped recording it
    for more than ``after_s``; 0.0 for any other job (and for records older than heartbeats)."""
    if job.state != RUNNING or job.heartbeat_at <= 0:
        return 0.0
    age = (time.time() if now is None else now) - job.heartbeat_at
    return age if age > after_s else 0.0


def state_text(job: Job, after_s: float = STALL_AFTER_S) -> str:
    """The job's state as a reader should see it: "running" becomes "stalled: ..." when its
    process stopped recording progress (the record's state stays running: it may resume)."""
    age = stalled_for(job, after_s)
    if not age:
        return str(job.state)
    runner = f" (process {job.pid} on {job.host})" if job.pid else ""
    return f"stalled: running, but no heartbeat for {age:.0f} s{runner}; it may be stopped or hung"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


