"""Test harness for eva_export nodes: real node processes, talked to over loopback DDS.

Typical use in a test (fixtures from conftest.py)::

    def test_x(node_factory, ros_client, config_file):
        cap = node_factory("capture_node", params={"config_file": str(config_file)})
        ros_client.wait_for_services([cap.service("start")], procs=[cap])
        reply = ros_client.call(StartCapture, cap.service("start"), StartCapture.Request())
        status = ros_client.wait_for_message(CaptureStatus, cap.topic("status"))
        assert cap.stop() == 0

``configure_ros_env`` must run before any rclpy process starts (conftest.py does it at import).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Console script -> module of every node executable (see setup.py entry_points).
NODE_MODULES = {
    "capture_node": "eva_export.nodes.capture_node",
    "export_node": "eva_export.nodes.export_node",
    "upload_node": "eva_export.nodes.upload_node",
    "teleop_sim": "eva_export.nodes.teleop_sim",
    "console_node": "eva_export.nodes.console_node",
}
#: Default node names of the executables.
NODE_NAMES = {
    "capture_node": "eva_capture",
    "export_node": "eva_export",
    "upload_node": "eva_upload",
    "teleop_sim": "teleop_sim",
    "console_node": "eva_console",
}

DEFAULT_STOP_TIMEOUT = 10.0
DEFAULT_SERVICE_TIMEOUT = 30.0


# --- environment ------------------------------------------------------------------------------
def configure_ros_env(environ: os._Environ[str] | dict[str, str] = os.environ, keep_user_domain: bool = False) -> int:
    """Keep DDS on loopback and pick this run's ROS_DOMAIN_ID; return the domain id.

    The domain id is ``EVA_TEST_DOMAIN_ID`` when set, else derived from the pid (1..101), so
    parallel test runs on one machine do not see each other. With ``keep_user_domain`` (the
    demo and the console, which a user runs beside their own tools) a ROS_DOMAIN_ID the user set
    is kept. Must run before rclpy starts.
    """
    environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    environ["RMW_IMPLEMENTATION"] = "rmw_fastrtps_cpp"
    environ.pop("ROS_LOCALHOST_ONLY", None)  # ignored by kilted; avoid the deprecation warning
    override = environ.get("EVA_TEST_DOMAIN_ID", "").strip()
    if not override and keep_user_domain and environ.get("ROS_DOMAIN_ID", "").strip() not in ("", "0"):
        override = environ["ROS_DOMAIN_ID"].strip()
    domain = int(override) if override else 1 + os.getpid() % 101
    if not 1 <= domain <= 232:
        raise ValueError(f"EVA_TEST_DOMAIN_ID must be 1..232, got {domain}")
    environ["ROS_DOMAIN_ID"] = str(domain)
    environ["PYTHONUNBUFFERED"] = "1"
    # a local Ray instance (tests/test_batch.py, bench) listens on 127.0.0.1 only, not on the LAN
    environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return domain


def check_ros_env() -> None:
    """Refuse to start a ROS process without the loopback settings."""
    if os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "LOCALHOST":
        raise RuntimeError("ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST must be set (conftest.py)")
    if os.environ.get("ROS_DOMAIN_ID", "0") in ("", "0"):
        raise RuntimeError("a non-default ROS_DOMAIN_ID must be set (conftest.py)")


# --- process registry ---------------------------------------------------------------------------
_LIVE: set[NodeProcess] = set()
_LIVE_LOCK = threading.Lock()
_NS_COUNTER = itertools.count(1)


def unique_namespace(prefix: str = "t") -> str:
    """A namespace no other node of this run uses, e.g. ``/t3_1234``."""
    return f"/{prefix}{next(_NS_COUNTER)}_{os.getpid()}"


def stop_all(timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
    """Stop every process the harness started and that is still registered."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        proc.stop(timeout=timeout)


atexit.register(stop_all, 3.0)


def executable_command(executable: str, prefer_script: bool = False) -> list[str]:
    """Command line for a node executable.

    By default ``python -m <module>`` (same interpreter as the tests). With ``prefer_script``
    the installed console script is used (``<prefix>/lib/eva_export/<exe>`` as ``ros2 run``
    would, else ``<prefix>/bin/<exe>``), which also checks the entry point is installed.
    """
    if prefer_script or executable not in NODE_MODULES:
        for cand in (
            Path(sys.prefix) / "lib" / "eva_export" / executable,
            Path(sys.prefix) / "bin" / executable,
        ):
            if cand.is_file() and os.access(cand, os.X_OK):
                return [str(cand)]
        found = shutil.which(executable)
        if found:
            return [found]
        if executable not in NODE_MODULES:
            raise FileNotFoundError(f"no installed executable {executable!r}")
    return [sys.executable, "-m", NODE_MODULES[executable]]


