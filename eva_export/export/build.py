"""Building the split's units: every planned episode without a valid record, in batches on
the active eva_export.pool executor (split.py plans, assembles and runs the split)."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import confine, pool
from ..errors import ExportError
from ..formats.common.records import DatasetInfo
from ..formats.common.source import SourceCheck
from .plan_list import PlanList, positions_of
from .units import PlannedEpisode, UnitWork, split_units, unit_is_complete, unit_name, unit_record, units_dir


class SplitPlan(Protocol):
    """What building the units reads of split.SplitPlan (a protocol: split imports this module)."""

    @property
    def checks(self) -> tuple[SourceCheck, ...]: ...
    @property
    def subsets(self) -> dict[str, PlanList]: ...
    @property
    def info(self) -> DatasetInfo: ...


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
class SplitProgress:
    """Called once per unit (reused or built) with its files and bytes."""

    on_unit: Callable[[PlannedEpisode, int, int, bool], None] = lambda p, files, nbytes, reused: None


#: A pool task holds consecutive units up to this many frames or episodes (a long episode is
#: a task of its own; short ones are batched, so the worker round trip is paid per batch).
BATCH_FRAMES = 600
BATCH_EPISODES = 32


def batches(frames: Sequence[int], workers: int) -> list[tuple[int, int]]:
    """Consecutive units (of ``frames`` each) grouped as [start, end) ranges, and at least
    ``workers`` groups when there are as many units."""
    cap = max(1, min(BATCH_EPISODES, len(frames) // max(1, workers)))
    out: list[tuple[int, int]] = []
    held = 0
    for n, f in enumerate(frames):
        if not out or out[-1][1] - out[-1][0] >= cap or held >= BATCH_FRAMES:
            out.append((n, n))
            held = 0
        out[-1] = (out[-1][0], n + 1)
        held += f
    return out


def split_batch(staging: Path, batch: list[UnitWork], info: DatasetInfo) -> int:
    """One pool task: ``split_units`` with the batch's directories checked once (confine)."""
    with confine.checked_dirs():
        return split_units(staging, batch, info)


class _Units(pool.LazyUnits):
    """The pool tasks of the units to build, each made when the pool takes it: a UnitWork
    carries the episode's parsed source statistics (about 30 KB for two cameras), so making
    every task up front held them all at once."""

    def __init__(self, plan: SplitPlan, staging: Path, info: DatasetInfo, faults: Faults,
                 todo: tuple[array[int], array[int]], workers: int) -> None:
        self.plan, self.staging, self.info, self.faults, self.todo = plan, staging, info, faults, todo
        lists = list(plan.subsets.values())
        self._lists = lists
        self.bounds = batches([lists[s].rows_at(n) for s, n in zip(*todo, strict=True)], workers)

    def __len__(self) -> int:
        return len(self.bounds)

    def _work(self, k: int) -> UnitWork:
        p = self._lists[self.todo[0][k]][self.todo[1][k]]
        ep_stats = self.plan.checks[p.source_no].meta.episodes_stats
        src_stats = ep_stats[p.source.index].stats if p.source.index in ep_stats else {}
        return UnitWork(p, src_stats, self.faults.fail_at == f"unit:{p.source.index}")

    def unit(self, b: int) -> pool.Unit:
        start, end = self.bounds[b]
        work = [self._work(k) for k in range(start, end)]
        return pool.Unit("; ".join(unit_name(w.planned) for w in work), split_batch, (self.staging, work, self.info))


def build_units(plan: SplitPlan, staging: Path, progress: SplitProgress, faults: Faults) -> tuple[int, int]:
    """Build every unit without a valid record; returns (reused, built).

    Units are independent (each has its own files and record), so batches of them run on the
    active eva_export.pool executor (worker processes, or Ray tasks); progress is reported from
    this thread as each batch finishes. A failure stops the export after the batches already
    running finish: their committed units are kept for the rerun.
    """
    info = plan.info
    reused = 0
    order = list(plan.subsets)
    todo: tuple[array[int], array[int]] = (array("l"), array("q"))  # (subset, position) of the units to build
    # a subset without a records directory (a fresh staging) has no record to check or remove,
    # and its episodes' plans need not be rebuilt here (their pool tasks rebuild them)
    held = {name for name in order if units_dir(staging, name).is_dir()}
    lists = list(plan.subsets.values())
    for s, n in positions_of(lists):  # source order
        if order[s] in held:
            p = lists[s][n]
            rec = unit_record(staging, p)
            if rec.is_file() and unit_is_complete(staging, p, info):
                reused += 1
                progress.on_unit(p, 1 + len(p.source.video_paths), p.source.bytes, True)
                continue
            rec.unlink(missing_ok=True)
        todo[0].append(s)
        todo[1].append(n)  # its new index: the subset's episodes are numbered by position
    active = pool.active()
    units = _Units(plan, staging, info, faults, todo, active.workers if active is not None else 1)
    built = 0

    def done(u: pool.Unit, _nbytes: int) -> None:
        nonlocal built
        for w in u.args[1]:
            built += 1
            faults.passed.append(f"unit:{w.planned.source.index}")
            progress.on_unit(w.planned, 1 + len(w.planned.source.video_paths), w.planned.source.bytes, False)

    pool.run_units(units, done)
    return reused, built
