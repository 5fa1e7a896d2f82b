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

import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..config import Config
from ..errors import UploadRefused
from ..fsutil import LockHeld, take_lock
from ..jobs import Job, JobEngine, JobKind, JobStore, QueuePolicy, ServiceStatus

# the shipped backend loads with the service: a node pays paramiko's import at start, not in its first upload
from . import sftp  # noqa: F401
from .backends import backend_for
from .gate import check_upload, publish_name
from .job import UploadBackend, UploadCancelled
from .snapshot import take_snapshot

SAVE_EVERY_S = 0.5  # progress is written to the job file at most this often


def claim_upload(accepted: Path, fmt: str) -> int:
    """Hold ``<export>/.uploading-<fmt>.lock`` for one upload; refuse while another holds it.

    One accepted subset is one remote version: two uploaders (the node and ``eva-export
    upload``) would write into the same remote staging directory and publish two copies. flock
    belongs to the open file, so a second upload in the same process is refused too, and the
    kernel drops the lock of a killed process: no stale lock.
    """
    path = accepted.parent.parent / f".uploading-{fmt}.lock"
    try:
        return take_lock(path)
    except LockHeld as exc:
        raise UploadRefused(f"{accepted} is being uploaded already (process {exc.holder}); wait for that "
                            "upload to finish, its job shows the progress") from exc
    except OSError as exc:
        raise UploadRefused(f"cannot create the upload lock {path}: {exc.strerror or exc}") from exc


class UploadService:
    """Gate, start and track upload jobs; jobs are stored in ``config.upload.jobs_dir``."""

    def __init__(self, config: Config, backend: UploadBackend | None = None,
                 on_change: Callable[[Job], None] | None = None) -> None:
        """Args:
        config: the loaded configuration.
        backend: override the configured backend (tests inject a failing one); when None the
            backend is the registered one (backends.py) whose section collection.storage has.
        on_change: called (from the job thread) after every recorded state change.
        """
        self.config = config
        self.sftp = config.collection.sftp
        self.backend = backend if backend is not None else backend_for(config.collection)
        self.export_jobs = JobStore(config.export.jobs_dir)
        # Uploads start at once, each on its own thread (different accepted dirs in parallel).
        self.engine = JobEngine(JobStore(config.upload.jobs_dir), name="upload", policy=QueuePolicy.PARALLEL,
                                save_period_s=SAVE_EVERY_S, crash_prefix="unexpected ", on_change=on_change,
                                claim=True)  # the pid in a running job: another process leaves it alone
        self.jobs = self.engine.store
        self.interrupted = self.engine.interrupted
        self._closing = threading.Event()

    # -- queries ----------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once ``close(cancel=True)`` was called."""
        return self._closing.is_set()

    def get(self, job_id: str = "") -> Job | None:
        """A job by id (live progress for a running one); empty id: the most recent job."""
        return self.engine.get(job_id) if job_id else self.latest()

    def latest(self) -> Job | None:
        return self.engine.latest()

    def status(self) -> ServiceStatus:
        return self.engine.status(fall_back_to_store=True)

    # -- start ------------------------------------------------------------------------

    def start(self, source_dir: str, fmt: str, accepted_dir: str) -> Job:
        """Gate the request and start the upload thread; raise UploadRefused on a refusal."""
        with self.engine.lock:  # gate and registration together: two starts cannot both pass
            if self._closing.is_set():
                raise UploadRefused("the upload service is shutting down")
            running = {j.accepted_dir for j in self.engine.unfinished()}
            check_upload(source_dir, fmt, accepted_dir, self.export_jobs, self.backend, running)
            name = publish_name(source_dir, fmt)
            source = str(Path(source_dir).expanduser().resolve())
            target = str(Path(accepted_dir).expanduser().resolve())
            lock_fd = claim_upload(Path(target), fmt)
            try:
                job = self.engine.add(Job.new(JobKind.UPLOAD, source, fmt, accepted_dir=target))
                self.engine.submit(job.job_id, lambda job_id: self._run_locked(job_id, name, lock_fd))
            except BaseException:
                os.close(lock_fd)
                raise
        return job

    def wait(self, job_id: str, timeout: float | None = None) -> Job | None:
        """Wait for a job's thread to end; return the job as recorded."""
        return self.engine.wait(job_id, timeout)

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Wait for running uploads; with ``cancel`` stop them first.

        A cancelled upload stops at its next progress report (at most every few MiB), removes
        its staging directory, publishes nothing and ends ``failed``. New starts are refused.
        """
        if cancel:
            self._closing.set()
        self.engine.close(timeout)

    # -- the job thread ---------------------------------------------------------------

    def _run_locked(self, job_id: str, name: str, lock_fd: int) -> dict[str, object]:
        try:
            return self._run(job_id, name)
        finally:
            os.close(lock_fd)  # the next upload of this export may start

    def _run(self, job_id: str, name: str) -> dict[str, object]:
        assert self.backend is not None
        engine = self.engine

        def progress(files_done: int, files_total: int, bytes_done: int, bytes_total: int) -> None:
            if self._closing.is_set():
                raise UploadCancelled("cancelled: the upload service is shutting down")
            engine.update(job_id, files_done=files_done, files_total=files_total, bytes_done=bytes_done,
                          bytes_total=bytes_total)
            engine.save(job_id, force=files_done == files_total and bytes_done == bytes_total)

        def on_attempt(attempt: int, previous_error: str) -> None:
            engine.update(job_id, attempts=attempt, **({"last_error": previous_error} if previous_error else {}))
            engine.save(job_id, force=True)

        job = engine.job(job_id)
        target = job.accepted_dir
        # <export>/<format>/accepted -> snapshots live in <export>, on the same file system
        snapshot = take_snapshot(Path(target), Path(target).parent.parent, job.format, job_id)
        try:
            result = self.backend.upload(snapshot.path, name, progress, on_attempt)
        finally:
            snapshot.close()
        notes = list(getattr(result, "notes", ()))
        last_error = engine.job(job_id).last_error
        if notes:
            last_error = "; ".join(([last_error] if last_error else []) + notes)
        return {"error": "", "remote_path": result.remote_path, "last_error": last_error,
                "files_done": result.files, "files_total": result.files,
                "bytes_done": result.bytes, "bytes_total": result.bytes}
