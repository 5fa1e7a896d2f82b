"""Export jobs: checks a request, queues it, runs it on one worker thread, records it on disk.

``ExportService`` is shared by the export node (background worker) and the CLI (``run``,
synchronous). Requests are refused at once, with a reason, when:

* the format is not registered in ``formats.registry`` (UnknownFormatError, the registry's own);
* the source, after resolving symlinks and '..', is not inside ``export.data_roots``
  (UnsafeNameError), or is not a directory;
* the same source already has an export queued or running in this service (ExportError):
  refused rather than queued, because a second export of the same source would publish over
  the first one's pair moments later and its staging would be shared.

Jobs of different sources queue and run one at a time, in order. Across processes (node and
CLI) an flock on ``<export>/.lock-<format>`` keeps two runs off the same staging and pair.
Each job runs: validate the source (nothing written before this passes) -> resumable native
split in ``<export>/.staging-<format>-<key>`` -> each subset written by the format's exporter
(formats.registry; the native lerobot_v21 one only relabels the split) -> verification -> pair
publication (publish.py) -> staging removed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import confine
from ..config import Config
from ..confine import resolve_in_roots
from ..errors import ConfigError, EvaError, ExportError
from ..formats.base import Exporter, Progress
from ..formats.nonfinite import check_accepted
from ..formats.registry import FormatSpec, get_spec
from ..fsutil import storage_guard
from ..jobs import Job, JobEngine, JobKind, JobStore, QueuePolicy, ServiceStatus
from ..sources.registry import validate_any
from .paths import SUBSETS, ExportPaths
from .publish import export_lock, publish_pair, recover_pair
from .records import ACCEPTED, REJECTED
from .request import ExportRequest
from .split import Faults, NativeSplit, SplitProgress, prepare_staging
from .units import native_dir

log = logging.getLogger(__name__)

SAVE_PERIOD_S = 0.25


def load_exporter(fmt: str | FormatSpec, **options: Any) -> Exporter:
    """The format's exporter from the registry (its module imported now, not before)."""
    spec = fmt if isinstance(fmt, FormatSpec) else get_spec(fmt)
    try:
        return spec.make(**options)
    except EvaError:
        raise
    except Exception as exc:  # noqa: BLE001 - name the format, whatever the import raised
        raise ExportError(f"no exporter for {spec.name!r}: {exc}") from exc


