"""The lerobot_v3 export job straight from the source: no native split staged first.

The quality split is planned once (split.plan_split, the native split's own plan: subsets,
renumbering, tasks, markers) and each subset is written as v3 shards from the source
episodes (v3_writer.py) into ``<staging>/out``, with the native subset's meta files beside
the shards' records under ``<staging>/v3`` (the exporter's copies of them come from there).
What is published is what converting the staged native pair publishes: the same files, the
same tables, statistics, marker and card. The staged pair is verified, then published as a
pair with rollback (publish.py). A killed job keeps its complete shards: the rerun continues
each shard stream after them (v3_records.py).

Taken when the job's format is the registry's lerobot_v3 and every source episode owns its
camera files (v2.1, v2.0: ``camera_span`` is a whole file). A v3.0 source (episodes cut out
of shared files) goes through the native split. So does an accepted subset holding NaN/inf
under ``export.nonfinite = finite_runs``: its episodes are cut into finite runs from a staged
native subset (finite_runs.py); the direct shards are then left unused.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .. import faults as process_faults
from ..config import Config
from ..formats.common.exporter import Exporter
from ..formats.common.nonfinite import NonFiniteEpisode, NonFinitePolicy, decide, record_kept
from ..formats.common.records import FORMAT_V21
from ..formats.common.source import SourceCheck
from ..formats.lerobot_v3.exporter import LeRobotV3Exporter
from ..fsutil import storage_guard
from ..jobs import JobEngine
from .build import Faults
from .faults import FaultPlan
from .merge import combined_hash
from .paths import SUBSETS, ExportPaths
from .publish import export_lock, hashed_meanwhile, publish_pair, recover_pair
from .records import ACCEPTED
from .request import ExportRequest
from .split import SplitPlan, judged_rows, make_marker, plan_split, prepare_staging
from .units import PlannedEpisode
from .v3_episodes import NativeSubset, write_native_meta
from .v3_records import check_settings
from .v3_writer import Converted, SubsetWriter

log = logging.getLogger(__name__)

FORMAT = "lerobot_v3"


class NeedsNativeSplit(Exception):
    """The accepted subset is to be cut into finite runs: the native split's path writes it."""


class Holds(Faults):
    """The job's checkpoints; the ``n``-th pass of a repeated one is also named ``name#n``
    (``shard#3``: the third shard committed). A process a test starts may hold at one of them:
    ``eva_export.faults.env(v3_hold="<dir>@<point>")`` writes ``<dir>/started`` there and blocks opening
    the FIFO ``<dir>/release`` (the test kills it while it waits)."""

    def __init__(self, fail_at: str | None = None) -> None:
        super().__init__(fail_at)
        self.counts: Counter[str] = Counter()
        where, _, self.point = process_faults.from_env("v3_hold").rpartition("@")
        self.dir = Path(where) if where else None

    def check(self, name: str) -> None:
        self.counts[name] += 1
        numbered = f"{name}#{self.counts[name]}"
        if self.fail_at == numbered:
            super().check(numbered)
        super().check(name)
        if self.dir is not None and self.point in (name, numbered):
            (self.dir / "started").write_text(numbered)
            with open(self.dir / "release", "rb"):
                pass


def applies(exporter: Exporter, checks: tuple[SourceCheck, ...]) -> bool:
    """The registry's v3 exporter, and sources whose episodes own their camera files."""
    if not isinstance(exporter, LeRobotV3Exporter) or exporter.name != FORMAT:
        return False
    for check in checks:
        if len(check.episodes):
            ep = check.episodes[0]  # a source's episodes are all of its kind
            spans = [ep.camera_span(k) for k in ep.video_paths]
            if any(s.first_frame != 0 or s.frames is not None for s in spans):
                return False
    return True


Verify = Callable[[str, Path, Exporter], None]


class Service(Protocol):
    """What the job uses of runner.ExportService."""

    @property
    def jobs(self) -> JobEngine: ...
    @property
    def config(self) -> Config: ...
    @property
    def faults(self) -> FaultPlan: ...


def run_direct(service: Service, job_id: str, request: ExportRequest, paths: ExportPaths, exporter: Exporter,
               checks: tuple[SourceCheck, ...], verify: Verify) -> dict[str, object] | None:
    """The job's result, or None when it is the native split's to do (the caller runs it).
    ``verify``: the runner's verification of a staged pair (raises on findings)."""
    jobs, config, fail_at = service.jobs, service.config, service.faults.fail_at
    if request.spec.name != FORMAT or not isinstance(exporter, LeRobotV3Exporter) or not applies(exporter, checks):
        return None
    source_bytes = sum(c.bytes_total for c in checks)
    try:
        with export_lock(paths), storage_guard(paths.staging, f"{FORMAT} export: writing", lambda: source_bytes):
            return _Job(jobs, config, job_id, request, paths, exporter, Holds(fail_at)).run(checks, verify)
    except NeedsNativeSplit:
        log.info("%s: the accepted subset holds NaN/inf to cut into finite runs: exporting through the "
                 "native split", paths.source_dir)
        jobs.update(job_id, episodes_done=0, files_done=0, bytes_done=0, reused_episodes=0)
        return None