def _param_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # keep strings strings, even "1" or "true" (YAML parsing of -p values)
        return "'" + value.replace("'", "''") + "'" if value else "''"
    return str(value)


class NodeProcess:
    """One node executable run as a subprocess in its own process group.

    ``stop()`` sends SIGINT, then SIGKILL to the whole group after ``timeout``. Every started
    process is registered and stopped by the fixture finalizer or at interpreter exit.
    """

    def __init__(
        self,
        executable: str,
        log_dir: Path,
        *,
        name: str | None = None,
        namespace: str | None = None,
        params: Mapping[str, Any] | None = None,
        remaps: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        prefer_script: bool = False,
        command: Sequence[str] | None = None,
    ) -> None:
        self.executable = executable
        self.name = name or NODE_NAMES.get(executable, executable)
        self.namespace = "/" + (namespace or "").strip("/") if namespace else ""
        self.params = dict(params or {})
        self.remaps = dict(remaps or {})
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.prefer_script = prefer_script
        self._command = list(command) if command is not None else None
        tag = (self.namespace.strip("/").replace("/", "_") + "_" if self.namespace else "")
        self.log_path = Path(log_dir) / f"{tag}{self.name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    # names
    @property
    def fqn(self) -> str:
        """Fully qualified node name, e.g. ``/t1_99/eva_capture``."""
        return f"{self.namespace}/{self.name}"

    def service(self, private_name: str) -> str:
        """Absolute name of the node's private service ``~/private_name``."""
        return f"{self.fqn}/{private_name.lstrip('~/')}"

    topic = service

    # life cycle
    def command(self) -> list[str]:
        if self._command is not None:
            return list(self._command)
        cmd = executable_command(self.executable, self.prefer_script)
        ros_args = ["-r", f"__node:={self.name}"]
        if self.namespace:
            ros_args += ["-r", f"__ns:={self.namespace}"]
        for src, dst in self.remaps.items():
            ros_args += ["-r", f"{src}:={dst}"]
        for key, value in self.params.items():
            ros_args += ["-p", f"{key}:={_param_value(value)}"]
        return cmd + ["--ros-args", *ros_args, *self.extra_args]

    def start(self) -> NodeProcess:
        check_ros_env()
        if self.popen is not None:
            raise RuntimeError(f"{self.fqn} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # A crashing node (SIGSEGV, SIGABRT) then prints every thread's Python stack into its log,
        # which the asserting test shows.
        env.setdefault("PYTHONFAULTHANDLER", "1")
        env.update(self.env)
        cmd = self.command()
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def _signal_group(self, sig: int) -> None:
        assert self.popen is not None
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        """SIGINT, wait ``timeout``, then SIGKILL the group. Returns the exit code.

        An exit code of -9 (SIGKILL) means the node did not stop cleanly on SIGINT.
        """
        if self.popen is None:
            return None
        try:
            if self.popen.poll() is None:
                self._signal_group(signal.SIGINT)
                try:
                    self.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.popen.wait(timeout=10)
            # leftovers of the group (children of the node), whatever the node did
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.returncode = self.popen.returncode
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
        return self.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> NodeProcess:
        return self.start() if self.popen is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exit={self.popen and self.popen.returncode}"
        return f"NodeProcess({self.executable!r}, {self.fqn!r}, {state})"


def describe_dead(procs: Iterable[NodeProcess]) -> str:
    out = []
    for p in procs:
        if p.popen is not None and not p.alive():
            out.append(f"{p!r} exited early; log {p.log_path}:\n{p.log_tail()}")
    return "\n".join(out)


# --- in-test rclpy client -----------------------------------------------------------------------
class RosClient:
    """An rclpy node in the test process, spun only while a helper waits (no threads)."""

    def __init__(self, name: str = "eva_test_client") -> None:
        import rclpy

        check_ros_env()
        self._rclpy = rclpy
        self.node = rclpy.create_node(f"{name}_{os.getpid()}_{next(_NS_COUNTER)}")
        self._clients: dict[tuple[Any, str], Any] = {}

    def close(self) -> None:
        for client in self._clients.values():
            self.node.destroy_client(client)
        self._clients.clear()
        self.node.destroy_node()

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._rclpy.spin_once(self.node, timeout_sec=min(0.05, max(0.0, end - time.monotonic())))

    def service_names(self) -> set[str]:
        return {name for name, _types in self.node.get_service_names_and_types()}

    def wait_for_services(
        self,
        names: Iterable[str],
        timeout: float = DEFAULT_SERVICE_TIMEOUT,
        procs: Iterable[NodeProcess] = (),
    ) -> float:
        """Wait until every service name is in the graph; return the seconds it took.

        Fails early (with the log tail) when one of ``procs`` exits meanwhile.
        """
        wanted = set(names)
        procs = list(procs)
        start = time.monotonic()
        while True:
            missing = wanted - self.service_names()
            if not missing:
                return time.monotonic() - start
            dead = describe_dead(procs)
            if dead:
                raise AssertionError(f"node died while waiting for {sorted(missing)}:\n{dead}")
            if time.monotonic() - start > timeout:
                logs = "\n".join(f"--- {p.log_path}:\n{p.log_tail()}" for p in procs)
                raise TimeoutError(
                    f"services not available after {timeout:.0f} s: {sorted(missing)}\n{logs}"
                )
            self.spin_for(0.1)

    def service_endpoints(self, name: str) -> tuple[set[bytes], set[bytes]]:
        """GIDs of the request readers and the reply writers of service ``name`` in the graph.

        After a server is killed its endpoints stay in the graph until their lease runs out,
        so "the service is available" may mean only the dead incarnation is; these GIDs tell a
        new incarnation from the old one."""
        ns_name = name if name.startswith("/") else f"/{name}"
        req = self.node.get_subscriptions_info_by_topic(f"rq{ns_name}Request", no_mangle=True)
        rep = self.node.get_publishers_info_by_topic(f"rr{ns_name}Reply", no_mangle=True)
        return {bytes(i.endpoint_gid) for i in req}, {bytes(i.endpoint_gid) for i in rep}

    def wait_for_new_server(self, name: str, old: tuple[set[bytes], set[bytes]],
                            timeout: float = DEFAULT_SERVICE_TIMEOUT, procs: Iterable[NodeProcess] = ()) -> float:
        """Wait until a server of ``name`` other than the ``old`` endpoints is in the graph (both
        its request reader and its reply writer); return the seconds it took."""
        start = time.monotonic()
        procs = list(procs)
        while True:
            req, rep = self.service_endpoints(name)
            if req - old[0] and rep - old[1]:
                return time.monotonic() - start
            dead = describe_dead(procs)
            if dead:
                raise AssertionError(f"node died while waiting for a new server of {name}:\n{dead}")
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"no new server of {name} after {timeout:.0f} s")
            self.spin_for(0.1)

    def forget_client(self, srv_type: Any, name: str) -> None:
        """Destroy the cached client of ``name``: the next call matches new endpoints afresh."""
        client = self._clients.pop((srv_type, name), None)
        if client is not None:
            self.node.destroy_client(client)

    def client(self, srv_type: Any, name: str) -> Any:
        key = (srv_type, name)
        if key not in self._clients:
            self._clients[key] = self.node.create_client(srv_type, name)
        return self._clients[key]

    def call(
        self,
        srv_type: Any,
        name: str,
        request: Any = None,
        timeout: float = 10.0,
    ) -> Any:
        """Call service ``name`` and return the response; raise TimeoutError if none comes."""
        client = self.client(srv_type, name)
        if not client.wait_for_service(timeout_sec=timeout):
            raise TimeoutError(f"service {name} not available after {timeout} s")
        future = client.call_async(request if request is not None else srv_type.Request())
        self._rclpy.spin_until_future_complete(self.node, future, timeout_sec=timeout)
        if not future.done():
            client.remove_pending_request(future)
            raise TimeoutError(f"no reply from {name} within {timeout} s")
        exc = future.exception()
        if exc is not None:
            raise exc
        return future.result()

    def wait_for_message(self, msg_type: Any, topic: str, timeout: float = 10.0, qos: int = 10) -> Any:
        """Subscribe to ``topic`` and return its first message; raise TimeoutError if none."""
        got: list[Any] = []
        sub = self.node.create_subscription(msg_type, topic, got.append, qos)
        try:
            end = time.monotonic() + timeout
            while not got and time.monotonic() < end:
                self._rclpy.spin_once(self.node, timeout_sec=0.05)
            if not got:
                raise TimeoutError(f"no message on {topic} within {timeout} s")
            return got[0]
        finally:
            self.node.destroy_subscription(sub)


def rclpy_init_once() -> None:
    import rclpy

    check_ros_env()
    if not rclpy.ok():
        rclpy.init(args=[])


def rclpy_shutdown() -> None:
    import rclpy

    rclpy.try_shutdown()