class ExportService:
    """The export job queue (one worker thread, jobs in order). Thread-safe; ``close()`` stops it."""

    def __init__(self, config: Config, *, background: bool = True, recover: bool = True,
                 fail_at: str | None = None, exporters: dict[str, Callable[[], Any]] | None = None) -> None:
        self.config = config
        self.store = JobStore(config.export.jobs_dir)
        self.fail_at = fail_at  # fault injection for tests: a step name (see Faults)
        self.exporters = dict(exporters or {})  # format -> factory; overrides the registry (tests)
        self.jobs = JobEngine(self.store, name="export", policy=QueuePolicy.SERIAL, save_period_s=SAVE_PERIOD_S,
                              recover=recover, claim=True)
        if background:
            self.jobs.start_worker()

    # ---- requests --------------------------------------------------------------------------
    def check_request(self, source_dir: str | os.PathLike[str], fmt: str) -> ExportRequest:
        """Refuse a bad request (raises); returns it resolved: source directory and format spec."""
        spec = get_spec(fmt)  # the only lookup of the format name (UnknownFormatError)
        if not str(source_dir):
            raise ConfigError("source_dir is required")
        confine.check_request_path(str(source_dir))  # NUL, over-long names: refused, not OSError
        source = resolve_in_roots(Path(os.path.abspath(source_dir)), self.config.export.data_roots, "source",
                                  str(source_dir))
        confine.check_is_source(source)  # an export is never the source of another export
        with self.jobs.lock:
            for job in self.jobs.unfinished():
                if job.source_dir == str(source):
                    raise ExportError(f"source {source} already has export {job.job_id} ({job.format}) "
                                      f"{job.state}; wait for it to finish, then start again")
        return ExportRequest(source, spec)

    def _new_job(self, request: ExportRequest) -> Job:
        paths = ExportPaths.of(request.source, request.fmt)
        return self.jobs.add(Job.new(JobKind.EXPORT, str(request.source), request.fmt,
                                     accepted_dir=str(paths.accepted), rejected_dir=str(paths.rejected)))

    def start(self, source_dir: str | os.PathLike[str], fmt: str) -> Job:
        """Queue an export; returns the queued job at once."""
        if not self.jobs.has_worker:
            raise ExportError("this ExportService has no worker; use run()")
        with self.jobs.lock:  # check and enqueue atomically: two equal requests cannot both pass
            request = self.check_request(source_dir, fmt)
            job = self._new_job(request)
            self.jobs.submit(job.job_id, functools.partial(self._export, spec=request.spec), self._staging_left)
            return job

    def run(self, source_dir: str | os.PathLike[str], fmt: str) -> Job:
        """Run an export in the calling thread (the CLI); returns the finished job."""
        request = self.check_request(source_dir, fmt)
        job = self._new_job(request)
        return self.jobs.execute(job.job_id, functools.partial(self._export, spec=request.spec),
                                 on_failure=self._staging_left)

    # ---- queries ---------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def latest(self) -> Job | None:
        return self.jobs.latest()

    def latest_completed(self, source_dir: str, fmt: str) -> Job | None:
        return self.store.latest_completed(JobKind.EXPORT, source_dir, fmt)

    def status(self) -> ServiceStatus:
        """IDLE|BUSY, queued count, the running job or the last finished one."""
        return self.jobs.status()

    def wait(self, job_id: str, timeout: float | None = None) -> Job | None:
        return self.jobs.wait(job_id, timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.jobs.close(timeout)

    # ---- one job ---------------------------------------------------------------------------
    def _unit_pool(self) -> contextlib.AbstractContextManager[Any]:
        """Episode units of this job run in worker processes (eva_export.pool), unless the caller
        already chose an executor (``eva-export batch`` on Ray)."""
        from .. import pool

        if pool.active() is not None:
            return contextlib.nullcontext()
        return pool.local_pool(self.config.export.workers)

    def _export(self, job_id: str, *, spec: FormatSpec) -> dict[str, Any]:
        with self._unit_pool():
            return self._export_job(job_id, spec)

    def _export_job(self, job_id: str, spec: FormatSpec) -> dict[str, Any]:
        job = self.jobs.job(job_id)
        faults = Faults(self.fail_at)
        fmt = spec.name
        source = Path(job.source_dir)
        paths = ExportPaths.of(source, fmt)
        exporter = (self.exporters[fmt]() if fmt in self.exporters
                    else load_exporter(spec, **spec.options(self.config.export)))
        if paths.backups():
            with export_lock(paths):
                # A kill between the two publication renames left the old pair in .backup-*:
                # put it back first, so a validation failure below cannot leave it there.
                recover_pair(paths)
        try:
            check = validate_any(source, allow_empty_dataset=False)  # any source kind; before anything is written
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
        # Each source episode counts once: in the split for the native format, else when the
        # format's exporter writes it (counting both phases showed 8/8 for 4 episodes).
        self.jobs.update(job_id, episodes_total=n, files_total=check.files_total, bytes_total=check.bytes_total)
        self.jobs.save(job_id, force=True)

        def on_unit(_p: Any, files: int, nbytes: int, reused: bool) -> None:
            self.jobs.count(job_id, episodes_done=int(spec.native), files_done=files, bytes_done=nbytes,
                            reused_episodes=int(reused))
            self.jobs.save(job_id)

        with export_lock(paths), storage_guard(paths.staging, f"{fmt} export: writing"):
            recover_pair(paths)
            prepare_staging(paths.staging, check.root, fmt, check.source_hash)
            split = NativeSplit(check, paths.staging, job_id, progress=SplitProgress(on_unit),
                                faults=faults).run()
            # a v3.0 source episode that could not be cut exactly was re-encoded: said in the job
            self.jobs.update(job_id, unrated_episodes=len(split.unrated), reencoded_episodes=len(split.reencoded))
            # NaN/inf in accepted episodes: refused (naming them) or kept and recorded, per export.nonfinite
            check_accepted(native_dir(paths.staging, ACCEPTED), self.config.export.nonfinite, fmt)
            pair = self._convert(job_id, exporter, paths.staging, faults, count=not spec.native)
            verify_staged(fmt, pair, exporter)  # publish only what verifies
            faults.check("verified")
            publish_pair(paths, pair, job_id, faults)
            shutil.rmtree(paths.staging, ignore_errors=True)
        acc, rej = split.subsets[ACCEPTED], split.subsets[REJECTED]
        return {"accepted_dir": str(paths.accepted), "rejected_dir": str(paths.rejected),
                "accepted_episodes": acc.episodes, "accepted_frames": acc.frames,
                "rejected_episodes": rej.episodes, "rejected_frames": rej.frames}

    def _staging_left(self, job: Job) -> dict[str, Any]:
        """A failed job names the staging it leaves (kept for resume) and its size."""
        staging = ExportPaths.of(Path(job.source_dir), job.format).staging
        return {"staging_dir": str(staging), "staging_bytes": tree_bytes(staging)} if staging.is_dir() else {}

    def _convert(self, job_id: str, exporter: Exporter, staging: Path, faults: Faults, count: bool) -> Path:
        """Each staged native subset written in the job's format into ``staging/out``."""

        def on_episode(_index: int, nbytes: int) -> None:
            if not count:  # a native format relabels the split: its episodes are counted once
                return
            self.jobs.count(job_id, episodes_done=1)
            self.jobs.save(job_id)

        out = staging / "out"
        out.mkdir(exist_ok=True)
        for name in SUBSETS:
            with storage_guard(out / name, f"{exporter.name} export: writing"):
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


def verify_staged(fmt: str, pair: Path, verifier: Exporter) -> None:
    """Run the format's verifier (``eva-export verify``) on both staged subsets; raise on findings.

    The exporter that wrote the pair verifies it (it knows its layout; tests inject one). Cheap
    by design: totals against the files, frame counts from the container index or by demuxing
    (no full decode), and one sample read per subset.
    """
    findings = []
    for name in SUBSETS:
        report = verifier.verify(pair / name)
        findings += [f"{name}: {e}" for e in report.errors]
    if findings:
        shown = "; ".join(findings[:8]) + (f"; ... ({len(findings) - 8} more)" if len(findings) > 8 else "")
        raise ExportError(f"the staged {fmt} export failed verification, nothing was published: {shown}")


__all__ = ["ExportService", "load_exporter", "ACCEPTED", "REJECTED"]
