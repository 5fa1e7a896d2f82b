"""The source side of the direct v3 writer, on all cores: episodes read ahead of the shards.

Reading an episode (its table, renumbered; its statistics; its NaN/inf counts: v3_episodes.py)
is independent of every other episode; writing the shards is not (one open file per stream,
episodes in order). So the reading runs as batches of episodes on the job's executor
(eva_export.pool, as the split's units do), driven from a thread, while the calling thread
writes the shards in episode order from what has arrived. The values are the same as reading
in the writer's thread: byte-identical shards, whatever the executor.

At most about ``AHEAD`` episodes wait (plus the batches in flight); the writer never waits on a
full buffer (the pool keeps delivering until the episode it needs is there). A failure of a
batch is raised in the writer's thread when it asks for an episode of that batch or later.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from .. import confine, pool, pool_meter
from ..formats.common.records import DatasetInfo
from .build import batches
from .plan_list import PlanList
from .units import PlannedEpisode, unit_name
from .v3_episodes import episode_rows
from .v3_records import EpisodeEntry

AHEAD = 256
Read = tuple[pa.Table, EpisodeEntry]
SourceStats = Callable[[PlannedEpisode], dict[str, Any]]


def rows_batch(batch: list[tuple[PlannedEpisode, dict[str, Any]]], info: DatasetInfo,
               float_keys: list[str]) -> list[tuple[bytes, EpisodeEntry]]:
    """One pool task: consecutive episodes read from their source (confine checked once).
    Each table travels as Arrow IPC: a pickled table loses its list fields' child names
    (``element`` comes back ``item``), which the shard's Arrow schema would then record."""
    with confine.checked_dirs():
        return [(_ipc(table), entry) for table, entry in (episode_rows(p, info, st, float_keys) for p, st in batch)]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _table(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


class _Units(pool.LazyUnits):
    """Each batch's pool task, made when the pool takes it (its source statistics read then)."""

    def __init__(self, feed: Feed, bounds: list[tuple[int, int]]) -> None:
        self.feed, self.bounds = feed, bounds

    def __len__(self) -> int:
        return len(self.bounds)

    def unit(self, b: int) -> pool.Unit:
        f = self.feed
        if not f.claim(b):  # the writer read it while it waited for an earlier one
            return pool.Unit(f"batch {b} (read by the writer)", rows_batch, ([], f.info, f.float_keys))
        start, end = self.bounds[b]
        work = [(p, f.source_stats(p)) for p in (f.items[i] for i in range(f.start + start, f.start + end))]
        return pool.Unit("; ".join(unit_name(p) for p, _ in work), rows_batch, (work, f.info, f.float_keys))


class Feed:
    """Episodes ``start`` .. end of ``items`` as ``get(i)`` hands them out, in any order asked
    once each (the writer asks in order).

    With an auto pool that has no worker yet, the batches are read in the writer's thread while
    the pool's measure says the rest is cheap, and handed to the pool (driven from a thread)
    once it is not: a thread running them one by one beside the writer only added a second
    Python thread contending for the interpreter (0.2 CPU s on 600 four-frame episodes)."""

    def __init__(self, items: PlanList, start: int, info: DatasetInfo, float_keys: list[str],
                 source_stats: SourceStats) -> None:
        self.items, self.start, self.info, self.float_keys = items, start, info, float_keys
        self.source_stats = source_stats
        self.executor = pool.active()  # a context variable: read here, in the writer's thread
        self._ready: dict[int, Read] = {}
        self._want = start
        self._error: BaseException | None = None
        self._done = self._cancel = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._meter: pool_meter.SerialMeter | None = None  # batches read here, measured
        self._next = 0  # the next batch to read here
        self._workers: int | None = None  # workers reading (a LocalPool's), None: the executor's
        self._warm = False
        self._sent = 0  # batches below this were taken by the pool (it takes them in order)
        self._stolen: set[int] = set()  # batches the writer read itself, not yet taken by the pool
        if self.executor is not None and start < len(items):
            frames = [items.rows_at(i) for i in range(start, len(items))]
            self.bounds = batches(frames, self.executor.workers)
            ex = self.executor
            if isinstance(ex, pool.LocalPool) and ex.serial_first:
                self._meter = pool_meter.SerialMeter()
                self._warm = ex.warm  # a worker starting for this job (warm): its reads once it is up
            else:  # workers started up front, or Ray
                self._hand_over(0)

    def _hand_over(self, first: int) -> None:
        """Batches ``first`` on (at least one) read by the pool, from a thread of their own."""
        self._meter = None
        ex = self.executor
        assert ex is not None
        if isinstance(ex, pool.LocalPool):
            # auto mode: this thread keeps a core busy writing the shards; the rest read
            self._workers = min(len(self.bounds) - first, max(1, ex.workers - 1) if ex.auto else ex.workers)
            ex.prestart(self._workers)  # the units go to the workers: no serial start in run()
        self.bounds = self.bounds[first:]
        self._thread = threading.Thread(target=self._produce, name="v3-feed", daemon=True)
        self._thread.start()

    def _read_here(self, i: int) -> Read:
        """Episode ``i``, its batch read in this thread if not read yet (measured)."""
        assert self._meter is not None
        if i not in self._ready:
            lo, hi = self.bounds[self._next]
            for k in range(self.start + lo, self.start + hi):
                self._ready[k] = self._read(k)
            self._next += 1
            left = len(self.bounds) - self._next
            if left and (not self._meter.still_cheap(left) or (self._warm and self._worker_ready())):
                self._hand_over(self._next)
        return self._ready.pop(i)

    def _worker_ready(self) -> bool:
        return isinstance(self.executor, pool.LocalPool) and self.executor.worker_ready()

    def _read(self, i: int) -> Read:
        p = self.items[i]
        return episode_rows(p, self.info, self.source_stats(p), self.float_keys)

    def _produce(self) -> None:
        assert self.executor is not None
        try:
            if isinstance(self.executor, pool.LocalPool):
                # two batches in flight per worker: it reads the next while this one travels
                self.executor.run(_Units(self, self.bounds), self._arrived, self._workers, depth=2)
            else:
                self.executor.run(_Units(self, self.bounds), self._arrived)
        except BaseException as exc:  # noqa: BLE001 - handed to the writer's thread, raised there
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def claim(self, b: int) -> bool:
        """The pool takes batch ``b`` (in order): False when the writer has read it already."""
        with self._cond:
            self._sent = b + 1
            if b in self._stolen:
                self._stolen.discard(b)
                return False
            return True

    def _steal(self) -> int | None:
        """A batch the pool has not taken yet, for the writer to read while it waits (under the
        lock; None when none is left, or enough is read ahead)."""
        if len(self._ready) >= AHEAD:
            return None
        b = self._sent
        while b in self._stolen:
            b += 1
        if b >= len(self.bounds):
            return None
        self._stolen.add(b)
        return b

    def _arrived(self, unit: pool.Unit, reads: list[tuple[bytes, EpisodeEntry]]) -> None:
        with self._cond:
            if self._cancel:
                raise InterruptedError("the writer stopped")
            if not reads:
                return  # a batch the writer read
            base = unit.args[0][0][0].new_index  # the batch's first episode (its position)
            for k, (blob, entry) in enumerate(reads):
                self._ready[base + k] = (_table(blob), entry)
            self._cond.notify_all()
            # hold the pool while enough waits, unless the writer waits for an episode not here yet
            while len(self._ready) > AHEAD and self._want in self._ready and not self._cancel:
                self._cond.wait()

    def get(self, i: int) -> Read:
        if self._meter is not None:  # an auto pool with no worker: read here while cheap
            return self._read_here(i)
        if self._thread is None:  # no executor: read here
            return self._read(i)
        while True:
            with self._cond:
                self._want = i
                self._cond.notify_all()
                if i in self._ready:
                    return self._ready.pop(i)
                if self._error is not None:
                    raise self._error
                stolen = self._steal()
                if stolen is None:
                    if self._done:
                        raise RuntimeError(f"episode {i} was never read")  # a bug, not the source's fault
                    self._cond.wait()
                    continue
            # waiting for the pool: read a batch it has not taken yet, here (the pool skips it)
            lo, hi = self.bounds[stolen]
            reads = {k: self._read(k) for k in range(self.start + lo, self.start + hi)}
            with self._cond:
                self._ready.update(reads)

    def close(self) -> None:
        """Stop reading ahead (the writer finished or failed) and wait for the pool to return."""
        if self._thread is None:
            return
        with self._cond:
            self._cancel = True
            self._ready.clear()
            self._cond.notify_all()
        self._thread.join()
