"""The core library (everything but eva_export.nodes) must import without ROS.

Each module is imported in a fresh interpreter where rclpy, rosidl*, rmw*, the message
packages and eva_export_interfaces cannot be imported at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import rosharness

pytestmark = pytest.mark.timeout(120)

BLOCKED = (
    "rclpy",
    "rosidl",  # prefix: rosidl_runtime_py, rosidl_parser, ...
    "rmw",
    "rcl_interfaces",
    "eva_export_interfaces",
    "std_msgs",
    "sensor_msgs",
    "geometry_msgs",
    "builtin_interfaces",
    "service_msgs",
    "launch",
    "launch_ros",
    "ament_index_python",
)

SCRIPT = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys, traceback
    BLOCKED = tuple(json.loads(sys.argv[1]))

    def blocked(name):
        top = name.split(".")[0]
        return any(top == b or top.startswith(b) for b in BLOCKED)

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if blocked(name):
                raise ImportError(f"ROS module {name!r} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())
    import eva_export
    results = {}
    names = ["eva_export"]
    for info in pkgutil.walk_packages(eva_export.__path__, "eva_export.", onerror=lambda n: None):
        if info.name == "eva_export.nodes" or info.name.startswith("eva_export.nodes."):
            continue
        names.append(info.name)
    for name in names:
        try:
            importlib.import_module(name)
            results[name] = None
        except BaseException:
            results[name] = traceback.format_exc(limit=5)
    ros_loaded = sorted(m for m in sys.modules if blocked(m))
    print(json.dumps({"results": results, "ros_loaded": ros_loaded}))
    """
)


def test_core_modules_import_without_ros():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(BLOCKED)],
        capture_output=True,
        text=True,
        cwd=str(rosharness.REPO_ROOT),
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert "eva_export" in results
    failures = {name: tb for name, tb in results.items() if tb is not None}
    assert not failures, "modules that import ROS or fail to import:\n" + "\n".join(
        f"--- {name}\n{tb}" for name, tb in failures.items()
    )
    assert report["ros_loaded"] == [], report["ros_loaded"]


def test_blocker_really_blocks():
    """The blocker itself works: importing a node module fails in the blocked interpreter."""
    script = SCRIPT.split("import eva_export\n")[0] + textwrap.dedent(
        """
        try:
            import eva_export.nodes.capture_node
        except ImportError as exc:
            print("blocked:", exc)
        else:
            print("NOT BLOCKED")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(BLOCKED)],
        capture_output=True,
        text=True,
        cwd=str(rosharness.REPO_ROOT),
        timeout=100,
    )
    assert "blocked:" in proc.stdout, proc.stdout + proc.stderr


RAY_SCRIPT = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys, traceback

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ImportError(f"{name!r} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())
    import eva_export
    results = {}
    for info in pkgutil.walk_packages(eva_export.__path__, "eva_export.", onerror=lambda n: None):
        try:
            importlib.import_module(info.name)
            results[info.name] = None
        except BaseException:
            results[info.name] = traceback.format_exc(limit=5)
    print(json.dumps({"results": results, "ray_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "ray")}))
    """
)


def test_nodes_and_core_import_without_ray():
    """Ray is an optional extra of ``eva-export batch --ray``: no module, nodes included, needs it."""
    proc = subprocess.run([sys.executable, "-c", RAY_SCRIPT], capture_output=True, text=True,
                          cwd=str(rosharness.REPO_ROOT), timeout=100)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert "eva_export.nodes.export_node" in results and "eva_export.export.batch" in results
    failures = {name: tb for name, tb in results.items() if tb is not None}
    assert not failures, "modules that need ray:\n" + "\n".join(f"--- {n}\n{tb}" for n, tb in failures.items())
    assert report["ray_loaded"] == []
