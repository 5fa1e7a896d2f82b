"""The quality split: validated sources -> complete native accepted/rejected datasets.

A source is any kind sources/ validates (v2.1, v3.0, v2.0); the subsets are always real v2.1.
Several sources (a named export, merge.py) are split together into one pair: episodes in
source order then episode order, tasks merged by text; one source is the N=1 case.
The unit of work is the source episode (units.py): its files are written straight to their
templated v2.1 paths inside ``<staging>/native/<subset>``, then its record is renamed into
place: the commit point. A rerun after a kill reuses every unit with a
record (after checking its files and row count) and rewrites the rest. At most BUILD_WORKERS
episode tables (one per build thread) are in memory at a time.

Assembling a subset then only writes its meta files (marker last) from the records, so the
native subset directory is the finished dataset, ready to be published by one rename.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import confine
from ..dataset.commits import UnitRecord
from ..dataset.meta import EPISODES, EPISODES_STATS, INFO, STATS, TASKS
from ..dataset.records import FORMAT_V21, DatasetInfo, EpisodeRow, Quality, Verdict
from ..dataset.validate import SourceCheck, SourceEpisode
from ..errors import ExportError
from ..fsutil import atomic_write_json, dumps_json, jsonl_dumps, read_json
from ..quality.store import quality_for, read_sidecar
from .assemble import JsonlStream, StatsSum
from .merge import ORIGINS_KEY, SOURCE_DATASET_FIELD, SOURCES_KEY, EpisodeOrigin, SourceRef, merged_robot_type
from .merge import provenance as source_provenance
from .records import ACCEPTED, QUALITY_SPLIT_FILE, REJECTED, QualitySplit
from .units import (
    REENCODED_FIELD,
    PlannedEpisode,
    UnitWork,
    native_dir,
    split_units,
    unit_is_complete,
    unit_name,
    unit_record,
    write_text,
)

MANIFEST = "manifest.json"


def classify(row: EpisodeRow) -> str:
    """The split rule (records.SPLIT_RULE), written once: operator verdict first, then quality."""
    verdict = row.qc_verdict.strip().lower()
    if verdict == Verdict.PASS:
        return ACCEPTED
    if verdict == Verdict.FAIL:
        return REJECTED
    return ACCEPTED if row.quality.strip().lower() == Quality.GREEN else REJECTED


def is_unrated(row: EpisodeRow) -> bool:
    """No quality field and no operator verdict: the rule rejects it, but nobody judged it.

    Datasets recorded by other tools (LeRobot's own recorder) have no quality fields at all;
    their episodes all land in rejected. Counted so the user is told, not left with
    "accepted 0" and no reason.
    """
    # A foreign row's non-text value ("quality": null) stays in extra: it counts as rated
    # (present, not green), a falsy non-text verdict as none.
    rated = row.quality.strip() or "quality" in row.extra
    return not rated and not row.qc_verdict.strip() and not row.extra.get("qc_verdict")


class Faults:
    """Named checkpoints; raising at the one named ``fail_at`` lets tests break any step."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.fail_at = fail_at
        self.passed: list[str] = []

    def check(self, name: str) -> None:
        if self.fail_at is not None and name == self.fail_at:
            raise ExportError(f"injected failure at {name!r}")
        self.passed.append(name)


@dataclass
class SplitPlan:
    checks: tuple[SourceCheck, ...]  # in request order; one for a classic export
    subsets: dict[str, list[PlannedEpisode]]
    tasks: dict[str, list[tuple[int, str]]]  # subset -> [(new task_index, text)]
    home: Path | None = None  # a named export's home: its marker's source_dir, provenance in rows

    @property
    def check(self) -> SourceCheck:
        return self.checks[0]

    @property
    def info(self) -> DatasetInfo:
        """The subsets' info: the first source's (the sources agree on every feature, merge.py)."""
        info = DatasetInfo.from_dict(self.check.meta.info.to_dict())
        info.robot_type = merged_robot_type(self.checks) if len(self.checks) > 1 else info.robot_type
        return info

    @property
    def unrated(self) -> list[int]:
        """Source indices of the episodes with no quality field, no verdict and no sidecar record."""
        out = []
        for check in self.checks:
            sidecar = read_sidecar(check.root)
            out += [e.index for e in check.episodes if is_unrated(quality_for(e.row, sidecar.get(e.index)))]
        return out

    @property
    def in_source_order(self) -> list[PlannedEpisode]:
        items = [p for s in self.subsets.values() for p in s]
        return sorted(items, key=lambda p: (p.source_no, p.source.index))


def _task_maps(checks: tuple[SourceCheck, ...], eps: list[tuple[int, SourceEpisode]]
               ) -> tuple[list[tuple[int, str]], list[dict[int, int]]]:
    """One subset's tasks merged by text (first use in source order, then task index) and each
    source's old -> new task index map."""
    texts: dict[str, int] = {}
    maps: list[dict[int, int]] = []
    for no, check in enumerate(checks):
        task_text = check.meta.task_text
        used = sorted({t for n, e in eps if n == no for t in e.task_indices})
        maps.append({old: texts.setdefault(task_text[old], len(texts)) for old in used})
    return [(i, t) for t, i in texts.items()], maps


def plan_split(checks: SourceCheck | tuple[SourceCheck, ...], home: Path | None = None) -> SplitPlan:
    """Assign each source episode its subset, new index, frame offset and task remapping."""
    checks = checks if isinstance(checks, tuple) else (checks,)
    subsets: dict[str, list[PlannedEpisode]] = {ACCEPTED: [], REJECTED: []}
    tasks: dict[str, list[tuple[int, str]]] = {}
    by_subset: dict[str, list[tuple[int, SourceEpisode]]] = {ACCEPTED: [], REJECTED: []}
    for no, check in enumerate(checks):
        sidecar = read_sidecar(check.root)  # offline verdicts of rows that carry none (quality/store.py)
        for ep in check.episodes:  # episodes.jsonl order
            by_subset[classify(quality_for(ep.row, sidecar.get(ep.index)))].append((no, ep))
    for name, eps in by_subset.items():
        tasks[name], maps = _task_maps(checks, eps)
        offset = 0
        for new, (no, ep) in enumerate(eps):
            prov = source_provenance(checks[no]) if home is not None else {}
            subsets[name].append(PlannedEpisode(ep, name, new, offset, maps[no], no, prov))
            offset += ep.rows
    return SplitPlan(checks, subsets, tasks, home)


@dataclass
class SubsetResult:
    name: str
    dir: Path
    source_indices: list[int]
    episodes: int
    frames: int
    reencoded: list[int] = field(default_factory=list)  # source indices cut by re-encoding


@dataclass
class SplitResult:
    subsets: dict[str, SubsetResult]
    reused: int = 0
    built: int = 0
    unrated: list[int] = field(default_factory=list)  # source indices: no quality, no verdict

    @property
    def reencoded(self) -> list[int]:
        """Source episodes with a camera re-encoded (no exact stream-copy cut; v3.0 sources)."""
        return sorted(i for s in self.subsets.values() for i in s.reencoded)


@dataclass
class SplitProgress:
    """Called once per unit (reused or built) with its files and bytes."""

    on_unit: Callable[[PlannedEpisode, int, int, bool], None] = lambda p, files, nbytes, reused: None


# ---- staging ------------------------------------------------------------------------------------
def prepare_staging(staging: Path, source_dir: Path, fmt: str, src_hash: str) -> bool:
    """Reuse ``staging`` if its manifest names this exact source state, else start it afresh.

    Returns True when an earlier run's staging is reused.
    """
    manifest = staging / MANIFEST
    want = {"source_dir": str(source_dir), "format": fmt, "source_hash": src_hash}
    if staging.exists():
        try:
            have = read_json(manifest)
            if all(have.get(k) == v for k, v in want.items()):
                return True
        except (OSError, ValueError):
            pass
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    atomic_write_json(manifest, {**want, "created_at": time.time()})
    return False


#: A pool task holds consecutive units up to this many frames or episodes (a long episode is
#: a task of its own; short ones are batched, so the worker round trip is paid per batch).
BATCH_FRAMES = 600
BATCH_EPISODES = 32


def batches(work: list[UnitWork], workers: int) -> list[list[UnitWork]]:
    """Consecutive units grouped, and at least ``workers`` groups when there are as many units."""
    cap = max(1, min(BATCH_EPISODES, len(work) // max(1, workers)))
    out: list[list[UnitWork]] = []
    frames = 0
    for w in work:
        if not out or len(out[-1]) >= cap or frames >= BATCH_FRAMES:
            out.append([])
            frames = 0
        out[-1].append(w)
        frames += w.planned.source.rows
    return out


def split_batch(staging: Path, batch: list[UnitWork], info: DatasetInfo) -> int:
    """One pool task: ``split_units`` with the batch's directories checked once (confine)."""
    with confine.checked_dirs():
        return split_units(staging, batch, info)


def build_units(plan: SplitPlan, staging: Path, progress: SplitProgress, faults: Faults) -> tuple[int, int]:
    """Build every unit without a valid record; returns (reused, built).

    Units are independent (each has its own files and record), so batches of them run on the
    active eva_export.pool executor (worker processes, or Ray tasks); progress is reported from
    this thread as each batch finishes. A failure stops the export after the batches already
    running finish: their committed units are kept for the rerun.
    """
    from .. import pool

    info = plan.info
    reused = 0
    work: list[UnitWork] = []
    for p in plan.in_source_order:
        if unit_record(staging, p).is_file() and unit_is_complete(staging, p, info):
            reused += 1
            progress.on_unit(p, 1 + len(p.source.video_paths), p.source.bytes, True)
            continue
        unit_record(staging, p).unlink(missing_ok=True)
        ep_stats = plan.checks[p.source_no].meta.episodes_stats
        src_stats = ep_stats[p.source.index].stats if p.source.index in ep_stats else {}
        work.append(UnitWork(p, src_stats, faults.fail_at == f"unit:{p.source.index}"))
    active = pool.active()
    units = [pool.Unit("; ".join(unit_name(w.planned) for w in b), split_batch, (staging, b, info))
             for b in batches(work, active.workers if active is not None else 1)]
    built = 0

    def done(u: pool.Unit, _nbytes: int) -> None:
        nonlocal built
        for w in u.args[1]:
            built += 1
            faults.passed.append(f"unit:{w.planned.source.index}")
            progress.on_unit(w.planned, 1 + len(w.planned.source.video_paths), w.planned.source.bytes, False)

    pool.run_units(units, done)
    return reused, built


# ---- assembly -----------------------------------------------------------------------------------
def assemble_subset(plan: SplitPlan, name: str, staging: Path, marker: QualitySplit) -> SubsetResult:
    """Write the meta files of the native subset whose units are in place (marker last)."""
    src_info = plan.info
    items = plan.subsets[name]
    out = native_dir(staging, name)
    meta = out / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    for dirpath, _dirs, names in os.walk(out):  # temporaries a killed run left behind
        for n in names:
            if n.startswith(".") and n.endswith(".tmp"):
                os.unlink(os.path.join(dirpath, n))
    info = DatasetInfo.from_dict(src_info.to_dict())
    # streamed: one unit record in memory at a time (assemble.py), not every row and stats dict
    episodes, ep_stats, total = JsonlStream(out / EPISODES), JsonlStream(out / EPISODES_STATS), StatsSum()
    frames = 0
    reencoded: list[int] = []
    try:
        for p in items:
            u = UnitRecord.from_dict(read_json(unit_record(staging, p)))
            episodes.write(u.row)
            if REENCODED_FIELD in u.row:
                reencoded.append(p.source.index)
            ep_stats.write({"episode_index": p.new_index, "stats": u.stats})
            total.add(u.stats)
            frames += u.rows
    except BaseException:
        episodes.discard()
        ep_stats.discard()
        raise
    episodes.commit()
    ep_stats.commit()
    info.set_totals(len(items), frames, len(plan.tasks[name]))
    info.extra["dataset_format"] = FORMAT_V21
    write_text(out / TASKS, jsonl_dumps({"task_index": i, "task": t} for i, t in plan.tasks[name]))
    write_text(out / STATS, dumps_json(total.result()))
    write_text(out / INFO, dumps_json(info.to_dict()))
    write_text(out / QUALITY_SPLIT_FILE, dumps_json(marker.to_dict()))
    return SubsetResult(name, out, [p.source.index for p in items], len(items), frames, reencoded)


def judged_rows(plan: SplitPlan) -> dict[str, list[EpisodeRow]]:
    """Each side's rows as the split rule judged them (the sidecar's rating applied)."""
    sidecars = [read_sidecar(c.root) for c in plan.checks]
    return {name: [quality_for(p.source.row, sidecars[p.source_no].get(p.source.index)) for p in items]
            for name, items in plan.subsets.items()}


def make_marker(plan: SplitPlan, name: str, fmt: str, job_id: str,
                judged: dict[str, list[EpisodeRow]] | None = None) -> QualitySplit:
    from .. import __version__
    from ..formats.card import DECISIONS_KEY, TOOL_VERSION_KEY, SplitDecisions

    items = plan.subsets[name]
    judged = judged if judged is not None else judged_rows(plan)
    decisions = SplitDecisions.of(judged[ACCEPTED], judged[REJECTED])
    # for the dataset card: why each side holds its episodes, and which tool split them
    extra: dict[str, Any] = {DECISIONS_KEY: decisions.to_dict(), TOOL_VERSION_KEY: __version__}
    home = plan.home if plan.home is not None else Path(os.path.realpath(plan.check.root))
    if plan.home is not None:  # a named export: every source, and where each episode came from
        extra[SOURCES_KEY] = [SourceRef.of(c).to_dict() for c in plan.checks]
        extra[ORIGINS_KEY] = [EpisodeOrigin(str(p.provenance[SOURCE_DATASET_FIELD]), p.source.index).to_dict()
                              for p in items]
    return QualitySplit(
        source_dir=str(home), subset=name, dataset_format=fmt,
        source_episode_indices=[p.source.index for p in items],
        episode_count=len(items), frame_count=sum(p.source.rows for p in items),
        accepted_count=len(plan.subsets[ACCEPTED]), rejected_count=len(plan.subsets[REJECTED]),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), job_id=job_id,
        unrated_count=len(plan.unrated), extra=extra,
    )


@dataclass
class NativeSplit:
    """Runs the native split of validated sources (one, or several for a named export) inside a
    staging root."""

    check: SourceCheck | tuple[SourceCheck, ...]
    staging: Path
    job_id: str
    marker_format: str = FORMAT_V21
    progress: SplitProgress = field(default_factory=SplitProgress)
    faults: Faults = field(default_factory=Faults)
    home: Path | None = None  # a named export's home (merge.py)

    def run(self) -> SplitResult:
        plan = plan_split(self.check, self.home)
        reused, built = build_units(plan, self.staging, self.progress, self.faults)
        self.faults.check("split_units")
        out: dict[str, SubsetResult] = {}
        judged = judged_rows(plan)
        for name in (ACCEPTED, REJECTED):
            marker = make_marker(plan, name, self.marker_format, self.job_id, judged)
            out[name] = assemble_subset(plan, name, self.staging, marker)
            self.faults.check(f"assemble_{name}")
        return SplitResult(out, reused=reused, built=built, unrated=plan.unrated)


def split_dataset(source: Path, out_root: Path, job_id: str = "") -> SplitResult:
    """Convenience for scripts and benches: validate ``source`` and split it into ``out_root``.

    ``out_root/accepted`` and ``out_root/rejected`` are written through a staging root beside
    them (reused when rerun); no publication logic.
    """
    from ..sources.registry import validate_any

    check = validate_any(source, allow_empty_dataset=False)
    staging = Path(out_root) / ".staging"
    prepare_staging(staging, check.root, FORMAT_V21, check.source_hash)
    res = NativeSplit(check, staging, job_id).run()
    for name, sub in res.subsets.items():
        dst = Path(out_root) / name
        if dst.exists():
            shutil.rmtree(dst)
        os.rename(sub.dir, dst)
        sub.dir = dst
    shutil.rmtree(staging)
    return res
