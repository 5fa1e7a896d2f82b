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
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol, cast

from .errors import EvaError, ExportError

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


def active() -> Executor | None:
    return _active.get()


def reads_here() -> bool:
    """Whether this thread's unit loops may run their units here: serial, or an auto pool (which
    runs them here while they are cheap), not workers started up front or Ray tasks."""
    ex = _active.get()
    return ex is None or ex.workers <= 1 or (isinstance(ex, LocalPool) and ex.auto)


def run_units(units: Sequence[Unit], on_done: Done) -> None:
    """Run units on the active executor, or serially in this thread when there is none."""
    ex = _active.get()
    if ex is None or ex.workers <= 1 or len(units) <= 1:
        for u in units:
            on_done(u, u.fn(*u.args))  # serial: exceptions propagate unchanged, as before
        return
    ex.run(units, on_done)


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


class _Worker:
    def __init__(self, env: dict[str, str]) -> None:
        parent, child = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eva_export.pool_worker", str(child.fileno()), str(os.getpid())],
                pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.unit: Unit | None = None

    def close(self, timeout: float = 5.0) -> None:
        self.stop()
        self.reap(timeout)

    def stop(self) -> None:
        """Tell the worker to exit (it then tears its interpreter down)."""
        try:
            self.conn.send(None)
        except OSError:
            pass

    def reap(self, timeout: float = 5.0) -> None:
        """Wait for the stopped worker to exit (killed after ``timeout``)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def _unpickle_error(blob: bytes) -> BaseException | None:
    """The worker's exception, if it unpickles here (its traceback text is sent as well)."""
    try:
        exc = pickle.loads(blob)
    except Exception:  # noqa: BLE001  # any unpickling failure: the traceback text still names it
        return None
    return exc if isinstance(exc, BaseException) else None


# A worker costs ~0.3-1 s of imports on its start and competes with the caller for the
# cores: units whose projected remaining work is below this run in the caller instead.
SERIAL_BUDGET_S = 1.0
# Units that compute compete with the workers' imports for the same cores: a 1000-episode
# split of short episodes ran 2.6 s in the caller, 6.7 s on two workers.
SERIAL_BUDGET_CPU_S = 4.0
_SCHEDSTAT = "/proc/thread-self/schedstat"


def run_delay_s() -> float:
    """Seconds this thread has spent runnable but waiting for a core (Linux schedstat; 0 where
    the kernel does not say)."""
    try:
        with open(_SCHEDSTAT, "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def serial_budget_s(wall_s: float, cpu_s: float) -> float:
    """The serial budget for units that ran ``wall_s`` (their waits for a core left out) of
    which ``cpu_s`` on this thread's CPU."""
    return SERIAL_BUDGET_CPU_S if wall_s > 0 and cpu_s >= 0.5 * wall_s else SERIAL_BUDGET_S


def projected_rest_s(wall_s: float, waited_s: float, done: int, left: int) -> float:
    """The work left if each unit takes what the done ones took, less their wait for a core: on a
    machine whose cores are busy a unit's wall time is mostly that wait, which more processes do
    not shorten (they add their start-up to it); a unit waiting on I/O or sleeping is not
    waiting for a core, and runs faster in parallel."""
    return max(0.0, wall_s - waited_s) / max(1, done) * left


class SerialMeter:
    """Auto mode's measure of units run in the caller: after each, whether the rest, projected
    from the ones done, stays under the serial budget."""

    def __init__(self) -> None:
        self.done = 0
        self._mark()

    def _mark(self) -> None:
        self.t0, self.w0, self.c0 = time.perf_counter(), run_delay_s(), time.thread_time()

    def still_cheap(self, left: int) -> bool:
        """One more unit done, ``left`` to go: keep running them in the caller?"""
        self.done += 1
        wall, waited = time.perf_counter() - self.t0, run_delay_s() - self.w0
        rest = projected_rest_s(wall, waited, max(1, self.done - 1), left)
        budget = serial_budget_s(wall - waited, time.thread_time() - self.c0)  # a wait for a core is not I/O
        if self.done == 1:
            # The first unit pays the cold start (lazy imports, caches): it only decides when it
            # is clearly heavy; the units after it are the measure.
            self._mark()
            return rest <= 4 * budget
        return rest <= budget


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
        self._procs: list[_Worker] = []
        # PR_SET_PDEATHSIG follows the starting thread: workers start on this one, which lives with the pool
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="pool-spawner")
        self.serial_units = 0  # units the auto mode ran in the caller (tests, benchmarks)

    @property
    def serial_first(self) -> bool:
        """Auto mode with no worker started yet: units run in the caller while cheap."""
        return self.auto and not self._procs

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
            self._procs.append(self._spawner.submit(_Worker, env).result())

    def prestart(self, n: int | None = None) -> None:
        """Start ``n`` workers (default: all) now, before any unit asks for them."""
        self._start(self.workers if n is None else max(1, min(n, self.workers)))

    def run(self, units: Sequence[Unit], on_done: Done) -> None:
        # Units are taken by position as workers free up, never listed: a lazy sequence
        # (export/build.py) makes each one only when it is sent (memory flat).
        start = 0
        if self.auto and not self._procs:
            start = self._run_serial_while_cheap(units, on_done)
            if start >= len(units):
                return
        todo = Taker(units, start)
        self._start(min(self.workers, len(units) - start))
        idle = [w for w in self._procs]
        busy: dict[Connection, _Worker] = {}
        failure: tuple[Unit, BaseException | None, str] | None = None
        while busy or (todo and failure is None):
            while idle and todo and failure is None:
                w = idle.pop()
                u = todo.pop()
                w.unit = u
                try:
                    w.conn.send((u.fn, u.args))
                except OSError as exc:
                    failure = (u, None, f"worker process {w.proc.pid} is gone ({exc})")
                    self._procs.remove(w)
                    continue
                busy[w.conn] = w
            if not busy:
                break
            for ready in wait(list(busy)):
                w = busy.pop(w_conn := cast(Connection, ready))
                assert w.unit is not None
                u, w.unit = w.unit, None
                try:
                    msg = w_conn.recv()
                except (EOFError, OSError):
                    code = w.proc.wait()
                    self._procs.remove(w)
                    if failure is None:
                        failure = (u, None, f"the worker process {w.proc.pid} died while writing it "
                                            f"(exit code {code})")
                    continue
                idle.append(w)
                if msg[0] == "ok":
                    if failure is None:
                        on_done(u, msg[1])
                    else:  # committed anyway: report it, the rerun will reuse it
                        with contextlib.suppress(Exception):
                            on_done(u, msg[1])
                elif failure is None:
                    failure = (u, _unpickle_error(msg[1]), str(msg[2]))
        if failure is not None:
            raise_unit_failure(*failure)

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
