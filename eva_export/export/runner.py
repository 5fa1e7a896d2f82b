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
from collections.abc import Sequence
from pathlib import Path

from .. import confine, pool
from ..config import Config
from ..confine import resolve_in_roots
from ..errors import ConfigError, EvaError, ExportError
from ..formats.common import reuse, video_facts
from ..formats.common.exporter import Exporter, Progress
from ..formats.common.facts_index import FactsIndex
from ..formats.common.nonfinite import NonFinitePolicy, check_accepted, record_kept, scan_subset
from ..formats.common.options import FormatOptions
from ..formats.common.source import SourceCheck
from ..formats.registry import FormatSpec, get_spec
from ..formats.sources import validate_any
from ..fsutil import storage_guard, tree_size
from ..jobs import Job, JobEngine, JobKind, JobStore, QueuePolicy, ServiceStatus
from . import faults
from .build import Faults, SplitProgress
from .merge import check_agree, check_infos, combined_hash
from .paths import SUBSETS, ExportPaths
from .publish import export_lock, hashed_meanwhile, lock_held, publish_pair, recover_pair
from .records import ACCEPTED, REJECTED
from .request import ExportRequest
from .split import NativeSplit, SubsetResult, prepare_staging
from .units import PlannedEpisode, native_dir
from .verify_pair import verify_staged

log = logging.getLogger(__name__)

SAVE_PERIOD_S = 0.25

SourceArg = str | os.PathLike[str]


def source_list(source_dir: SourceArg | Sequence[SourceArg]) -> list[SourceArg]:
    """One source or several, as a list (a str is one source, not a sequence of them)."""
    return [source_dir] if isinstance(source_dir, (str, os.PathLike)) else list(source_dir)


def load_exporter(spec: FormatSpec, options: FormatOptions | None = None) -> Exporter:
    """The format's exporter built with its options record (its module imported now, not before)."""
    try:
        return spec.make(options)
    except EvaError:
        raise
    except Exception as exc:  # noqa: BLE001 - name the format, whatever the import raised
        raise ExportError(f"no exporter for {spec.name!r}: {exc}") from exc


