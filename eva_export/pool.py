"""Episode units in worker processes: the local pool, and the hook every unit loop goes through.

A *unit* is one picklable call ``fn(*args)`` (a module-level function and plain data) that
writes one episode's files under a temporary name and renames them into place; its result
(a small value) comes back to the caller's thread, which reports progress and commits
nothing else. Three executors run the same units:

* serial (no pool active, or 1 worker): in the calling thread, exactly as before;
* ``LocalPool``: N worker processes on this machine;
* ``eva_export.export.batch.RayPool``: Ray tasks on a cluster (optional extra).

The unit loops (export/split.py, formats/lerobot_v21/episode_files.py) call ``run_units``; which executor runs
them is chosen by whoever started the export, with ``using(pool)`` (a context variable, so
the export node's worker thread and the CLI each see their own).

Why fresh interpreters (``python -m eva_export.pool_worker``) rather than fork or
multiprocessing's spawn: the export node runs rclpy/DDS threads, and forking a process with
such threads can deadlock the child; multiprocessing's spawn and forkserver re-import the
parent's ``__main__`` (a node script, importing rclpy) in every worker. A worker here imports
only the core library. Each worker asks the kernel to kill it when its parent dies
(PR_SET_PDEATHSIG), so a killed export never leaves a worker finishing a unit behind the
back of the rerun; the rerun then finds the unit uncommitted and writes it again. The kernel
sends that signal when the *thread* that started the worker ends, so a pool starts its
workers from a spawner thread of its own, which lives as long as the pool: a unit loop driven
from a short-lived thread (a read-ahead feed) must not take the workers with it.

Memory per worker is that of one unit (units stream); the pool keeps at most one unit per
worker in flight. A worker process that dies (segfault, OOM kill) fails the job with the
episode it was running named (``UnitError``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol, cast

from .errors import EvaError, ExportError
from .pool_meter import SerialMeter
from .pool_worker import WorkerProc, unpickle_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unit:
    """One episode unit: ``fn(*args)`` must be picklable (module-level function, plain data)."""

    name: str  # how errors name it, e.g. "accepted episode 12 (source episode 30)"
    fn: Callable[..., Any]
    args: tuple[Any, ...]


class UnitError(ExportError):
    """A unit failed in a worker (exception or the worker process died); names the unit."""


Done = Callable[[Unit, Any], None]


class Executor(Protocol):
    workers: int

    def run(self, units: Sequence[Unit], on_done: Done) -> None:
        """Run every unit; call ``on_done(unit, result)`` in the caller's thread as each finishes.

        On the first failure no further unit starts; units already running finish (their
        committed files are kept for a rerun); then the failure is raised.
        """


_active: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("eva_export_unit_pool", default=None)


@contextlib.contextmanager
def using(executor: Executor | None) -> Iterator[Executor | None]:
    """Run the unit loops of this thread's exports on ``executor`` (None: serial)."""
    token = _active.set(executor)
    try:
        yield executor
    finally:
        _active.reset(token)


#: A job of this many episodes or more on an auto pool starts one worker before its validation:
#: the worker's imports (0.3 s) overlap it, it proves the source's last episodes meanwhile
#: (formats/lerobot_v21/prove_ahead.py), and the job's units then run on every core at once.
WARM_EPISODES = 256


def warm_for(episodes: int) -> None:
    """One worker started now for a job of ``episodes`` (info.json's count, a hint) if it is large."""
    ex = _active.get()
    if isinstance(ex, LocalPool) and episodes >= WARM_EPISODES:
        ex.warm_up()


def active() -> Executor | None:
    return _active.get()


def reads_here() -> bool:
    """Whether this thread's unit loops may run their units here: serial, or an auto pool (which
    runs them here while they are cheap) with no worker warmed up for them, not workers started
    up front or Ray tasks."""
    ex = _active.get()
    return ex is None or ex.workers <= 1 or (isinstance(ex, LocalPool) and ex.auto and not ex.warm)


def run_units(units: Sequence[Unit], on_done: Done) -> None:
    """Run units on the active executor, or serially in this thread when there is none."""
    ex = _active.get()
    if ex is None or ex.workers <= 1 or len(units) <= 1:
        for u in units:
            on_done(u, u.fn(*u.args))  # serial: exceptions propagate unchanged, as before
        return
    ex.run(units, on_done)


class LazyUnits(Sequence[Unit]):
    """Units made one at a time, by position, when a pool takes them (``unit``), never listed up
    front: what a unit carries (a batch's parsed statistics, its paths) exists only while it is
    in flight, whatever the episode count."""

    def unit(self, k: int) -> Unit:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self.unit(i) for i in range(*k.indices(len(self)))]
        return self.unit(k)

    def __iter__(self) -> Iterator[Unit]:
        for k in range(len(self)):
            yield self.unit(k)


