"""Shared pieces of the eva_export nodes: the process main() runner, a status timer and the
base of the job nodes (export, upload).

The runner gives every node the same life cycle: ``rclpy.init``, spin a
``MultiThreadedExecutor`` until SIGINT (or an external shutdown), then tear down cleanly and
return exit code 0. Services run in a ``ReentrantCallbackGroup`` so a slow call never blocks
the status timer or another service.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import rclpy
# The generated interface package ships no type information (no py.typed): its types are Any.
from eva_export_interfaces.msg import Job as JobMsg  # type: ignore[import-untyped]
from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import GetJob  # type: ignore[import-untyped]
from rclpy.callback_groups import CallbackGroup, MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.context import Context
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.service import Service
from rclpy.timer import Timer

from eva_export import confine
from eva_export.config import Config, load_config
from eva_export.errors import EvaError
from eva_export.jobs import Job, ServiceStatus, state_text


#: A service's request and response, a published message (generated, untyped classes).
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Msg = TypeVar("Msg")

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


#: Longest ``message`` a service reply carries (a hostile request must not be echoed in full).
REPLY_MESSAGE_MAX = 400


def short_reason(text: str, limit: int = REPLY_MESSAGE_MAX) -> str:
    """A reply message cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guarded(node: Node, name: str, handler: Callable[[Req, Resp], Resp]) -> Callable[[Req, Resp], Resp]:
    """Wrap a service handler so that no exception ever leaves it.

    A service callback that raises takes the whole node down with it (rclpy re-raises in the
    executor), and anyone on the ROS graph can call our services. An ``EvaError`` becomes
    ``success=false`` with its message; anything else becomes ``success=false`` with a short
    reason, the traceback going to the node log only (it may hold paths and hosts).
    """

    def call(request: Req, response: Resp) -> Resp:
        try:
            out = handler(request, response)
            if hasattr(out, "message"):
                out.message = short_reason(str(out.message))
            return out
        except EvaError as exc:
            node.get_logger().warning(f"{name}: refused: {exc}")
            reason = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - the node must survive any request
            node.get_logger().error(f"{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            reason = f"refused: internal error ({type(exc).__name__}) handling the request; see the node log"
        if hasattr(response, "success"):
            response.success = False
        if hasattr(response, "message"):
            response.message = short_reason(reason)
        return response

    call.__name__ = getattr(handler, "__name__", name)
    return call


def create_guarded_service(node: Node, srv_type: type, name: str, handler: Callable[[Req, Resp], Resp],
                           group: CallbackGroup) -> Service[Req, Resp]:
    """``node.create_service`` with the handler wrapped by ``guarded``."""
    return node.create_service(srv_type, name, guarded(node, name, handler), callback_group=group)


def create_status_timer(
    node: Node,
    publisher: Publisher[Msg],
    build: Callable[[], Msg],
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


#: Longest wait at a SIGINT stop for rclpy's signal handler thread to shut the context down.
SIGNAL_SHUTDOWN_WAIT_S = 5.0


def await_signal_shutdown(context: Context | None = None, timeout: float = SIGNAL_SHUTDOWN_WAIT_S) -> bool:
    """Wait until ``context`` (default: rclpy's) is shut down, at most ``timeout`` seconds.

    rclpy (9.x) handles SIGINT in two places: its C handler calls Python's, so KeyboardInterrupt
    is raised in the main thread right away, and posts to a native thread that then triggers
    every executor's SIGINT guard condition and shuts every context down
    (``trigger_guard_conditions(); shutdown_contexts()``). Nothing orders the two: a main
    thread that destroys executors (their SIGINT guard conditions: ``unregister`` frees the
    list the native thread walks) and nodes before that thread has run races it, and a fault
    in it is a SIGSEGV in a thread without Python. Once the context is down the native thread
    has done both; every spin thread then leaves with ExternalShutdownException. Returns
    whether the context is down (False: no rclpy SIGINT handling, e.g. another handler)."""
    ctx = context if context is not None else rclpy.get_default_context()
    end = time.monotonic() + timeout
    while ctx.ok():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


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
    interrupted = False
    executor = executor_factory() if executor_factory else MultiThreadedExecutor(num_threads=num_threads)
    try:
        node = factory()
        executor.add_node(node)
        node.get_logger().info("ready")
        executor.spin()
    except KeyboardInterrupt:
        interrupted = True
    except ExternalShutdownException:
        pass
    finally:
        if interrupted:
            # SIGINT: Python raises KeyboardInterrupt here at once, while rclpy's own handler
            # thread (native) triggers the executors' SIGINT guard conditions and shuts the
            # contexts down only when it gets a core; tearing down under it crashed (exit -11)
            await_signal_shutdown(node.context if node is not None else None)
        # a node destroyed while its executor still runs a callback crashes rclpy: wait longer
        # than any service of ours takes, and leave the node to the exit if that is not enough
        stopped = executor.shutdown(timeout_sec=10.0)
        if node is not None:
            close = getattr(node, "close", None)
            if callable(close):
                try:
                    close()  # the node's own work (e.g. saving an episode) always finishes
                except Exception as exc:  # noqa: BLE001 - still tear down ROS
                    node.get_logger().error(f"close() failed: {exc!r}")
            if stopped:
                node.destroy_node()
            else:
                node.get_logger().warning("executor still running at shutdown; node left to the exit")
        rclpy.try_shutdown()
    return 0



_CASTS: dict[str, Callable[[Any], Any]] = {"string": str, "double": float, "float": float, "boolean": bool}


def job_to_msg(job: Job | None, kind: str) -> JobMsg:
    """The ``eva_export_interfaces/msg/Job`` of a core Job record, field by field (the names are
    the same); for None an empty message of ``kind`` (empty job_id)."""
    msg = JobMsg()
    msg.kind = str(kind)
    if job is None:
        return msg
    for name, idl in JobMsg.get_fields_and_field_types().items():
        value = getattr(job, name)
        setattr(msg, name, max(0, int(value)) if "int" in idl else _CASTS.get(idl, str)(value))
    return msg


class JobServiceNode(Node):
    """A node over a job service (eva_export.jobs.JobEngine): ``~/start`` (the subclass's
    request type), ``~/get_job`` GetJob and ``~/status`` JobQueueStatus, parameters
    ``config_file`` and ``status_period``.

    A subclass sets ``KIND`` and ``NO_JOB`` (how a reply names a missing job), builds its
    service in ``make_service(config)`` and answers ``~/start`` in ``on_start``; it may override
    ``job_msg`` (e.g. to redact errors) and ``find_job``.
    """

    KIND = ""
    NO_JOB = "job"

    def __init__(self, node_name: str, start_type: type) -> None:
        super().__init__(node_name)
        self.config_file, status_period = declare_common_parameters(self)
        self.make_service(load_config(self.config_file))
        group = service_group()
        create_guarded_service(self, start_type, "~/start", self.on_start, group)
        create_guarded_service(self, GetJob, "~/get_job", self._on_get_job, group)
        self.status_pub = self.create_publisher(JobQueueStatus, "~/status", STATUS_QOS_DEPTH)
        self.status_timer = create_status_timer(self, self.status_pub, self.build_status, status_period)
        self.get_logger().info(f"config_file={self.config_file!r}")

    # ---- what a subclass provides ----------------------------------------------------------
    def make_service(self, config: Config) -> None:
        raise NotImplementedError

    def on_start(self, request: Any, response: Any) -> Any:
        raise NotImplementedError

    def service_status(self) -> ServiceStatus:
        raise NotImplementedError

    def find_job(self, job_id: str) -> Job | None:
        """The job ``job_id`` names; an empty id: the latest."""
        raise NotImplementedError

    def job_msg(self, job: Job | None) -> JobMsg:
        return job_to_msg(job, self.KIND)

    # ---- shared ----------------------------------------------------------------------------
    def build_status(self) -> JobQueueStatus:
        status = self.service_status()
        msg = JobQueueStatus()
        msg.state = status.state
        msg.queued = status.queued
        msg.current = self.job_msg(status.current)
        return msg

    def _on_get_job(self, request: GetJob.Request, response: GetJob.Response) -> GetJob.Response:
        job = self.find_job(request.job_id)
        response.job = self.job_msg(job)
        if job is None:
            response.success = False
            # An invalid id (traversal, 256+ chars) is just not a job: no path is ever read for it.
            response.message = (f"no {self.NO_JOB} {confine.short_repr(request.job_id)}" if request.job_id
                                else f"no {self.NO_JOB} yet")
            return response
        response.success = True
        response.message = state_text(job)  # "stalled: ..." when its process stopped recording it
        return response