class ExportService:
    """The export job queue (one worker thread, jobs in order). Thread-safe; ``close()`` stops it."""

    def __init__(self, config: Config, *, background: bool = True, recover: bool = True) -> None:
        self.config = config
        self.store = JobStore(config.export.jobs_dir)
        self.faults = faults.armed()  # injects nothing unless a test armed a plan (faults.py)
        self._requests: dict[str, ExportRequest] = {}  # job id -> its request (several sources, a name)
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
        return ExportRequest((source,), spec)

    def check_export(self, sources: Sequence[SourceArg], fmt: str, name: str = "") -> ExportRequest:
        """Refuse a bad request (raises); returns it as a typed request of resolved sources.
        Several sources need a ``name`` (merge.py); the pair then goes to ``<data root>/<name>``."""
        if not sources:
            get_spec(fmt)  # an unknown format is named first, as for one source
            raise ConfigError("source_dir is required")
        first, *more = (self.check_request(s, fmt) for s in sources)
        request = ExportRequest((first.source, *(r.source for r in more)), first.spec, name)
        home = str(request.home(self.config.export.data_roots)) if request.named else ""
        if len(request.sources) > 1:  # refused at once when the declared features disagree
            check_infos(request.sources)
        with self.jobs.lock:
            for job in self.jobs.unfinished():
                other = self._requests.get(job.job_id)
                shared = [s for s in request.sources if other is not None and s in other.sources]
                if shared or (home and job.source_dir == home):
                    raise ExportError(f"{shared[0] if shared else home} is in export {job.job_id} ({job.format}) "
                                      f"{job.state}; wait for it to finish, then start again")
        return request

    def paths(self, job: Job) -> ExportPaths:
        """Where the job's pair, staging and lock live."""
        request = self._requests.get(job.job_id)
        if request is not None and request.named:
            return ExportPaths.named(Path(job.source_dir), job.format)
        return ExportPaths.of(Path(job.source_dir), job.format)

    def _new_job(self, request: ExportRequest) -> Job:
        if request.named:
            paths = ExportPaths.named(request.home(self.config.export.data_roots), request.fmt)
        else:
            paths = ExportPaths.of(request.sources[0], request.fmt)
        job = Job.new(JobKind.EXPORT, str(paths.source_dir), request.fmt, accepted_dir=str(paths.accepted),
                      rejected_dir=str(paths.rejected))
        with self.jobs.lock:  # a long-running node keeps the requests of unfinished jobs only
            for done in [i for i in self._requests if (j := self.jobs.get(i)) is None or j.finished]:
                del self._requests[done]  # (a job is finished after its on_failure ran)
            self._requests[job.job_id] = request
        return self.jobs.add(job)

    def start(self, source_dir: SourceArg | Sequence[SourceArg], fmt: str, name: str = "") -> Job:
        """Queue an export of one source or several (merged, ``name`` required); returns the
        queued job at once."""
        if not self.jobs.has_worker:
            raise ExportError("this ExportService has no worker; use run()")
        with self.jobs.lock:  # check and enqueue atomically: two equal requests cannot both pass
            request = self.check_export(source_list(source_dir), fmt, name)
            job = self._new_job(request)
            self.jobs.submit(job.job_id, functools.partial(self._export, request=request), self._staging_left)
            return job

    def run(self, source_dir: SourceArg | Sequence[SourceArg], fmt: str, name: str = "") -> Job:
        """Run an export in the calling thread (the CLI); returns the finished job."""
        request = self.check_export(source_list(source_dir), fmt, name)
        job = self._new_job(request)
        return self.jobs.execute(job.job_id, functools.partial(self._export, request=request),
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
    def _unit_pool(self) -> contextlib.AbstractContextManager[object]:
        """Episode units of this job run in worker processes (eva_export.pool), unless the caller
        already chose an executor (``eva-export batch`` on Ray)."""
        if pool.active() is not None:
            return contextlib.nullcontext()
        return pool.local_pool(self.config.export.workers)

    def _export(self, job_id: str, *, request: ExportRequest) -> dict[str, object]:
        # What validation proves about each file is kept in the facts index beside the job
        # records: the staged subsets' verification and a rerun on the unchanged source reuse
        # it; a dataset's export tree is not touched by a refused source.
        index = FactsIndex(self.config.export.jobs_dir)
        try:
            # the writers take validation's reads of the first episodes (tables, statistics rows;
            # the direct v3 writer's probes each small camera MP4's parse) instead of reading again
            with self._unit_pool(), video_facts.use_index(index), confine.checked_dirs():
                pool.warm_for(request.episodes_hint())  # a worker's imports overlap the validation
                with reuse.keeping(parses=request.spec.name == "lerobot_v3", tables=pool.reads_here()):
                    return self._export_job(job_id, request)
        finally:
            index.close()

    def _validate(self, request: ExportRequest, paths: ExportPaths) -> tuple[SourceCheck, ...]:
        """Every source validated (any kind) and checked to agree, before anything is written."""
        try:
            checks = tuple(validate_any(s, allow_empty_dataset=False) for s in request.sources)
            check_agree(checks)  # several sources: one feature set, or a refusal naming the source
        except EvaError:
            # The source changed into something invalid: an earlier run's staging of it can
            # never be reused. Remove it rather than keep it (it may be large).
            if paths.staging.exists():
                with export_lock(paths):
                    log.warning("%s: removing stale staging %s", paths.source_dir, paths.staging)
                    shutil.rmtree(paths.staging, ignore_errors=True)
            raise
        return checks

    def _export_job(self, job_id: str, request: ExportRequest) -> dict[str, object]:
        job = self.jobs.job(job_id)
        checkpoints = Faults(self.faults.fail_at)
        spec = request.spec
        fmt = spec.name
        paths = self.paths(job)
        injected = self.faults.exporters.get(fmt)
        exporter = injected() if injected is not None else load_exporter(spec, self.config.export.options_for(fmt))
        if paths.backups():
            with export_lock(paths):
                # A kill between the two publication renames left the old pair in .backup-*:
                # put it back first, so a validation failure below cannot leave it there.
                recover_pair(paths)
        with video_facts.digests_of_reads(spec.native):  # the native pair links the source's MP4s
            checks = self._validate(request, paths)
        checkpoints.check("validate")
        self._count_totals(job_id, checks)
        if injected is None and (direct := self._direct(job_id, request, paths, exporter, checks)) is not None:
            return direct  # lerobot_v3 straight from the source (v3_direct.py)

        def on_unit(_p: PlannedEpisode, files: int, nbytes: int, reused: bool) -> None:
            self.jobs.count(job_id, episodes_done=int(spec.native), files_done=files, bytes_done=nbytes,
                            reused_episodes=int(reused))
            self.jobs.save(job_id)

        source_bytes = sum(c.bytes_total for c in checks)  # the staged split is at least its source's size
        with export_lock(paths), storage_guard(paths.staging, f"{fmt} export: writing", lambda: source_bytes):
            recover_pair(paths)
            home = paths.source_dir if request.named else None
            # the staging is reused only for the same sources in the same state (all of them hashed)
            if prepare_staging(paths.staging, home or checks[0].root, fmt, combined_hash(checks)) and spec.native:
                _move_back(paths.staging)  # a run killed after _move_native: its units are kept
            split = NativeSplit(checks, paths.staging, job_id, progress=SplitProgress(on_unit),
                                faults=checkpoints, home=home).run()
            del checks  # every source episode row: not held through conversion and verification
            # a v3.0 source episode that could not be cut exactly was re-encoded: said in the job
            self.jobs.update(job_id, unrated_episodes=len(split.unrated), reencoded_episodes=len(split.reencoded))
            # NaN/inf in accepted episodes: cut into finite runs, refused (naming them) or kept and
            # recorded, per export.nonfinite; ``dirs``: the native subsets the format is written from
            dirs, acc_totals = self._nonfinite(job_id, paths.staging, fmt, split.subsets[ACCEPTED],
                                               split.subsets[REJECTED])
            moved = spec.native and injected is None  # the registry's own native exporter
            try:
                pair = (self._move_native(exporter, paths.staging, checkpoints, dirs) if moved
                        else self._convert(job_id, exporter, paths.staging, checkpoints, not spec.native, dirs))
                with hashed_meanwhile(pair):  # the content manifest's hashing on another core
                    verify_staged(fmt, pair, exporter)  # publish only what verifies
                checkpoints.check("verified")
                publish_pair(paths, pair, job_id, checkpoints)
            except BaseException:
                if moved:  # the units go back where a rerun looks for them
                    _move_back(paths.staging)
                raise
            shutil.rmtree(paths.staging, ignore_errors=True)
        rej = split.subsets[REJECTED]
        return {"accepted_dir": str(paths.accepted), "rejected_dir": str(paths.rejected),
                "accepted_episodes": acc_totals[0], "accepted_frames": acc_totals[1],
                "rejected_episodes": rej.episodes, "rejected_frames": rej.frames}

    def _count_totals(self, job_id: str, checks: tuple[SourceCheck, ...]) -> None:
        # each source episode counts once: in the split (native format) or as the exporter writes it
        self.jobs.update(job_id, episodes_total=sum(len(c.episodes) for c in checks),
                         files_total=sum(c.files_total for c in checks), bytes_total=sum(c.bytes_total for c in checks))
        self.jobs.save(job_id, force=True)

    def _direct(self, job_id: str, request: ExportRequest, paths: ExportPaths, exporter: Exporter,
                checks: tuple[SourceCheck, ...]) -> dict[str, object] | None:
        from .v3_direct import run_direct  # imports the v3 writer: only when a job runs
        return run_direct(self, job_id, request, paths, exporter, checks, verify_staged)

    def _nonfinite(self, job_id: str, staging: Path, fmt: str, acc: SubsetResult, rej: SubsetResult,
                   ) -> tuple[dict[str, Path], tuple[int, int]]:
        """export.nonfinite applied to the staged accepted subset: the native subset directories
        to write the format from, and the accepted (episodes, frames) they hold."""
        policy = self.config.export.nonfinite
        dirs: dict[str, Path] = {str(name): native_dir(staging, name) for name in SUBSETS}
        runs_dir = staging / "native" / f"{ACCEPTED}_runs"
        found = check_accepted(dirs[ACCEPTED], policy, fmt, acc.nonfinite)
        # the rejected subset is for review: its NaN/inf are kept as recorded, and said
        record_kept(dirs[REJECTED], scan_subset(dirs[REJECTED], rej.nonfinite))
        if policy != NonFinitePolicy.FINITE_RUNS or not found:
            shutil.rmtree(runs_dir, ignore_errors=True)  # an earlier run's, under another policy
            if found:
                self.jobs.update(job_id, nonfinite_kept_episodes=len(found), warning=(
                    f"{len(found)} accepted episode(s) hold NaN/inf values kept as recorded (export.nonfinite = "
                    f"{policy}): the accepted subset will not train as is; see meta/quality_split.json"))
            return dirs, (int(acc.episodes), int(acc.frames))
        from .finite_runs import write_runs  # only for an accepted subset cut into finite runs

        runs = write_runs(dirs[ACCEPTED], runs_dir, found, self.config.export.nonfinite_min_run)
        dropped = sum(c.dropped_frames for c in runs.cut)
        self.jobs.update(job_id, nonfinite_cut_episodes=len(runs.cut), nonfinite_dropped_frames=dropped)
        return {**dirs, str(ACCEPTED): runs.dir}, (runs.episodes, runs.frames)

    def _staging_left(self, job: Job) -> dict[str, object]:
        """A failed job names the staging it leaves (kept for resume) and its size; not a staging
        another export is writing now (a job refused for that export's lock leaves nothing)."""
        paths = self.paths(job)
        if not paths.staging.is_dir() or lock_held(paths):
            return {}
        return {"staging_dir": str(paths.staging), "staging_bytes": tree_bytes(paths.staging)}

    def _move_native(self, exporter: Exporter, staging: Path, checkpoints: Faults, dirs: dict[str, Path]) -> Path:
        """The native format's pair: each staged subset renamed into ``staging/out`` and
        relabelled (its marker and card rewritten, new inodes), instead of the exporter's hard
        link of every file (3000 links, then 3000 unlinks with the staging, for 1000 short
        episodes). The same files and meta as ``exporter.export`` would write."""
        from ..formats.lerobot_v21.subset import write_quality_split

        out = staging / "out"
        if out.exists():  # an earlier run's pair, never published: rebuilt from the units
            shutil.rmtree(out)
        out.mkdir()
        for name in SUBSETS:  # a rewritten subset (finite runs) is moved; its split's stays for a rerun
            os.rename(dirs[name], out / name)
            write_quality_split(out / name, out / name, exporter.name)
            checkpoints.check(f"convert_{name}")
        return out

    def _convert(self, job_id: str, exporter: Exporter, staging: Path, checkpoints: Faults, count: bool,
                 dirs: dict[str, Path]) -> Path:
        """Each staged native subset written in the job's format into ``staging/out``."""

        def on_episode(_index: int, nbytes: int) -> None:
            if not count:  # a native format relabels the split: its episodes are counted once
                return
            self.jobs.count(job_id, episodes_done=1)
            self.jobs.save(job_id)

        out = staging / "out"
        out.mkdir(exist_ok=True)
        for name in SUBSETS:
            # the subset in the format is at least about its native copy's size
            with storage_guard(out / name, f"{exporter.name} export: writing",
                               functools.partial(tree_bytes, dirs[name])):
                exporter.export(dirs[name], out / name, Progress(on_episode=on_episode))
            checkpoints.check(f"convert_{name}")
        for p in out.iterdir():
            if p.name not in SUBSETS:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        return out


def _move_back(staging: Path) -> None:
    """Undo ``_move_native`` for the subsets not back yet (the rerun then reuses their units)."""
    for name in SUBSETS:
        moved, home = staging / "out" / name, native_dir(staging, name)
        if moved.is_dir() and not home.exists():
            os.rename(moved, home)


def tree_bytes(root: Path) -> int:
    return tree_size(root)[1]


__all__ = ["ExportService", "load_exporter", "ACCEPTED", "REJECTED"]