class Aside:
    """One unit running on a pool worker, from a thread of its own; ``result`` waits for it."""

    def __init__(self, ex: LocalPool, unit: Unit) -> None:
        self._out: list[Any] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(ex, unit), name="pool-aside", daemon=True)
        self._thread.start()

    def _run(self, ex: LocalPool, unit: Unit) -> None:
        try:
            ex.run([unit], lambda _u, r: self._out.append(r), workers=1)
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the caller's thread
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None or not self._out:
            raise self._error or UnitError("the unit returned nothing")
        return self._out[0]


def beside(unit: Unit) -> Aside | None:
    """``unit`` started on a worker of the active pool that is up and whose units no longer run
    in the caller, beside what the caller does next; None (run it yourself) otherwise."""
    ex = _active.get()
    if isinstance(ex, LocalPool) and not ex.serial_first and ex.worker_ready():
        return Aside(ex, unit)
    return None


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def raise_unit_failure(unit: Unit, exc: BaseException | None, detail: str) -> None:
    """Re-raise a worker's exception in the caller: the original one when it is ours and
    already names the episode, else a UnitError that names the unit."""
    if isinstance(exc, EvaError) and _names(exc, unit):
        raise exc
    raise UnitError(f"{unit.name}: {detail}") from exc


def _names(exc: BaseException, unit: Unit) -> bool:
    text = str(exc)
    return any(tag in text for tag in unit_tags(unit))


def unit_tags(unit: Unit) -> list[str]:
    """The "episode N" phrases of a unit name (its own index and its source index)."""
    words = unit.name.replace("(", " ").replace(")", " ").split()
    return [f"episode {words[i + 1]}" for i, w in enumerate(words[:-1]) if w == "episode"]


# ---- the local pool ---------------------------------------------------------------------------
class Taker:
    """The units of a sequence from ``start`` on, taken one at a time in order (truthy while
    any is left), so that only the units in flight exist at once."""

    def __init__(self, units: Sequence[Unit], start: int = 0) -> None:
        self.units, self.next = units, start

    def __bool__(self) -> bool:
        return self.next < len(self.units)

    def pop(self) -> Unit:
        u = self.units[self.next]
        self.next += 1
        return u


class _Round:
    """One ``LocalPool.run``: units sent to the workers as they have room (``depth`` in flight
    each), results handed to ``on_done`` in the caller's thread; the first failure stops the
    sending, the units in flight finish."""

    def __init__(self, todo: Taker, on_done: Done, depth: int) -> None:
        self.todo, self.on_done, self.depth = todo, on_done, max(1, depth)
        self.failure: tuple[Unit, BaseException | None, str] | None = None

    def drive(self, procs: list[WorkerProc]) -> None:
        """Until every unit is done or failed; a worker that died is removed from ``procs``."""
        while True:
            self._send(procs)
            busy = {w.conn: w for w in procs if w.units}
            if not busy:
                return
            for ready in wait(list(busy)):
                self._take(busy[cast(Connection, ready)], procs)

    def _send(self, procs: list[WorkerProc]) -> None:
        for w in list(procs):
            while self.todo and self.failure is None and len(w.units) < self.depth:
                u = self.todo.pop()
                try:
                    w.conn.send((u.fn, u.args))
                except OSError as exc:  # it died: the unit it was running is the one to name
                    procs.remove(w)
                    why = f"died while writing it (exit code {w.proc.wait()})" if w.units else f"is gone ({exc})"
                    self.failure = self.failure or (w.units[0] if w.units else u, None,
                                                    f"the worker process {w.proc.pid} {why}")
                    break
                w.units.append(u)

    def _take(self, w: WorkerProc, procs: list[WorkerProc]) -> None:
        try:
            msg = w.recv()
        except (EOFError, OSError):
            msg = EOFError
        if msg is None:
            return  # its start-up done; the unit runs
        u = w.units.popleft()
        if msg is EOFError:
            code = w.proc.wait()
            procs.remove(w)
            if self.failure is None:
                self.failure = (u, None, f"the worker process {w.proc.pid} died while writing it (exit code {code})")
        elif msg[0] == "ok":
            if self.failure is None:
                self.on_done(u, msg[1])
            else:  # committed anyway: report it, the rerun will reuse it
                with contextlib.suppress(Exception):
                    self.on_done(u, msg[1])
        elif self.failure is None:
            self.failure = (u, unpickle_error(msg[1]), str(msg[2]))


