"""eva_console: the review console, a local web page over the other nodes' services.

The node serves ``eva_export.console.server`` (no ROS in there) and answers its questions only
through the other nodes' services and topics, so no rule is copied here:
``<capture>/list_episodes`` and ``<capture>/review`` (the single writer of verdicts),
``<export>/start``, ``<export>/get_job``, ``<upload>/start``, ``<upload>/get_job`` and the three
``~/status`` topics. Dataset files (MP4, Parquet, meta) are only read, for display.

Parameters: ``config_file`` (its ``console:`` section: enabled, bind, port; off by default),
``capture_node``, ``export_node``, ``upload_node`` (names of the nodes to talk to, relative to
this node's namespace). The URL is logged as ``console at http://...``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol

from eva_export_interfaces.msg import CaptureStatus, JobQueueStatus  # type: ignore[import-untyped]  # no py.typed
from eva_export_interfaces.srv import GetJob, ListEpisodes, ReviewEpisode, StartExport, StartUpload  # type: ignore[import-untyped]  # no py.typed
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from eva_export.config import load_config
from eva_export.errors import ConfigError
from eva_export.nodes.common import STATUS_QOS_DEPTH, declare_common_parameters, run_node

NODE_NAME = "eva_console"
CALL_TIMEOUT = 20.0
WAIT_SERVICE = 2.0
PEER_WAIT = 60.0


def msg_to_dict(msg: _Fields) -> dict[str, object]:
    """A flat ROS message as a JSON-able dict (lists of strings kept as lists)."""
    out: dict[str, object] = {}
    for name in msg.get_fields_and_field_types():
        v = getattr(msg, name)
        out[name] = list(v) if isinstance(v, (list, tuple)) or hasattr(v, "tolist") else v
    return out


class _Fields(Protocol):
    """A generated message class's field list (the classes are untyped)."""

    def get_fields_and_field_types(self) -> dict[str, str]: ...


class RosBackend:
    """The console's ``Backend``: each method is one service call with a timeout."""

    def __init__(self, node: Node, capture: str, export: str, upload: str) -> None:
        self.node = node
        group = ReentrantCallbackGroup()
        c = node.create_client
        self.list_cli: Any = c(ListEpisodes, f"{capture}/list_episodes", callback_group=group)
        self.review_cli: Any = c(ReviewEpisode, f"{capture}/review", callback_group=group)
        self.start_cli: dict[str, object] = {"export": c(StartExport, f"{export}/start", callback_group=group),
                          "upload": c(StartUpload, f"{upload}/start", callback_group=group)}
        self.job_cli: dict[str, object] = {"export": c(GetJob, f"{export}/get_job", callback_group=group),
                        "upload": c(GetJob, f"{upload}/get_job", callback_group=group)}
        self._status: dict[str, object] = {}
        self._lock = threading.Lock()
        node.create_subscription(CaptureStatus, f"{capture}/status", self._on_capture, STATUS_QOS_DEPTH,
                                 callback_group=group)
        for kind, name in (("export", export), ("upload", upload)):
            node.create_subscription(JobQueueStatus, f"{name}/status",
                                     lambda m, k=kind: self._on_queue(k, m), STATUS_QOS_DEPTH,
                                     callback_group=group)

    # ---- topics -------------------------------------------------------------------------------
    def _on_capture(self, m: CaptureStatus) -> None:
        text = m.state + (f" {m.dataset_name} ({m.frames} frames)" if m.state == "RECORDING" else "")
        with self._lock:
            self._status["capture"] = text

    def _on_queue(self, kind: str, m: JobQueueStatus) -> None:
        # the job is kept whole: the console shows it only on the pages of its own dataset
        entry = {"queue": f"{m.state}, {m.queued} queued",
                 "job": msg_to_dict(m.current) if m.current.job_id else {}}
        with self._lock:
            self._status[kind] = entry

    def status(self) -> dict[str, object]:
        with self._lock:
            st = dict(self._status)
        return {"capture": st.get("capture", "no status yet"),
                **{k: st.get(k, {"queue": "no status yet", "job": {}}) for k in ("export", "upload")}}

    def clients(self) -> list[Any]:
        return [self.list_cli, self.review_cli, *self.start_cli.values(), *self.job_cli.values()]

    def wait_for_peers(self, timeout: float) -> list[str]:
        """Wait until this node's own clients see their services; the names still missing."""
        end = time.monotonic() + timeout
        missing = self.clients()
        while missing and time.monotonic() < end:
            missing = [c for c in missing if not c.wait_for_service(timeout_sec=0.5)]
        return [c.srv_name for c in missing]

    # ---- services -----------------------------------------------------------------------------
    def _call(self, client: Any, request: Any) -> tuple[Any, str]:
        if not client.wait_for_service(timeout_sec=WAIT_SERVICE):
            return None, f"service {client.srv_name} is not available (is the node running?)"
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(CALL_TIMEOUT):
            client.remove_pending_request(future)
            return None, f"no reply from {client.srv_name} within {CALL_TIMEOUT:.0f} s"
        exc = future.exception()
        if exc is not None:
            return None, f"{client.srv_name} failed: {exc!r}"
        return future.result(), ""

    def list_episodes(self, dataset: str) -> tuple[bool, str, list[dict[str, object]]]:
        reply, err = self._call(self.list_cli, ListEpisodes.Request(dataset_name=dataset))
        if reply is None:
            return False, err, []
        return reply.success, reply.message, [msg_to_dict(e) for e in reply.episodes]

    def review(self, dataset: str, episode: int, verdict: str, note: str,
               set_note: bool, take_id: str = "") -> tuple[bool, str, dict[str, object]]:
        req = ReviewEpisode.Request(dataset_name=dataset, episode_index=episode, verdict=verdict,
                                    note=note, set_note=set_note, take_id=take_id)
        reply, err = self._call(self.review_cli, req)
        if reply is None:
            return False, err, {}
        return reply.success, reply.message, msg_to_dict(reply.episode)

    def start_job(self, kind: str, source_dir: str, fmt: str,
                  accepted_dir: str) -> tuple[bool, str, dict[str, object]]:
        if kind == "export":
            req: Any = StartExport.Request(source_dir=source_dir, format=fmt)
        else:
            req = StartUpload.Request(source_dir=source_dir, format=fmt, accepted_dir=accepted_dir)
        reply, err = self._call(self.start_cli[kind], req)
        if reply is None:
            return False, err, {}
        return reply.success, reply.message, {"job_id": reply.job_id}

    def get_job(self, kind: str, job_id: str) -> tuple[bool, str, dict[str, object]]:
        reply, err = self._call(self.job_cli[kind], GetJob.Request(job_id=job_id))
        if reply is None:
            return False, err, {}
        return reply.success, reply.message, msg_to_dict(reply.job)


