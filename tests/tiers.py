"""Test tiers: markers given by what a test starts, applied at collection (tests/conftest.py).

    ros      starts rclpy node processes or an rclpy context in the test process
    sshd     starts a real OpenSSH server
    browser  drives Debian's headless chromium
    slow     over about 10 s alone on a quiet 2-core machine
    timing   timing-sensitive (tools/stress.py runs them beside a CPU hog)

Under ``pytest -n N --dist loadfile`` the scheduler below hands each worker whole files, so a
module-scoped fixture (a colcon build, the demo run, a converted dataset) is made once, and
all timing-sensitive files as one unit, so one worker runs them one after the other and they
never compete with each other for the cores. (pytest-xdist's own ``xdist_group`` does not
group anything under pytest 9: it renames node ids, which pytest 9 derives.)

The fast tier is ``-m "not slow and not ros and not browser"`` (``make test-fast``). Markers
come from the fixtures a test uses and from the file lists below, so a new test in one of these
files is tiered without a decorator.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import stress  # noqa: E402  (tools/ is not a package)

FAST_EXPR = "not slow and not ros and not browser"

ROS_FIXTURES = frozenset({"node_factory", "ros_client", "rclpy_context"})
# files that start node processes through their own helpers, not the fixtures
ROS_FILES = frozenset({
    "test_capture_faults.py", "test_capture_heal.py", "test_capture_kill.py", "test_capture_node.py",
    "test_capture_recovery.py", "test_capture_timing.py", "test_check_service.py",
    "test_colcon_install.py", "test_console.py", "test_console_ui.py", "test_demo.py",
    "test_export_node.py", "test_export_node_disk.py", "test_export_node_merge.py",
    "test_hostile_requests.py", "test_ingest_node.py", "test_launch.py", "test_nodes_smoke.py",
    "test_upload_node.py",
})
SSHD_FILES = frozenset({"test_demo.py", "test_console.py"})
# whole files whose tests each take over ~10 s (measured with --durations on a quiet machine)
SLOW_FILES = frozenset({
    "test_colcon_install.py", "test_export_kill.py", "test_upload_resume.py", "test_batch.py",
    "test_demo.py", "test_console.py", "test_console_ui.py", "test_capture_kill.py",
    "test_capture_timing.py", "test_capture_faults.py", "test_capture_heal.py",
})
# single slow tests in otherwise quick files: "file::test name" (parameters ignored)
SLOW_TESTS = frozenset({
    "test_export_pool.py::test_sigkill_with_workers_leaves_no_worker_and_resumes",
    "test_export_pool.py::test_pool_output_equals_serial_for_every_format",
    "test_upload_openssh.py::test_sftp_only_server",
    "test_formats_store.py::test_sigkill_during_export_leaves_no_half_shard_and_rerun_reuses",
    # the fault corpus written as v3.0 and v2.0 (its module fixture takes ~20 s)
    "test_quality_sources.py::test_foreign_source_gets_the_same_verdicts_as_v21",
    "test_quality_sources.py::test_v30_short_shared_video_is_a_frame_count_mismatch_of_its_episode_only",
})
TIMING_FILES = frozenset(Path(p).name for paths in stress.GROUPS.values() for p in paths)


def markers_for(item: pytest.Item) -> list[str]:
    """The tier markers of one collected test."""
    fixtures = set(getattr(item, "fixturenames", ()))
    name = item.path.name
    base = f"{name}::{item.name.split('[', 1)[0]}"
    marks = []
    if fixtures & ROS_FIXTURES or name in ROS_FILES:
        marks.append("ros")
    if "server" in fixtures or name in SSHD_FILES:
        marks.append("sshd")
    if "browser" in fixtures:
        marks.append("browser")
    if name in SLOW_FILES or base in SLOW_TESTS:
        marks.append("slow")
    if name in TIMING_FILES:
        marks.append("timing")
    return marks


def reorder(items: list[pytest.Item]) -> None:
    """EVA_TEST_ORDER=reverse or random:SEED runs the tests in another order, to show that none
    depends on another's leftovers (every xdist worker computes the same order)."""
    order = os.environ.get("EVA_TEST_ORDER", "")
    if order == "reverse":
        items.reverse()
    elif order.startswith("random:"):
        random.Random(order.split(":", 1)[1]).shuffle(items)
    elif order:
        raise pytest.UsageError(f"EVA_TEST_ORDER={order!r}: use reverse or random:SEED")


def apply(items: list[pytest.Item]) -> None:
    reorder(items)
    for item in items:
        for mark in markers_for(item):
            item.add_marker(mark)


def worker_index() -> int:
    """This pytest-xdist worker's number (gw3 -> 3); 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0

MARKERS = (
    "ros: starts rclpy node processes or an rclpy context",
    "sshd: starts a real OpenSSH server",
    "browser: drives headless chromium",
    "slow: over about 10 s alone on a quiet 2-core machine",
    "timing: timing-sensitive (tools/stress.py); under xdist one worker runs them one after the other",
)


def scheduler(config: pytest.Config, log: object) -> object | None:
    """The xdist scheduler for ``--dist loadfile``: whole files, the timing files as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "timing" if Path(file).name in TIMING_FILES else file

    return TierScheduling(config, log)
