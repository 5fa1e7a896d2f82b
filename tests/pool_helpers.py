"""Exporters that fail inside a worker process (imported by the workers: keep it importable)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from eva_export.formats.hdf5.exporter import Hdf5Exporter


class CrashingHdf5(Hdf5Exporter):
    """The real HDF5 exporter, except that the worker process writing episode ``crash_at`` of a
    subset dies by SIGKILL (as an out-of-memory kill or a segfault would end it)."""

    crash_at = 3

    def __init__(self) -> None:
        super().__init__()
        self.parent_pid = os.getpid()

    def _write_unit(self, tmp: Path, meta: Any, ep: Any, table: Any) -> None:
        if ep.episode_index == self.crash_at and os.getpid() != self.parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        super()._write_unit(tmp, meta, ep, table)


def sleep_then_pid(seconds: float) -> int:
    """A unit of known cost (the auto pool's test): returns the pid that ran it."""
    import time

    time.sleep(seconds)
    return os.getpid()
