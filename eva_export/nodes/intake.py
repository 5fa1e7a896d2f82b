"""The capture node's subscriptions, and its way out of a deaf restart.

Subscriptions live on a helper node spun by a SingleThreadedExecutor in its own thread:
rclpy's MultiThreadedExecutor (which runs the services and the status timer) delivered
messages in bursts here (gaps of 0.1 to 0.3 s at 100 Hz), which breaks grid alignment; a
dedicated single-threaded executor kept gaps at the publisher's own jitter.

The deaf restart: after a kill -9 the dead capture process's Fast DDS shared-memory port stays
open in the publishers, and a restarted participant gets the same participant id, hence the
same port name. Fast DDS usually replaces the zombie port, but now and then (about 1 restart
in 100 here) the publishers never reach the new participant: no message and no service
request arrives. The node then restarts itself (exec, same pid) holding ``n`` placeholder
participants first (``hold_participants``): they take the lowest free ids, the dead process's
among them, so the real participant gets an id, and a port, that no publisher holds. (A first
version kept the process and moved everything onto a second rclpy context; tearing down two
contexts' executors on SIGINT crashed rclpy now and then, exit -11.)
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import rclpy
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from eva_export import faults
from eva_export.capture.intake import StreamSpec
from eva_export.capture.recorder import Recorder
from eva_export.nodes import ros_convert

#: Subscription histories: a stall of the intake, or a publisher catching up after one (a busy
#: disk or CPU), must not overwrite messages that are only late. Both hold HISTORY_S of their
#: stream: 200 vector messages (100 Hz), cameras ``HISTORY_S * fps`` frames (60 at 30 fps, about
#: 55 MB at 640x480 rgb8 while such a backlog lasts). Ten frames (a third of a second) lost
#: frames of a take on a machine busy writing to disk.
HISTORY_S = 2.0
VECTOR_QOS_DEPTH = 200
#: Restarts on a further participant id before the node gives up and only warns.
MAX_RESTARTS = 3
#: How many placeholder participants this incarnation holds (set by the node's own restart).
HOLD_ENV = "EVA_CAPTURE_HOLD_PARTICIPANTS"
DEAF_SUFFIX = "/__deaf"


def camera_depth(fps: float) -> int:
    """Frames a camera subscription (or a camera publisher) keeps: HISTORY_S of them."""
    return max(10, math.ceil(HISTORY_S * fps))


class Intake:
    """The subscriptions of one recorder on their own node, executor and thread."""

    def __init__(self, parent: Node, rec: Recorder, reliable: bool, *, deaf: bool = False) -> None:
        self.parent, self.rec = parent, rec
        reliability = ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT
        self.node = rclpy.create_node(f"{parent.get_name()}_intake", namespace=parent.get_namespace(),
                                      context=parent.context, use_global_arguments=False,
                                      start_parameter_services=False)
        for i, spec in enumerate(rec.streams):
            msg_cls, convert = ros_convert.intake_converter(spec)
            depth = camera_depth(rec.col.fps) if spec.is_camera else VECTOR_QOS_DEPTH
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=reliability)
            topic = spec.topic + DEAF_SUFFIX if deaf else spec.topic
            self.node.create_subscription(msg_cls, topic, self._callback(i, convert), qos)
        # wakes the spin thread at close: in every wait set (a node's own guard condition), unlike
        # the executor's guard, which Executor.shutdown destroys at once (a thread that had not
        # put it in its wait set yet then waits until a message comes)
        self._wake = self.node.create_guard_condition(lambda: None)
        self._left_spin = threading.Event()  # set by the spin thread itself, last thing
        self.executor = SingleThreadedExecutor(context=parent.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, name="capture-intake", daemon=True)
        self.thread.start()

    def deaf_streams(self) -> list[tuple[StreamSpec, int]]:
        """Streams that received nothing while a publisher of their topic is on the graph."""
        received = self.rec.status().streams
        out = []
        for spec, st in zip(self.rec.streams, received, strict=True):
            if st.received == 0 and (n := self.node.count_publishers(spec.topic)) > 0:
                out.append((spec, n))
        return out

    def close(self) -> None:
        """Stop the intake executor; destroy its node only once the spin thread has provably left
        ``spin()`` (its own event) and ended. Destroying a node its executor still waits on
        crashes rclpy (exit -11 under load); the process is ending, so such a node is left to
        the exit."""
        self.executor.shutdown(timeout_sec=10.0)
        try:
            self._wake.trigger()
        except Exception:  # noqa: BLE001 - already destroyed with a shut-down context
            pass
        left = self._left_spin.wait(10.0)
        self.thread.join(2.0 if left else 0.0)
        alive = self.thread.is_alive()
        if not left or alive:
            self.parent.get_logger().warning(
                f"intake executor still running at shutdown (left spin: {left}, thread alive: {alive}); "
                "node left to the exit")
            return
        self.node.destroy_node()

    def _spin(self) -> None:
        try:
            self._spin_executor()
        finally:
            self._left_spin.set()

    def _spin_executor(self) -> None:
        try:
            self.executor.spin()
        except (ExternalShutdownException, KeyboardInterrupt):
            pass
        except Exception as exc:  # noqa: BLE001 - shutting down while spinning
            if self.parent.context.ok():
                self.parent.get_logger().error(f"intake executor stopped: {exc!r}")

    def _callback(self, i: int, convert: Callable[[Any], Any]) -> Callable[[Any], None]:
        perf, mono = time.perf_counter, time.monotonic
        rec = self.rec

        def on_message(msg: Any) -> None:
            t = perf()
            recv = mono()
            stamp, payload = convert(msg)
            rec.offer(i, recv, stamp, payload)
            rec.note_latency(i, perf() - t)

        return on_message


def held_count() -> int:
    """Placeholder participants this incarnation holds (0: a first start)."""
    try:
        return max(0, min(int(os.environ.get(HOLD_ENV, "0")), MAX_RESTARTS))
    except ValueError:
        return 0


def hold_participants(n: int) -> list[tuple[Context, Node]]:
    """``n`` participants with one empty node each (rmw_fastrtps makes a context's participant
    with its first node), created before the real one so they take the lowest free ids."""
    held = []
    for k in range(n):
        ctx = Context()
        rclpy.init(args=[], context=ctx, signal_handler_options=SignalHandlerOptions.NO)
        held.append((ctx, rclpy.create_node(f"eva_capture_placeholder_{os.getpid()}_{k}", context=ctx,
                                            use_global_arguments=False, start_parameter_services=False,
                                            enable_rosout=False)))
    return held


def release(held: list[tuple[Context, Node]]) -> None:
    for ctx, node in held:
        node.destroy_node()
        ctx.try_shutdown()


def restart_with(n: int) -> None:
    """Replace this process (same pid, same arguments) by one that holds ``n`` placeholders."""
    env = {**os.environ, HOLD_ENV: str(n)}
    os.execve(sys.executable, [sys.executable, "-m", "eva_export.nodes.capture_node", *sys.argv[1:]], env)


def deaf_hook() -> bool:
    """The ``deaf_intake`` fault point (``eva_export/faults.py``): a first start (no placeholders)
    subscribes to ``<topic>/__deaf`` and serves its services under such names."""
    return faults.from_env("deaf_intake") == "1" and held_count() == 0


def describe(deaf: Sequence[tuple[StreamSpec, int]]) -> str:
    return ", ".join(f"{spec.name} ({spec.topic}, {n} publishers)" for spec, n in deaf)