class _Job:
    def __init__(self, jobs: JobEngine, config: Config, job_id: str, request: ExportRequest, paths: ExportPaths,
                 exporter: LeRobotV3Exporter, holds: Holds) -> None:
        self.jobs, self.config, self.job_id, self.request, self.paths = jobs, config, job_id, request, paths
        self.exporter, self.holds = exporter, holds

    def run(self, checks: tuple[SourceCheck, ...], verify: Verify) -> dict[str, object]:
        paths, ex = self.paths, self.exporter
        recover_pair(paths)
        home = paths.source_dir if self.request.named else None
        prepare_staging(paths.staging, home or checks[0].root, FORMAT, combined_hash(checks))
        check_settings(paths.staging, {"data_files_size_in_mb": ex.data_mb, "video_files_size_in_mb": ex.video_mb,
                                       "chunks_size": ex.chunks_size, "reencode": repr(ex.reencode_settings)})
        plan = plan_split(checks, home)
        self.jobs.update(self.job_id, unrated_episodes=len(plan.unrated), reencoded_episodes=0)
        judged = judged_rows(plan)
        totals: dict[str, tuple[int, int]] = {}
        for name in SUBSETS:
            marker = make_marker(plan, name, FORMAT_V21, self.job_id, judged)
            native = write_native_meta(paths.staging / "v3" / name / "native", plan.subsets[name], plan.info,
                                       plan.tasks[name], marker)
            writer = SubsetWriter(paths.staging, name, plan.subsets[name], native, ex,
                                  lambda p: _source_stats(plan, p), self._on_episode, self.holds.check)
            conv = writer.convert()
            self._nonfinite(name, native, conv)
            writer.finish(conv)
            self.holds.check(f"convert_{name}")
            totals[name] = (conv.episodes, conv.frames)
        pair = paths.staging / "out"
        with hashed_meanwhile(pair):  # the content manifest's hashing on another core
            verify(FORMAT, pair, ex)  # publish only what verifies
        self.holds.check("verified")
        publish_pair(paths, pair, self.job_id, self.holds)
        shutil.rmtree(paths.staging, ignore_errors=True)
        (acc_e, acc_f), (rej_e, rej_f) = totals[ACCEPTED], totals["rejected"]
        return {"accepted_dir": str(paths.accepted), "rejected_dir": str(paths.rejected),
                "accepted_episodes": acc_e, "accepted_frames": acc_f, "rejected_episodes": rej_e,
                "rejected_frames": rej_f}

    def _on_episode(self, files: int, nbytes: int, reused: bool) -> None:
        self.jobs.count(self.job_id, episodes_done=1, files_done=files, bytes_done=nbytes, reused_episodes=int(reused))
        self.jobs.save(self.job_id)

    def _nonfinite(self, name: str, native: NativeSubset, conv: Converted) -> None:
        """export.nonfinite, as the native path applies it to the staged subsets (runner._nonfinite):
        the rejected subset's NaN/inf recorded; the accepted one's refused, kept and recorded, or
        (finite_runs) cut by the native path."""
        found = [_episode(native, i, counts) for i, counts in conv.nonfinite]
        if name != ACCEPTED:
            record_kept(native.dir, found)
            return
        policy = self.config.export.nonfinite
        found = decide(found, policy, FORMAT)
        if policy == NonFinitePolicy.FINITE_RUNS and found:
            raise NeedsNativeSplit
        record_kept(native.dir, [] if policy == NonFinitePolicy.FINITE_RUNS else found)
        if found:
            self.jobs.update(self.job_id, nonfinite_kept_episodes=len(found), warning=(
                f"{len(found)} accepted episode(s) hold NaN/inf values kept as recorded (export.nonfinite = "
                f"{policy}): the accepted subset will not train as is; see meta/quality_split.json"))


def _episode(native: NativeSubset, i: int, counts: tuple[tuple[str, int], ...]) -> NonFiniteEpisode:
    """As nonfinite.scan_subset names a subset episode holding NaN/inf."""
    names = native.names
    raw_file = names.data(i)
    return NonFiniteEpisode(i, names.index(i), str(raw_file if raw_file.is_file() else names.root), counts,
                            native.rows[i].qc_verdict)


def _source_stats(plan: SplitPlan, p: PlannedEpisode) -> dict[str, Any]:
    ep_stats = plan.checks[p.source_no].meta.episodes_stats
    return ep_stats[p.source.index].stats if p.source.index in ep_stats else {}
