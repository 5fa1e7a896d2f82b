"""The quality split: validated sources -> complete native accepted/rejected datasets.

A source is any kind the source registry (formats/sources.py) validates (v2.1, v3.0, v2.0); the subsets are always real v2.1.
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..formats.common.commits import UnitRecord
from ..formats.common.episode_list import row_at
from ..formats.common.meta import EPISODES, EPISODES_STATS, INFO, STATS, TASKS
from ..formats.common.nonfinite import KnownCounts, float_keys
from ..formats.common.records import FORMAT_V21, DatasetInfo, EpisodeRow, Quality, Verdict
from ..formats.common.source import SourceCheck
from ..fsutil import atomic_write_json, dumps_json, jsonl_dumps, read_json
from ..quality.store import quality_for, read_sidecar
from .assemble import JsonlStream, StatsSum
from .build import Faults, SplitProgress, build_units
from .merge import ORIGINS_KEY, SOURCE_DATASET_FIELD, SOURCES_KEY, EpisodeOrigin, SourceRef, merged_robot_type
from .merge import provenance as source_provenance
from .plan_list import PlanList, positions_of
from .records import ACCEPTED, QUALITY_SPLIT_FILE, REJECTED, QualitySplit
from .units import (
    REENCODED_FIELD,
    PlannedEpisode,
    native_dir,
    unit_record_at,
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


@dataclass
class SplitPlan:
    checks: tuple[SourceCheck, ...]  # in request order; one for a classic export
    subsets: dict[str, PlanList]  # compact: a PlannedEpisode is rebuilt per access
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
            eps = check.episodes
            rows = (row_at(eps, n) for n in range(len(eps)))
            out += [r.episode_index for r in rows if is_unrated(quality_for(r, sidecar.get(r.episode_index)))]
        return out

    def in_source_order(self) -> Iterator[PlannedEpisode]:
        """Every planned episode, by source then source episode index (one rebuilt at a time)."""
        lists = list(self.subsets.values())
        for s, n in positions_of(lists):
            yield lists[s][n]


def _task_texts(plan: PlanList) -> list[tuple[int, str]]:
    """One subset's tasks merged by text (first use in source order, then task index), each
    source's old -> new task index map set in ``plan.task_maps``."""
    texts: dict[str, int] = {}
    used: list[set[int]] = [set() for _ in plan.checks]
    for p in plan:
        used[p.source_no].update(p.source.task_indices)
    for no, check in enumerate(plan.checks):
        task_text = check.meta.task_text
        plan.task_maps[no].update({old: texts.setdefault(task_text[old], len(texts)) for old in sorted(used[no])})
    return [(i, t) for t, i in texts.items()]


def plan_split(checks: SourceCheck | tuple[SourceCheck, ...], home: Path | None = None) -> SplitPlan:
    """Assign each source episode its subset, new index, frame offset and task remapping."""
    checks = checks if isinstance(checks, tuple) else (checks,)
    subsets: dict[str, PlanList] = {ACCEPTED: PlanList(checks, ACCEPTED), REJECTED: PlanList(checks, REJECTED)}
    for no, check in enumerate(checks):
        sidecar = read_sidecar(check.root)  # offline verdicts of rows that carry none (quality/store.py)
        prov = source_provenance(check) if home is not None else {}
        for plan in subsets.values():  # one dict per source, shared by its episodes (read only)
            plan.provenance[no] = prov
        eps = check.episodes
        for pos in range(len(eps)):  # episodes.jsonl order
            row = row_at(eps, pos)
            subsets[classify(quality_for(row, sidecar.get(row.episode_index)))].add(no, pos)
    tasks = {name: _task_texts(plan) for name, plan in subsets.items()}
    return SplitPlan(checks, subsets, tasks, home)


@dataclass
class SubsetResult:
    name: str
    dir: Path
    source_indices: list[int]
    episodes: int
    frames: int
    reencoded: list[int] = field(default_factory=list)  # source indices cut by re-encoding
    nonfinite: KnownCounts | None = None  # what the units counted (formats/common/nonfinite.py)


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
    known = KnownCounts(float_keys(info))
    try:
        for new in range(len(items)):  # the episode's new index (its plan is not rebuilt)
            u = UnitRecord.from_dict(read_json(unit_record_at(staging, name, new)))
            known.add(new, u.nonfinite)
            episodes.write(u.row)
            if REENCODED_FIELD in u.row:
                reencoded.append(items.source_index(new))
            ep_stats.write({"episode_index": new, "stats": u.stats})
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
    return SubsetResult(name, out, items.indices(), len(items), frames, reencoded, known)


def judged_rows(plan: SplitPlan) -> dict[str, list[EpisodeRow]]:
    """Each side's rows as the split rule judged them (the sidecar's rating applied)."""
    sidecars = [read_sidecar(c.root) for c in plan.checks]
    return {name: [quality_for(items.source_row(n), sidecars[items.source_no(n)].get(items.source_index(n)))
                   for n in range(len(items))]
            for name, items in plan.subsets.items()}


def make_marker(plan: SplitPlan, name: str, fmt: str, job_id: str,
                judged: dict[str, list[EpisodeRow]] | None = None) -> QualitySplit:
    from .. import __version__
    from ..formats.common.card import DECISIONS_KEY, TOOL_VERSION_KEY, SplitDecisions

    items = plan.subsets[name]
    judged = judged if judged is not None else judged_rows(plan)
    decisions = SplitDecisions.of(judged[ACCEPTED], judged[REJECTED])
    # for the dataset card: why each side holds its episodes, and which tool split them
    extra: dict[str, Any] = {DECISIONS_KEY: decisions.to_dict(), TOOL_VERSION_KEY: __version__}
    home = plan.home if plan.home is not None else Path(os.path.realpath(plan.check.root))
    if plan.home is not None:  # a named export: every source, and where each episode came from
        extra[SOURCES_KEY] = [SourceRef.of(c).to_dict() for c in plan.checks]
        extra[ORIGINS_KEY] = [EpisodeOrigin(str(items.provenance[items.source_no(n)][SOURCE_DATASET_FIELD]),
                                            items.source_index(n)).to_dict() for n in range(len(items))]
    return QualitySplit(
        source_dir=str(home), subset=name, dataset_format=fmt,
        source_episode_indices=items.indices(),
        episode_count=len(items), frame_count=items.frames,
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
    from ..formats.sources import validate_any

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
