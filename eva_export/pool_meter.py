"""Auto mode's measure (eva_export.pool): whether the units left are cheap enough to run in
the caller, projected from the ones it ran, rather than paying worker processes' start-up."""

from __future__ import annotations

import time

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
