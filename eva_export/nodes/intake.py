"""The capture node's subscriptions, and their recovery from a deaf restart.

Subscriptions live on a helper node spun by a SingleThreadedExecutor in its own thread:
rclpy's MultiThreadedExecutor (which runs the services and the status timer) delivered
messages in bursts here (gaps of 0.1 to 0.3 s at 100 Hz), which breaks grid alignment; a
dedicated single-threaded executor kept gaps at the publisher's own jitter.

Why generations: after a kill -9 the dead capture process's Fast DDS shared-memory port stays
open in the publishers, and a restarted participant gets the same participant id, hence the
same port name. Fast DDS usually replaces the zombie port (3 to 11 s measured), but now and
then (about 1 restart in 100 here) the publishers never reconnect and the node stays deaf on
every stream. A *new* participant created while the first one still holds its id gets the
next free id, a port name no publisher holds, and is reached like a first start. So a deaf
start-up is healed by a new generation: a fresh rclpy context (one participant) with the same
subscriptions. Earlier generations stay alive (they hold their ids) but a stream's messages
are taken from one generation only: the newest that has delivered on it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import rclpy
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from eva_export.capture.intake import StreamSpec
from eva_export.capture.recorder import Recorder
from eva_export.nodes import ros_convert

#: Subscription histories: a starved intake must not overwrite messages that are only late
#: (2 s of a 100 Hz vector stream; 10 camera frames, about 9 MB at 640x480 rgb8).
CAMERA_QOS_DEPTH = 10
VECTOR_QOS_DEPTH = 200
#: New participants tried after a deaf start before the node gives up and only warns.
MAX_GENERATIONS = 4
#: Test hook: generation 0 subscribes to ``<topic>/__deaf`` (and the node serves its services
#: under such names) and so hears nothing while the publishers are on the graph, the one
#: state a deaf restart produces.
DEAF_HOOK_ENV = "EVA_TEST_DEAF_INTAKE"
DEAF_SUFFIX = "/__deaf"


@dataclass
class Generation:
    """One participant's subscriptions: its context (own_context: made for it), node, executor."""

    index: int
    context: Context
    own_context: bool
    node: Node
    executor: SingleThreadedExecutor
    thread: threading.Thread


class Intake:
    """Every generation of subscriptions for one recorder; ``heal`` adds one."""

    def __init__(self, parent: Node, rec: Recorder, reliable: bool) -> None:
        self.parent, self.rec = parent, rec
        self.reliability = ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT
        self.generations: list[Generation] = []
        #: per stream, the generation whose messages are taken (the newest that delivered)
        self.active = [0] * len(rec.streams)
        self._add(parent.context, own=False)

    @property
    def node(self) -> Node:
        return self.generations[-1].node

    def deaf_streams(self) -> list[tuple[StreamSpec, int]]:
        """Streams that received nothing while a publisher of their topic is on the graph."""
        received = self.rec.status().streams
        out = []
        for spec, st in zip(self.rec.streams, received, strict=True):
            if st.received == 0 and (n := self.node.count_publishers(spec.topic)) > 0:
                out.append((spec, n))
        return out

    def heal(self) -> Context | None:
        """Start one more generation on a new participant (its context; None once
        MAX_GENERATIONS exist)."""
        if len(self.generations) >= MAX_GENERATIONS:
            return None
        ctx = Context()
        rclpy.init(args=[], context=ctx)
        self._add(ctx, own=True)
        return ctx

    def close(self) -> None:
        for g in reversed(self.generations):
            g.executor.shutdown(timeout_sec=2.0)
            g.thread.join(2.0)
            g.node.destroy_node()
            if g.own_context:
                g.context.try_shutdown()
        self.generations.clear()

    def _add(self, ctx: Context, *, own: bool) -> None:
        gen = len(self.generations)
        name = f"{self.parent.get_name()}_intake" + (f"_{gen}" if gen else "")
        node = rclpy.create_node(name, namespace=self.parent.get_namespace(), context=ctx,
                                 use_global_arguments=False, start_parameter_services=False)
        deaf = gen == 0 and deaf_hook()
        for i, spec in enumerate(self.rec.streams):
            msg_cls, convert = ros_convert.intake_converter(spec)
            depth = CAMERA_QOS_DEPTH if spec.is_camera else VECTOR_QOS_DEPTH
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=self.reliability)
            topic = spec.topic + DEAF_SUFFIX if deaf else spec.topic
            node.create_subscription(msg_cls, topic, self._callback(gen, i, convert), qos)
        executor = SingleThreadedExecutor(context=ctx)
        executor.add_node(node)
        thread = threading.Thread(target=self._spin, args=(executor, ctx), name=f"capture-intake-{gen}",
                                  daemon=True)
        self.generations.append(Generation(gen, ctx, own, node, executor, thread))
        thread.start()

    def _spin(self, executor: SingleThreadedExecutor, ctx: Context) -> None:
        try:
            executor.spin()
        except (ExternalShutdownException, KeyboardInterrupt):
            pass
        except Exception as exc:  # noqa: BLE001 - shutting down while spinning
            if ctx.ok():
                self.parent.get_logger().error(f"intake executor stopped: {exc!r}")

    def _callback(self, gen: int, i: int, convert: Callable[[Any], Any]) -> Callable[[Any], None]:
        perf, mono = time.perf_counter, time.monotonic
        rec, active = self.rec, self.active

        def on_message(msg: Any) -> None:
            if gen < active[i]:
                return  # a newer generation delivers this stream
            active[i] = gen
            t = perf()
            recv = mono()
            stamp, payload = convert(msg)
            rec.offer(i, recv, stamp, payload)
            rec.note_latency(i, perf() - t)

        return on_message


def deaf_hook() -> bool:
    return os.environ.get(DEAF_HOOK_ENV) == "1"


def describe(deaf: Sequence[tuple[StreamSpec, int]]) -> str:
    return ", ".join(f"{spec.name} ({spec.topic}, {n} publishers)" for spec, n in deaf)
