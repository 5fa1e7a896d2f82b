"""Source validation's per-file proofs made ahead on a worker process (a large first export).

Validation checks every episode in order on one thread; a rerun on an unchanged source skips
the reads its facts index proves (validate_tables, video_facts). A first export has no such
facts, and a large export job has a worker process warmed up for it (pool.warm_for)
that is idle while the source is validated. ``ProveAhead`` gives that worker the episodes from
the back, batch by batch: it runs the same table and camera checks on its own reads and returns
what they proved, as the facts index stores it (file identity taken before the read, context
kind, payload). The validating thread puts each proof into the index before it checks the next
episode, and an episode it reaches finds its files proven, as on a rerun.

Nothing else changes: every check the index does not prove still runs on the validating thread
in episode order, and every error comes from there, with its message. A file the worker could
not prove (a fault, a file changed since, one too fresh to key) has no proof and is checked as
before; a proof of a file changed after the worker read it is keyed by the old identity and
never found. The two stop meeting in the middle: a batch the validating thread has reached is
not sent. Any failure of the worker only costs its proofs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from ... import pool
from ...errors import EvaError
from ..common import mp4_index, reuse, video_facts
from ..common.facts_index import FileKey
from ..common.meta import DatasetMeta
from ..common.records import DatasetInfo, EpisodeRow, TaskRow
from ..common.video import stream_timing, timing_problems
from .read_ahead import episode_paths
from .validate_media import check_images, demux_parse
from .validate_tables import TableFacts, context_kind, table_key

BATCH = 16  # episodes a unit proves (the validating thread waits for at most two when it ends)
MIN_EPISODES = 2 * BATCH  # fewer: the validating thread is done before the worker helps

class Proof(NamedTuple):
    """A facts index row (file identity, kind, payload), and a camera file's box parse for the
    direct v3 writer's probe (reuse.py), as validation keeps its own."""

    key: FileKey
    kind: str
    payload: str
    parse: mp4_index.Mp4Samples | None = None


@dataclass(frozen=True)
class ProofContext:
    """What every proof of one source depends on (the table kind names its hash)."""

    root: Path
    info: DatasetInfo
    tasks: list[TaskRow]
    kind: str
    check: Callable[..., tuple[int, list[str], list[int], Any]]  # validate.check_table (by reference)


@dataclass(frozen=True)
class ProofItem:
    row: EpisodeRow
    offset: int  # its first frame's global index
    data: Path
    videos: dict[str, Path]


def prove_batch(ctx: ProofContext, items: list[ProofItem]) -> list[Proof]:
    """One pool unit (in the worker): the proofs of the items' files that pass their checks."""
    meta = DatasetMeta(ctx.root, ctx.info, [], ctx.tasks, {})
    out: list[Proof] = []
    for it in items:
        out += _table_proof(ctx, meta, it)
        for key, path in it.videos.items():
            out += _video_proof(meta, it, key, path)
    return out


def _table_proof(ctx: ProofContext, meta: DatasetMeta, it: ProofItem) -> list[Proof]:
    try:
        tkey = table_key(os.stat(it.data), ctx.kind)
        if tkey is None:
            return []
        rows, columns, tasks, _ = ctx.check(ctx.root, meta, it.row, it.data, it.videos, meta.task_text,
                                              meta.task_index, it.offset)
        check_images(meta, it.row.episode_index, it.data)
    except (EvaError, OSError):
        return []
    return [Proof(tkey, context_kind(ctx.kind, it.row, it.offset), TableFacts(rows, columns, tasks).to_payload())]


def _video_proof(meta: DatasetMeta, it: ProofItem, key: str, path: Path) -> list[Proof]:
    fkey = video_facts.file_key(path)
    if fkey is None:
        return []
    try:
        (width, height, frames, timing), found = demux_parse(it.row.episode_index, key, path, fkey)
        if isinstance(timing, Exception) or frames != it.row.length:
            return []
        timing = stream_timing(path) if timing is None else timing
        problems = tuple(timing_problems(timing, meta.info.fps, frames, check_duration=False))
    except Exception:  # noqa: BLE001 - any fault: no proof, the validating thread finds it itself
        return []
    facts = video_facts.VideoFacts(width, height, frames, meta.info.fps, problems)
    # the parse of the bytes just read, for the v3 writer's probe of a small file (reuse.py)
    return [Proof(fkey, video_facts.KIND, facts.to_payload(), found if fkey[2] <= reuse.MAX_FILE else None)]


class _Units(pool.LazyUnits):
    """The batches from the last one back; a batch the validating thread reached is empty."""

    def __init__(self, prover: ProveAhead) -> None:
        self.prover = prover

    def __len__(self) -> int:  # none left once validation ended: the pool sends no more
        return 0 if self.prover.stopped else (len(self.prover.offsets) + BATCH - 1) // BATCH

    def unit(self, b: int) -> pool.Unit:
        return pool.Unit(f"proofs ahead, batch {b}", prove_batch, (self.prover.ctx, self.prover.items(b)))


class ProveAhead:
    """``apply(n)`` before episode ``n`` is checked; a context manager (its worker stops on exit)."""

    def __init__(self, meta: DatasetMeta, kind: str, check: Callable[..., tuple[int, list[str], list[int], Any]]
                 ) -> None:
        """``check``: the table check validation runs itself (validate.check_table)."""
        self.meta, self.kind = meta, kind
        self.ctx = ProofContext(meta.root, meta.info, meta.tasks, kind, check)
        self.offsets: list[int] = []
        self._front = 0  # the episode the validating thread checks next
        self._pending: list[Proof] = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProveAhead:
        ex = pool.active()
        n = len(self.meta.episodes)
        if self.kind and n >= MIN_EPISODES and isinstance(ex, pool.LocalPool) and ex.warm:
            at = 0
            for row in self.meta.episodes:
                self.offsets.append(at)
                at += max(0, row.length)
            ex.prestart(1)  # the warmed worker takes the units (no serial start in this thread)
            self._thread = threading.Thread(target=self._run, args=(ex,), name="prove-ahead", daemon=True)
            self._thread.start()
        return self

    def items(self, b: int) -> list[ProofItem]:
        """Batch ``b`` counted from the end, made when the pool takes it (paths confined here)."""
        n = len(self.offsets)
        lo, hi = max(0, n - (b + 1) * BATCH), n - b * BATCH
        with self._lock:
            if self._stop or hi <= self._front + 1:
                return []
        out = []
        for i in range(lo, hi):
            try:
                data, videos = episode_paths(self.meta, i)
            except EvaError:
                continue  # the validating thread names it
            out.append(ProofItem(self.meta.episodes[i], self.offsets[i], data, videos))
        return out

    def _run(self, ex: pool.LocalPool) -> None:
        try:
            ex.run(_Units(self), self._done, workers=1, depth=2)
        except Exception:  # noqa: BLE001,S110 - proofs are an optimisation: the checks still run
            pass

    @property
    def stopped(self) -> bool:
        with self._lock:
            return self._stop

    def _done(self, _unit: pool.Unit, proofs: list[Proof]) -> None:
        # never raised out of: the pool must take every result in flight before it is reused
        with self._lock:
            if not self._stop:
                self._pending += proofs

    def apply(self, n: int) -> None:
        """The proofs that arrived, into the facts index (this thread owns its connection)."""
        with self._lock:
            self._front = n
            proofs, self._pending = self._pending, []
        for p in proofs:
            video_facts.index_put(p.key, p.kind, p.payload)
            if p.parse is not None:
                reuse.keep(p.key, p.parse, p.parse.facts.frames)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._stop = True
        if self._thread is not None:
            self._thread.join()

