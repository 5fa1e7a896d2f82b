"""Shared pieces of the eva_export nodes: the process main() runner and a status timer.

The runner gives every node the same life cycle: ``rclpy.init``, spin a
``MultiThreadedExecutor`` until SIGINT (or an external shutdown), then tear down cleanly and
return exit code 0. Services run in a ``ReentrantCallbackGroup`` so a slow call never blocks
the status timer or another service.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.timer import Timer


#: Default period of the ``~/status`` topics, seconds (parameter ``status_period``).
DEFAULT_STATUS_PERIOD = 1.0
#: History depth of the ``~/status`` publishers.
STATUS_QOS_DEPTH = 10


def declare_common_parameters(node: Node) -> tuple[str, float]:
    """Declare the parameters every eva node has; return (config_file, status_period).

    ``config_file`` is the path of the YAML configuration (empty = built-in defaults);
    ``status_period`` is the period of the ``~/status`` topic in seconds.
    """
    config_file = str(node.declare_parameter("config_file", "").value or "")
    period = float(node.declare_parameter("status_period", DEFAULT_STATUS_PERIOD).value)
    if period <= 0.0:
        node.get_logger().warning(
            f"status_period {period} is not positive; using {DEFAULT_STATUS_PERIOD}"
        )
        period = DEFAULT_STATUS_PERIOD
    return config_file, period


def service_group() -> ReentrantCallbackGroup:
    """Callback group for services: reentrant, so calls can run in parallel."""
    return ReentrantCallbackGroup()


def create_status_timer(
    node: Node,
    publisher: Publisher,
    build: Callable[[], Any],
    period: float,
) -> Timer:
    """Publish ``build()`` on ``publisher`` every ``period`` seconds and once right away.

    The timer has its own mutually exclusive group: status messages never overlap, and a
    busy service does not delay them. An exception in ``build`` is logged, not raised, so
    one bad status does not kill the node.
    """

    def _tick() -> None:
        try:
            msg = build()
        except Exception as exc:  # noqa: BLE001 - keep the node alive, report it
            node.get_logger().error(f"building the status message failed: {exc!r}")
            return
        publisher.publish(msg)

    timer = node.create_timer(period, _tick, callback_group=MutuallyExclusiveCallbackGroup())
    return timer


def run_node(
    factory: Callable[[], Node],
    args: Sequence[str] | None = None,
    num_threads: int | None = None,
    executor_factory: Callable[[], Executor] | None = None,
) -> int:
    """Create the node with ``factory`` and spin it until shutdown. Returns the exit code.

    SIGINT (Ctrl-C, ``ros2 launch`` stopping, the test harness) and an external shutdown of
    the context both end in a clean teardown and exit code 0. Any other exception
    propagates after teardown.
    """
    rclpy.init(args=list(args) if args is not None else sys.argv)
    node: Node | None = None
    executor = executor_factory() if executor_factory else MultiThreadedExecutor(num_threads=num_threads)
    try:
        node = factory()
        executor.add_node(node)
        node.get_logger().info("ready")
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        executor.shutdown(timeout_sec=2.0)
        if node is not None:
            close = getattr(node, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - still tear down ROS
                    node.get_logger().error(f"close() failed: {exc!r}")
            node.destroy_node()
        rclpy.try_shutdown()
    return 0

