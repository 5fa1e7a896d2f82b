"""The worker side of ``eva_export.pool``: ``python -m eva_export.pool_worker FD PARENT_PID``.

A fresh interpreter that imports only the core library, asks the kernel to kill it when the
thread that started it ends (PR_SET_PDEATHSIG: the pool starts its workers from a thread that
lives as long as the pool), then runs units sent over its socket until told to stop or the
socket closes.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this worker when its parent dies; exit if it already has."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: rely on EOF of the socket instead
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


PRELOAD = ("eva_export.export.split", "eva_export.formats.lerobot_v21.subset", "eva_export.formats.common.images")  # numpy, pyarrow, PyAV


def worker_main(fd: int, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    conn = Connection(fd)
    import importlib

    for name in PRELOAD:  # while the parent validates the source, not when the first unit arrives
        importlib.import_module(name)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which names the unit
            try:
                blob = pickle.dumps(exc)
            except Exception:  # noqa: BLE001 - an unpicklable exception travels as text only
                blob = pickle.dumps(None)
            conn.send(("err", blob, f"{type(exc).__name__}: {exc}"))
            log.debug("unit failed: %s", traceback.format_exc())
            continue
        conn.send(("ok", result))


if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]))
