"""Fault injection: the one seam through which tests break an export at a point it surely reaches.

Nothing is armed in production, and no production signature carries a hook. A test arms a
plan around building the service, which takes the plan armed then (its worker thread may run
the jobs later) and applies it to every job it runs::

    with faults.injected(FaultPlan(fail_at="verified")):
        service = ExportService(config)

* ``fail_at``: a named checkpoint raises ExportError there (``build.Faults``): ``validate``,
  ``unit:<source episode>``, ``split_units``, ``assemble_<subset>``, ``convert_<subset>``,
  ``verified``, ``check_staged``, ``backup_old``, ``move_new``, ``cleanup``;
* ``exporters``: format name -> exporter factory, used instead of the registry's (an exporter
  that fails, fills the disk or crashes a worker at a chosen episode).

A process a test starts (a node) takes its fault points from the environment instead, through
``eva_export/faults.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FaultPlan:
    fail_at: str | None = None
    exporters: Mapping[str, Callable[[], Any]] = field(default_factory=dict)


NONE = FaultPlan()
_lock = threading.Lock()
_armed: list[FaultPlan] = []


@contextmanager
def injected(plan: FaultPlan) -> Iterator[FaultPlan]:
    """Arm ``plan`` for services built inside the block."""
    with _lock:
        _armed.append(plan)
    try:
        yield plan
    finally:
        with _lock:
            _armed.remove(plan)


def armed() -> FaultPlan:
    """The plan armed now (the innermost), else the plan that injects nothing."""
    with _lock:
        return _armed[-1] if _armed else NONE

