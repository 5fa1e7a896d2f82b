"""Export jobs: checks a request, queues it, runs it on one worker thread, records it on disk.

``ExportService`` is shared by the export node (background worker) and the CLI (``run``,
synchronous). Requests are refused at once, with a reason, when:

* the format is not one of ``config.FORMATS`` (ConfigError);
* the source, after resolving symlinks and '..', is not inside ``export.data_roots``
  (UnsafeNameError), or is not a directory;
* the same source already has an export queued or running in this service (ExportError):
  refused rather than queued, because a second export of the same source would publish over
  the first one's pair moments later and its staging would be shared.

Jobs of different sources queue and run one at a time, in order. Across processes (node and
CLI) an flock on ``<export>/.lock-<format>`` keeps two runs off the same staging and pair.
Each job runs: validate the source (nothing written before this passes) -> resumable native
split in ``<export>/.staging-<format>-<key>`` -> format conversion of each subset (non-native
formats) -> pair publication (publish.py) -> staging removed.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import confine
from ..config import FORMATS, Config, inside
from ..dataset.records import FORMAT_V21
from ..errors import ConfigError, EvaError, ExportError, UnsafeNameError
from ..jobs import COMPLETED, FAILED, QUEUED, RUNNING, Job, JobStore
from .paths import SUBSETS, ExportPaths
from .publish import export_lock, publish_pair, recover_pair
from .records import ACCEPTED, REJECTED
from .split import Faults, NativeSplit, SplitProgress, prepare_staging
from .validate import validate_source

log = logging.getLogger(__name__)

SAVE_PERIOD_S = 0.25


def exporter_options(config: Config, fmt: str) -> dict[str, Any]:
    """Constructor options of a format's exporter, from the export section of the config."""
    ex = config.export
    if fmt == "lerobot_v3":
        return {"data_files_size_in_mb": ex.v3_data_file_mb, "video_files_size_in_mb": ex.v3_video_file_mb}
    if fmt == "hdf5":
        return {"compression": ex.hdf5_compression}
    return {}


def load_exporter(fmt: str, **options: Any) -> Any:
    """The format's exporter from eva_export.formats.registry (imported lazily)."""
    try:
        registry = importlib.import_module("eva_export.formats.registry")
    except ImportError as exc:
        raise ExportError(f"no exporter for {fmt!r}: eva_export.formats.registry is not available ({exc})") from exc
    try:
        return registry.get_exporter(fmt, **options)
    except EvaError:
        raise
    except Exception as exc:  # noqa: BLE001 - name the format, whatever the registry raised
        raise ExportError(f"no exporter for {fmt!r}: {exc}") from exc