class LocalPool:
    """``workers`` worker processes on this machine, started on first use, reused across
    units and subsets of one export (a worker starts in ~0.3-1 s: the imports).

    ``auto`` (``export.workers: 0``, the default): units run in the caller while the work left,
    projected from the units done so far, stays under SERIAL_BUDGET_S (hard-linking split
    units take milliseconds each); the workers start once it does not (hdf5/mcap episodes take
    seconds each), and are reused for the rest of the job. An explicit worker count always
    uses the workers.
    """

    def __init__(self, workers: int | None = None, *, auto: bool = False) -> None:
        self.workers = max(1, int(workers or default_workers()))
        self.auto = auto
        self._procs: list[WorkerProc] = []
        # PR_SET_PDEATHSIG follows the starting thread: workers start on this one, which lives with the pool
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="pool-spawner")
        self.serial_units = 0  # units the auto mode ran in the caller (tests, benchmarks)
        self._handed = False  # units have gone to workers (auto mode's serial start is over)

    @property
    def serial_first(self) -> bool:
        """Auto mode with no unit handed to a worker yet: units run in the caller while cheap."""
        return self.auto and not self._handed

    @property
    def warm(self) -> bool:
        """Auto mode with a worker started ahead (``warm_up``) and no unit handed to it yet."""
        return self.serial_first and bool(self._procs)

    def worker_ready(self) -> bool:
        """Whether a started worker has finished its start-up (never waits)."""
        try:
            return any(w.poll_ready() for w in self._procs)
        except (EOFError, OSError):
            return False  # a worker that died starting: run() reports it when it is given a unit

    def warm_up(self) -> None:
        """Auto mode: one worker started now, its imports overlapping the caller's validation,
        for a job known to be large (it is used once the units go to workers)."""
        if self.auto and not self._procs:
            self._start(1)

    def _run_serial_while_cheap(self, units: Sequence[Unit], on_done: Done) -> int:
        """Run units in the caller while the projected rest is cheap; returns how many ran."""
        meter = SerialMeter()
        done = 0
        while done < len(units):
            u = units[done]
            on_done(u, u.fn(*u.args))  # as serial mode: exceptions propagate unchanged
            done += 1
            self.serial_units += 1
            if not meter.still_cheap(len(units) - done):
                break
        return done

    def _start(self, n: int) -> None:
        env = dict(os.environ)
        # The worker must import this same eva_export (a worktree on PYTHONPATH, or the install).
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        while len(self._procs) < n:
            self._procs.append(self._spawner.submit(WorkerProc, env).result())

    def prestart(self, n: int | None = None) -> None:
        """Start ``n`` workers (default: all) now, before any unit asks for them; the units go
        to them from now on (no serial start)."""
        self._handed = True
        self._start(self.workers if n is None else max(1, min(n, self.workers)))

    def run(self, units: Sequence[Unit], on_done: Done, workers: int | None = None, depth: int = 1) -> None:
        """``Executor.run``; ``workers``: start no more than these (the caller keeps a core busy);
        ``depth``: units in flight per worker (more than one: the worker is never idle while its
        next unit is made and sent, for units whose results only travel)."""
        # Units are taken by position as workers free up, never listed: a lazy sequence
        # (export/build.py) makes each one only when it is sent (memory flat).
        start = 0
        if self.serial_first:
            start = self._run_serial_while_cheap(units, on_done)
            if start >= len(units):
                return
        self._handed = True
        self._start(min(workers or self.workers, len(units) - start))
        rnd = _Round(Taker(units, start), on_done, depth)
        rnd.drive(self._procs)
        if rnd.failure is not None:
            raise_unit_failure(*rnd.failure)

    def close(self) -> None:
        # every worker told first: their interpreter teardowns (pyarrow, PyAV) overlap
        for w in self._procs:
            w.stop()
        for w in self._procs:
            w.reap()
        self._procs.clear()
        self._spawner.shutdown()  # its workers are gone: the thread they die with may end

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@contextlib.contextmanager
def local_pool(workers: int | None) -> Iterator[Executor | None]:
    """``using`` a LocalPool of ``workers`` (None or 0: auto, one per core when the work is
    worth it); 1 worker: serial, no process; N: N workers from the start."""
    auto = not workers
    n = max(1, int(workers or default_workers()))
    if n <= 1:
        with using(None):
            yield None
        return
    with LocalPool(n, auto=auto) as pool, using(pool):
        if not auto:
            pool.prestart()  # the workers' imports overlap with the validation of the source
        yield pool
