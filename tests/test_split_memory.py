"""The split's memory is flat in the episode count: no object per episode is held.

tracemalloc counts the Python allocations of validation, planning and the whole native split
(units, assembly) of the same short episodes at N and 4N episodes: what grows per episode
is the source's own episode rows (about 1 KB each) and its statistics index, never the SourceEpisode / PlannedEpisode
objects (3-4 KB each) or every episode's parsed statistics (tens of KB each) that the job
held before. Deterministic: the same inputs make the same allocations (the cyclic collector is
off while counting, and a first split warms every lazy import and cache), in a fresh process
of its own, so what the tests before it left in this one (caches, a grown heap) cannot move
the peak.
"""

from __future__ import annotations

import gc
import multiprocessing
import tracemalloc
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export import pool
from eva_export.export.split import NativeSplit, plan_split, prepare_staging
from eva_export.formats.common.records import FORMAT_V21
from eva_export.formats.lerobot_v21.validate import validate_source

#: Both past the counts where the split's batches (up to build.BATCH_EPISODES episodes, whose
#: parsed statistics are held together) still grow with the episode count: what grows from
#: one to the other is per episode, not a batch filling up. (At 12 and 48 the batch grew;
#: a 64 MiB buffer each JSON read allocated used to hide that peak.)
SMALL, BIG = 64, 128
#: Bytes each extra episode may add. Measured here: about 2.0 KB held (the episode row and the
#: statistics index entry) and 2.3 KB at the peak; a SourceEpisode and a PlannedEpisode per
#: episode add 3-4 KB more held, and every episode's parsed statistics tens of KB at the peak.
HELD_PER_EPISODE = 3000
PEAK_PER_EPISODE = 4000


def _source(root: Path, n: int) -> Path:
    return make_dataset(root / "raw", [Ep(frames=2, quality="green" if i % 3 else "red") for i in range(n)],
                        cameras=1, width=32, height=24)


def _measure(src: Path, staging: Path) -> tuple[int, int]:
    """(bytes held by the validated source and its plan, peak bytes of the whole split)."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        check = validate_source(src)
        prepare_staging(staging, check.root, FORMAT_V21, check.source_hash)
        plan = plan_split(check)
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.reset_peak()
        res = NativeSplit(check, staging, "job").run()
        peak = tracemalloc.get_traced_memory()[1] - base
        del plan
    finally:
        tracemalloc.stop()
        gc.enable()
    assert sum(s.episodes for s in res.subsets.values()) == len(check.episodes)
    return held, peak


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("memory")
    return {n: _source(base / f"n{n}", n) for n in (SMALL, BIG)}


def _measure_all(small: Path, big: Path, tmp: Path) -> tuple[int, int, int, int]:
    """In a fresh process: a warm-up split, then (held, peak) of the small and the big source."""
    pool.default_workers = lambda: 1  # the batch size, whatever the cores
    _measure(small, tmp / "warm")  # lazy imports and caches, not counted
    held_small, peak_small = _measure(small, tmp / "small")
    held_big, peak_big = _measure(big, tmp / "big")
    return held_small, peak_small, held_big, peak_big


def test_split_memory_is_flat_in_the_episode_count(sources: dict[int, Path], tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(1) as child:
        held_small, peak_small, held_big, peak_big = child.apply(_measure_all, (sources[SMALL], sources[BIG], tmp_path))
    extra = BIG - SMALL
    held_each, peak_each = (held_big - held_small) / extra, (peak_big - peak_small) / extra
    assert held_each < HELD_PER_EPISODE, f"{held_each:.0f} bytes held per extra episode ({held_small} -> {held_big})"
    assert peak_each < PEAK_PER_EPISODE, f"{peak_each:.0f} peak bytes per extra episode ({peak_small} -> {peak_big})"