class ExportService:
    """The export job queue. Thread-safe; ``close()`` stops the worker."""

    def __init__(self, config: Config, *, background: bool = True, recover: bool = True,
                 fail_at: str | None = None, exporters: dict[str, Callable[[], Any]] | None = None) -> None:
        self.config = config
        self.store = JobStore(config.export.jobs_dir)
        self.fail_at = fail_at  # fault injection for tests: a step name (see Faults)
        self.exporters = dict(exporters or {})  # format -> factory; overrides the registry (tests)
        self._lock = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._queue: collections.deque[str] = collections.deque()
        self._current: str | None = None
        self._last: str | None = None
        self._stop = False
        self._saved_at: dict[str, float] = {}
        if recover:
            for job in self.store.mark_interrupted():
                log.warning("export job %s was interrupted by a restart: marked failed", job.job_id)
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(target=self._work, name="export-worker", daemon=True)
            self._worker.start()

    # ---- requests --------------------------------------------------------------------------
    def check_request(self, source_dir: str | os.PathLike[str], fmt: str) -> Path:
        """Refuse a bad request (raises); returns the resolved source directory."""
        if fmt not in FORMATS:
            raise ConfigError(f"unknown format {fmt!r}; choose one of {list(FORMATS)}")
        if not str(source_dir):
            raise ConfigError("source_dir is required")
        confine.check_request_path(str(source_dir))  # NUL, over-long names: refused, not OSError
        source = Path(os.path.realpath(os.path.abspath(source_dir)))
        roots = self.config.export.data_roots
        if not any(inside(r, source) for r in roots):
            raise UnsafeNameError(f"source {source_dir} (resolved {source}) is outside the export data roots "
                                  f"{[str(r) for r in roots]}; refused")
        if not source.is_dir():
            raise ConfigError(f"source {source} is not a directory")
        confine.check_is_source(source)  # an export is never the source of another export
        with self._lock:
            for job in self._jobs.values():
                if job.state in (QUEUED, RUNNING) and job.source_dir == str(source):
                    raise ExportError(f"source {source} already has export {job.job_id} ({job.format}) "
                                      f"{job.state}; wait for it to finish, then start again")
        return source

    def _new_job(self, source: Path, fmt: str) -> Job:
        paths = ExportPaths.of(source, fmt)
        job = Job.new("export", str(source), fmt, accepted_dir=str(paths.accepted),
                      rejected_dir=str(paths.rejected))
        with self._lock:
            self._jobs[job.job_id] = job
        self.store.save(job)
        return job

    def start(self, source_dir: str | os.PathLike[str], fmt: str) -> Job:
        """Queue an export; returns (a copy of) the queued job at once."""
        if self._worker is None:
            raise ExportError("this ExportService has no worker; use run()")
        with self._lock:  # check and enqueue atomically: two equal requests cannot both pass
            source = self.check_request(source_dir, fmt)
            job = self._new_job(source, fmt)
            self._queue.append(job.job_id)
            self._lock.notify_all()
            return Job.from_dict(job.to_dict())

    def run(self, source_dir: str | os.PathLike[str], fmt: str) -> Job:
        """Run an export in the calling thread (the CLI); returns the finished job."""
        source = self.check_request(source_dir, fmt)
        job = self._new_job(source, fmt)
        self._execute(job)
        return Job.from_dict(job.to_dict())

    # ---- queries ---------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return Job.from_dict(job.to_dict())
        return self.store.get(job_id)

    def latest(self) -> Job | None:
        with self._lock:
            if self._jobs:
                job = max(self._jobs.values(), key=lambda j: (j.created_at, j.job_id))
                return Job.from_dict(job.to_dict())
        return self.store.latest()

    def latest_completed(self, source_dir: str, fmt: str) -> Job | None:
        return self.store.latest_completed("export", source_dir, fmt)

    def status(self) -> tuple[str, int, Job | None]:
        """(IDLE|BUSY, queued count, running job or the last finished one)."""
        with self._lock:
            cur = self._current or self._last
            job = self._jobs.get(cur) if cur else None
            state = "BUSY" if self._current or self._queue else "IDLE"
            return state, len(self._queue), Job.from_dict(job.to_dict()) if job else None

    def wait(self, job_id: str, timeout: float | None = None) -> Job | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                job = self._jobs.get(job_id)
                if job is None or job.finished:
                    return Job.from_dict(job.to_dict()) if job else None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return Job.from_dict(job.to_dict())
                self._lock.wait(left if left is not None else 1.0)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    # ---- worker ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stop:
                    self._lock.wait()
                if self._stop:
                    return
                job = self._jobs[self._queue.popleft()]
                self._current = job.job_id
            try:
                self._execute(job)
            finally:
                with self._lock:
                    self._current = None
                    self._last = job.job_id
                    self._lock.notify_all()

    def _save(self, job: Job, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._saved_at.get(job.job_id, 0.0) >= SAVE_PERIOD_S:
            with self._lock:
                snapshot = Job.from_dict(job.to_dict())
            self.store.save(snapshot)
            self._saved_at[job.job_id] = now

    def _set(self, job: Job, **fields: Any) -> None:
        with self._lock:
            for k, v in fields.items():
                setattr(job, k, v)

    def _execute(self, job: Job) -> None:
        with self._lock:
            job.claim()  # pid/host: a later JobStore marks the job interrupted if this process dies
        self._set(job, state=RUNNING)
        self._save(job, force=True)
        try:
            with self._unit_pool():
                self._export(job, Faults(self.fail_at))
            self._set(job, state=COMPLETED, finished_at=time.time())
        except EvaError as exc:
            self._set(job, state=FAILED, error=str(exc), finished_at=time.time())
        except Exception as exc:  # noqa: BLE001 - a job never takes the worker down
            log.exception("export job %s crashed", job.job_id)
            self._set(job, state=FAILED, error=f"{type(exc).__name__}: {exc}", finished_at=time.time())
        if job.state == FAILED:
            self._record_staging(job)
        self._save(job, force=True)
        with self._lock:
            self._lock.notify_all()

    def _unit_pool(self) -> Any:
        """Episode units of this job run in worker processes (export.pool), unless the caller
        already chose an executor (``eva-export batch`` on Ray)."""
        from . import pool

        if pool.active() is not None:
            return contextlib.nullcontext()
        return pool.local_pool(self.config.export.workers)

    def _export(self, job: Job, faults: Faults) -> None:
        fmt = job.format
        source = Path(job.source_dir)
        paths = ExportPaths.of(source, fmt)
        exporter = None if fmt == FORMAT_V21 else (self.exporters[fmt]() if fmt in self.exporters
                                                   else load_exporter(fmt, **exporter_options(self.config, fmt)))
        if paths.backups():
            with export_lock(paths):
                # A kill between the two publication renames left the old pair in .backup-*:
                # put it back first, so a validation failure below cannot leave it there.
                recover_pair(paths)
        try:
            check = validate_source(source, allow_empty_dataset=False)  # before anything is written
        except EvaError:
            # The source changed into something invalid: an earlier run's staging of it can
            # never be reused. Remove it rather than keep it (it may be large).
            if paths.staging.exists():
                with export_lock(paths):
                    log.warning("%s: removing stale staging %s", source, paths.staging)
                    shutil.rmtree(paths.staging, ignore_errors=True)
            raise
        faults.check("validate")
        n = len(check.episodes)
        self._set(job, episodes_total=n if exporter is None else 2 * n, files_total=check.files_total,
                  bytes_total=check.bytes_total)
        self._save(job, force=True)

        def on_unit(_p: Any, files: int, nbytes: int, reused: bool) -> None:
            with self._lock:
                job.episodes_done += 1
                job.files_done += files
                job.bytes_done += nbytes
                job.reused_episodes += int(reused)
            self._save(job)

        with export_lock(paths):
            recover_pair(paths)
            prepare_staging(paths.staging, check.root, fmt, check.source_hash)
            split = NativeSplit(check, paths.staging, job.job_id, progress=SplitProgress(on_unit),
                                faults=faults).run()
            self._set(job, unrated_episodes=len(split.unrated))
            pair = paths.staging / "native"
            if exporter is not None:
                pair = self._convert(job, exporter, paths.staging, faults)
            verify_staged(fmt, pair, exporter)  # publish only what verifies
            faults.check("verified")
            publish_pair(paths, pair, job.job_id, faults)
            shutil.rmtree(paths.staging, ignore_errors=True)
        acc, rej = split.subsets[ACCEPTED], split.subsets[REJECTED]
        self._set(job, accepted_dir=str(paths.accepted), rejected_dir=str(paths.rejected),
                  accepted_episodes=acc.episodes, accepted_frames=acc.frames,
                  rejected_episodes=rej.episodes, rejected_frames=rej.frames)

    def _record_staging(self, job: Job) -> None:
        """A failed job names the staging it leaves (kept for resume) and its size."""
        staging = ExportPaths.of(Path(job.source_dir), job.format).staging
        if staging.is_dir():
            self._set(job, staging_dir=str(staging), staging_bytes=tree_bytes(staging))

    def _convert(self, job: Job, exporter: Any, staging: Path, faults: Faults) -> Path:
        from ..formats.base import Progress  # no ROS, no heavy imports

        def on_episode(_index: int, nbytes: int) -> None:
            with self._lock:
                job.episodes_done += 1
            self._save(job)

        out = staging / "out"
        out.mkdir(exist_ok=True)
        for name in SUBSETS:
            exporter.export(staging / "native" / name, out / name, Progress(on_episode=on_episode))
            faults.check(f"convert_{name}")
        for p in out.iterdir():
            if p.name not in SUBSETS:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        return out


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                continue
    return total


def verify_staged(fmt: str, pair: Path, exporter: Any = None) -> None:
    """Run the format's verifier (``eva-export verify``) on both staged subsets; raise on findings.

    Cheap by design: totals against the files, frame counts from the container index or by
    demuxing (lerobot_v21: no full decode), and one sample read per subset.
    """
    verifier = exporter  # the object that wrote it knows its layout (also an injected backend)
    if verifier is None or not hasattr(verifier, "verify"):
        registry: Any = importlib.import_module("eva_export.formats.registry")
        verifier = registry.get_exporter(fmt, **({"decode_frames": False} if fmt == FORMAT_V21 else {}))
    findings = []
    for name in SUBSETS:
        report = verifier.verify(pair / name)
        findings += [f"{name}: {e}" for e in report.errors]
    if findings:
        shown = "; ".join(findings[:8]) + (f"; ... ({len(findings) - 8} more)" if len(findings) > 8 else "")
        raise ExportError(f"the staged {fmt} export failed verification, nothing was published: {shown}")


__all__ = ["ExportService", "load_exporter", "ACCEPTED", "REJECTED"]
