"""Upload jobs: the service shared by the upload node and the CLI.

``UploadService.start`` runs the gate (a refusal raises UploadRefused and creates no job),
records a Job(kind="upload") and transfers in a background thread that keeps the job's
file and byte progress up to date; the job ends ``completed`` with ``remote_path`` or
``failed`` with ``error``.

The transfer works from a hard-link snapshot of the accepted directory (snapshot.py), so a
re-export of the same format during the upload cannot mix two versions. ``Job.attempts``
counts the backend's connection attempts; ``Job.last_error`` holds the error of the last
failed attempt while it retries, and on completion also what the backend noted (resumed
into a leftover staging directory, removed other versions' leftovers, re-sent a corrupt copy).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import Config
from ..errors import EvaError, UploadRefused
from ..jobs import COMPLETED, FAILED, RUNNING, Job, JobStore
from .gate import check_upload, publish_name
from .sftp import UploadBackend, UploadCancelled, backend_for
from .snapshot import take_snapshot

SAVE_EVERY_S = 0.5  # progress is written to the job file at most this often
IDLE = "IDLE"
BUSY = "BUSY"


@dataclass(frozen=True)
class ServiceStatus:
    """What the node publishes on ~/status (JobQueueStatus)."""

    state: str  # IDLE or BUSY
    queued: int  # jobs waiting (uploads start at once, so always 0)
    running: int
    current: Job | None  # the running job, else the last finished one


class UploadService:
    """Gate, start and track upload jobs; jobs are stored in ``config.upload.jobs_dir``."""

    def __init__(self, config: Config, backend: UploadBackend | None = None,
                 on_change: Callable[[Job], None] | None = None) -> None:
        """Args:
        config: the loaded configuration.
        backend: override the configured backend (tests inject a failing one); when None the
            backend comes from collection.storage.sftp.
        on_change: called (from the job thread) after every recorded state change.
        """
        self.config = config
        self.sftp = config.collection.sftp
        self.backend = backend if backend is not None else backend_for(self.sftp)
        self.jobs = JobStore(config.upload.jobs_dir)
        self.export_jobs = JobStore(config.export.jobs_dir)
        self.interrupted = self.jobs.mark_interrupted()
        self._on_change = on_change
        self._lock = threading.Lock()
        self._running: dict[str, Job] = {}  # resolved accepted dir -> live job
        self._threads: dict[str, threading.Thread] = {}
        self._last: Job | None = None
        self._closing = threading.Event()

    # -- queries ----------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once ``close(cancel=True)`` was called."""
        return self._closing.is_set()

    def get(self, job_id: str = "") -> Job | None:
        """A job by id (live progress for a running one); empty id: the most recent job."""
        with self._lock:
            live = {j.job_id: j for j in self._running.values()}
            if job_id and job_id in live:
                return replace(live[job_id])
        if not job_id:
            return self.latest()
        return self.jobs.get(job_id)

    def latest(self) -> Job | None:
        with self._lock:
            if self._running:
                newest = max(self._running.values(), key=lambda j: (j.created_at, j.job_id))
                return replace(newest)
        return self.jobs.latest()

    def status(self) -> ServiceStatus:
        with self._lock:
            running = len(self._running)
            if running:
                current: Job | None = replace(
                    max(self._running.values(), key=lambda j: (j.created_at, j.job_id)))
            else:
                current = replace(self._last) if self._last else None
        if current is None:
            current = self.jobs.latest()
        return ServiceStatus(state=BUSY if running else IDLE, queued=0, running=running, current=current)

    # -- start ------------------------------------------------------------------------

    def start(self, source_dir: str, fmt: str, accepted_dir: str) -> Job:
        """Gate the request and start the upload thread; raise UploadRefused on a refusal."""
        with self._lock:  # gate and registration together: two starts cannot both pass
            if self._closing.is_set():
                raise UploadRefused("the upload service is shutting down")
            check_upload(source_dir, fmt, accepted_dir, self.export_jobs, self.sftp, set(self._running))
            name = publish_name(source_dir, fmt)
            if self.backend is None:  # only when sftp is configured and no backend could be made
                raise UploadRefused("no upload backend is configured; nothing was started")
            source = str(Path(source_dir).expanduser().resolve())
            target = str(Path(accepted_dir).expanduser().resolve())
            job = Job.new("upload", source, fmt, accepted_dir=target)
            self.jobs.save(job)
            self._running[target] = job
            thread = threading.Thread(target=self._run, args=(job, target, name),
                                      name=f"upload-{job.job_id}", daemon=False)
            self._threads[job.job_id] = thread
        self._changed(job)
        thread.start()
        return replace(job)

    def wait(self, job_id: str, timeout: float | None = None) -> Job | None:
        """Wait for a job's thread to end; return the job as recorded."""
        thread = self._threads.get(job_id)
        if thread is not None:
            thread.join(timeout)
        return self.get(job_id)

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Wait for running uploads; with ``cancel`` stop them first.

        A cancelled upload stops at its next progress report (at most every few MiB), removes
        its staging directory, publishes nothing and ends ``failed``. New starts are refused.
        """
        if cancel:
            self._closing.set()
        for thread in list(self._threads.values()):
            thread.join(timeout)

    # -- the job thread ---------------------------------------------------------------

    def _run(self, job: Job, target: str, name: str) -> None:
        assert self.backend is not None
        last_save = 0.0

        def progress(files_done: int, files_total: int, bytes_done: int, bytes_total: int) -> None:
            nonlocal last_save
            if self._closing.is_set():
                raise UploadCancelled("cancelled: the upload service is shutting down")
            with self._lock:
                job.files_done, job.files_total = files_done, files_total
                job.bytes_done, job.bytes_total = bytes_done, bytes_total
            now = time.monotonic()
            if now - last_save >= SAVE_EVERY_S or (files_done == files_total and bytes_done == bytes_total):
                last_save = now
                self._save(job)

        def on_attempt(attempt: int, previous_error: str) -> None:
            with self._lock:
                job.attempts = attempt
                if previous_error:
                    job.last_error = previous_error
            self._save(job)

        with self._lock:
            job.state = RUNNING
        self._save(job)
        snapshot = None
        try:
            # <export>/<format>/accepted -> snapshots live in <export>, on the same file system
            snapshot = take_snapshot(Path(target), Path(target).parent.parent, job.format, job.job_id)
            result = self.backend.upload(snapshot.path, name, progress, on_attempt)
        except EvaError as exc:
            self._finish(job, target, FAILED, error=str(exc))
        except Exception as exc:  # a bug must still end the job, not leave it running
            self._finish(job, target, FAILED, error=f"unexpected {type(exc).__name__}: {exc}")
        else:
            notes = list(getattr(result, "notes", ()))
            if notes:
                with self._lock:
                    job.last_error = "; ".join(([job.last_error] if job.last_error else []) + notes)
            self._finish(job, target, COMPLETED, remote_path=result.remote_path,
                         files=result.files, size=result.bytes)
        finally:
            if snapshot is not None:
                snapshot.close()

    def _finish(self, job: Job, target: str, state: str, error: str = "", remote_path: str = "",
                files: int | None = None, size: int | None = None) -> None:
        with self._lock:
            job.state = state
            job.error = error
            job.remote_path = remote_path
            if files is not None and size is not None:
                job.files_done = job.files_total = files
                job.bytes_done = job.bytes_total = size
            job.finished_at = time.time()
        self._save(job)  # recorded before the directory counts as free again
        with self._lock:
            self._running.pop(target, None)
            self._last = job

    def _save(self, job: Job) -> None:
        with self._lock:
            snapshot = replace(job)
        self.jobs.save(snapshot)
        self._changed(snapshot)

    def _changed(self, job: Job) -> None:
        if self._on_change is not None:
            try:
                self._on_change(replace(job))
            except Exception:  # a status publisher must not break the upload
                pass