class ConsoleNode(Node):
    """Thin: reads the config, makes the backend, runs the HTTP server in its own threads."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config_file, _period = declare_common_parameters(self)
        names = {k: str(self.declare_parameter(f"{k}_node", d).value)
                 for k, d in (("capture", "eva_capture"), ("export", "eva_export"), ("upload", "eva_upload"))}
        self.get_logger().info(f"config_file={self.config_file!r}")
        config = load_config(self.config_file)
        self.server = None
        if not config.console.enabled:
            self.get_logger().info("console disabled (console.enabled: false in the config); idle")
            return
        from eva_export.console.server import ConsoleServer

        backend = RosBackend(self, names["capture"], names["export"], names["upload"])
        cc = config.console
        try:
            self.server = ConsoleServer(cc.bind, cc.port, config.collection.log_dir, backend,
                                        upload_configured=bool(config.collection.storage))
        except OSError as exc:
            raise ConfigError(f"console cannot listen on {cc.bind}:{cc.port}: {exc.strerror or exc}; "
                              "change console.port or console.bind") from exc
        if cc.bind not in ("127.0.0.1", "::1", "localhost"):
            self.get_logger().warning(f"console listens on {cc.bind}, not loopback (as configured)")
        self.server.start()
        self.get_logger().info(f"console at {self.server.url} (log_dir {config.collection.log_dir})")
        # Discovery takes seconds on a busy machine: tell when this node's own clients see the
        # peers, so a launcher prints the URL when the first page load can list episodes.
        threading.Thread(target=self._announce_peers, args=(backend,), daemon=True).start()

    def _announce_peers(self, backend: RosBackend) -> None:
        missing = backend.wait_for_peers(PEER_WAIT)
        if missing:
            self.get_logger().warning(f"console peers not found within {PEER_WAIT:.0f} s: {', '.join(missing)}")
        else:
            self.get_logger().info("console peers ready")

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def main(args: list[str] | None = None) -> int:
    """Console script ``console_node``."""
    return run_node(ConsoleNode, args)


if __name__ == "__main__":
    sys.exit(main())
