"""Both ends of an ``eva_export.pool`` worker: ``python -m eva_export.pool_worker FD PARENT_PID``.

The worker is a fresh interpreter that imports only the core library, asks the kernel to kill
it when the thread that started it ends (PR_SET_PDEATHSIG: the pool starts its workers from a
thread that lives as long as the pool), says READY, then runs units sent over its socket until
told to stop or the socket closes. ``WorkerProc`` is the pool's handle on one.

The messages: to the worker ``(fn, args)`` (a unit) or None (stop); from it READY once, then per
unit, in the order sent, ``("ok", result)`` or ``("err", pickled exception, its text)``. A
reader thread takes the units off the socket as they come: a pool that keeps two units in
flight never blocks on a socket the worker is not reading while it sends a result.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

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


READY = "ready"  # the worker's first message: its imports are done
# numpy and pyarrow, and what the split's units and the direct v3 feed's batches run
PRELOAD = ("eva_export.export.split", "eva_export.formats.lerobot_v21.subset", "eva_export.formats.common.images",
           "eva_export.export.v3_feed", "eva_export.formats.lerobot_v21.prove_ahead")


def worker_main(fd: int, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    conn = Connection(fd)
    import importlib

    for name in PRELOAD:  # while the parent validates the source, not when the first unit arrives
        importlib.import_module(name)
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(conn, inbox), name="unit-reader", daemon=True).start()
    conn.send(READY)
    while True:
        msg = inbox.get()
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


def _read(conn: Connection, inbox: queue.SimpleQueue[Any]) -> None:
    """Every message into ``inbox``, None last (stop, or the socket closed)."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = None
        inbox.put(msg)
        if msg is None:
            return


class WorkerProc:
    """The pool's handle on one worker process: its socket and the units it has in flight."""

    def __init__(self, env: dict[str, str]) -> None:
        parent, child = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eva_export.pool_worker", str(child.fileno()), str(os.getpid())],
                pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.units: deque[Any] = deque()  # the pool's units sent and not answered, in order
        self.ready = False  # its start-up (imports) done: it said READY

    def recv(self) -> Any:
        """The worker's next message; None when it was its READY alone (the unit's result is
        still to come). EOFError/OSError: it is gone."""
        if not self.ready:
            self._hello(self.conn.recv())
            if not self.conn.poll():
                return None
        return self.conn.recv()

    def poll_ready(self) -> bool:
        """Whether it has started (never waits)."""
        while not self.ready and self.conn.poll():
            self._hello(self.conn.recv())
        return self.ready

    def _hello(self, msg: object) -> None:
        if msg != READY:
            raise OSError(f"worker process {self.proc.pid} sent {msg!r} before starting")
        self.ready = True

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


def unpickle_error(blob: bytes) -> BaseException | None:
    """The worker's exception, if it unpickles here (its traceback text is sent as well)."""
    try:
        exc = pickle.loads(blob)
    except Exception:  # noqa: BLE001  # any unpickling failure: the traceback text still names it
        return None
    return exc if isinstance(exc, BaseException) else None




if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]))
    # Every unit closed its own files and sent its result: only stdio is left to flush. The
    # interpreter's teardown (pyarrow's and PyAV's, ~60 ms the pool waited for at the end of
    # every job) is skipped, as the CLI skips its own (cli.run).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
