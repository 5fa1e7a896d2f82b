"""Shared fixtures. Importing this module configures ROS for loopback-only, per-run DDS.

The environment is set here, at import, before any rclpy process starts (the test process's
own rclpy context included): ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, this run's
ROS_DOMAIN_ID (EVA_TEST_DOMAIN_ID or derived from the pid) and RMW_IMPLEMENTATION. Under
pytest-xdist each worker takes its own domain: EVA_TEST_DOMAIN_ID + worker number, or one
derived from the run's id + worker number, so two workers' nodes never see each other.
Tier markers (ros, sshd, browser, slow, timing) are applied at collection (tests/tiers.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rosharness  # noqa: E402
import tiers  # noqa: E402


def _worker_domain() -> None:
    """Give this xdist worker a ROS domain of its own (no-op outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    index = tiers.worker_index()
    base = os.environ.get("EVA_TEST_DOMAIN_ID", "").strip()
    if base:
        domain = int(base) + index
    else:  # every worker of one run shares the run id: consecutive domains, none shared
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "") or str(os.getppid())
        domain = 1 + (int.from_bytes(run.encode(), "big") + index) % 101
    os.environ["EVA_TEST_DOMAIN_ID"] = str(domain)


_worker_domain()
DOMAIN_ID = rosharness.configure_ros_env()


def pytest_report_header(config: pytest.Config) -> str:
    return f"ROS_DOMAIN_ID={DOMAIN_ID} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST (loopback only)"


@pytest.fixture(scope="session", autouse=True)
def _stop_leftover_nodes() -> Iterator[None]:
    """Whatever a test forgot to stop is stopped at the end of the session."""
    yield
    rosharness.stop_all()


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> object:
    """A throwaway OpenSSH server on 127.0.0.1 for this test (tests/sshd.py), stopped after it."""
    from sshd import SshServer

    srv = SshServer.start(tmp_path / "sshd")
    request.addfinalizer(srv.stop)
    return srv


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's headless chromium through Playwright, one per test module."""
    import os

    from browser import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    assert os.path.isfile(CHROMIUM), f"{CHROMIUM} is missing: apt-get install -y chromium (tools/setup.sh)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def rclpy_context() -> Iterator[None]:
    """rclpy initialised once in the test process."""
    rosharness.rclpy_init_once()
    yield
    rosharness.rclpy_shutdown()


@pytest.fixture
def ros_client(rclpy_context: None) -> Iterator[rosharness.RosClient]:
    """An in-test rclpy node: ``call(srv_type, name, request, timeout)``,
    ``wait_for_services(names, timeout, procs)``, ``wait_for_message(type, topic, timeout)``."""
    client = rosharness.RosClient()
    yield client
    client.close()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[object]:
    """Start node processes: ``node_factory("capture_node", params={...})``.

    Each gets a unique namespace (so services of an earlier test's node are never mistaken
    for this one's), logs to ``tmp_path/logs`` and is stopped (SIGINT, then SIGKILL) at the
    end of the test.
    """
    started: list[rosharness.NodeProcess] = []

    def start(executable: str, **kwargs: object) -> rosharness.NodeProcess:
        kwargs.setdefault("namespace", rosharness.unique_namespace())
        proc = rosharness.NodeProcess(executable, tmp_path / "logs", **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """A small valid configuration file in tmp_path (writes into tmp_path only)."""
    log_dir = tmp_path / "datasets"
    log_dir.mkdir()
    path = tmp_path / "config.yaml"
    path.write_text(f'collection:\n  log_dir: "{log_dir}"\n  fps: 30\n')
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.apply(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    return tiers.scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    for line in tiers.MARKERS:
        config.addinivalue_line("markers", line)
    # lark (pulled in by the rosidl parser of the ROS wheels) imports deprecated sre modules
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:lark.*")
