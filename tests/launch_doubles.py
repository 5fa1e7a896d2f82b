"""Small stand-ins of ROS 2 ``launch`` / ``launch_ros`` that record what a launch file asks for.

``launch_ros`` cannot be installed from PyPI, so tests (and the demo) load
``launch/eva.launch.py`` with these doubles, then start the recorded executables with the
recorded parameters as real processes: the same nodes the real launch would start.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAUNCH_FILE = Path(__file__).resolve().parents[1] / "launch" / "eva.launch.py"
_MODULES = ("launch", "launch.actions", "launch.substitutions", "launch_ros", "launch_ros.actions")


class Recorder:
    def __init__(self, kind: str, *args: Any, **kwargs: Any) -> None:
        self.kind = kind
        self.args = args
        self.kwargs = kwargs


class FakeLaunchConfiguration:
    def __init__(self, variable_name: str, **kwargs: Any) -> None:
        self.variable_name = variable_name
        self.kwargs = kwargs


class LaunchDescription:
    def __init__(self, initial_entities: Any = None) -> None:
        self.entities = list(initial_entities or [])

    def add_action(self, action: Any) -> None:
        self.entities.append(action)


def fake_launch_modules() -> dict[str, types.ModuleType]:
    mods = {name: types.ModuleType(name) for name in _MODULES}
    mods["launch"].LaunchDescription = LaunchDescription  # type: ignore[attr-defined]
    mods["launch.actions"].DeclareLaunchArgument = (  # type: ignore[attr-defined]
        lambda name, **kw: Recorder("DeclareLaunchArgument", name, **kw))
    mods["launch.actions"].SetEnvironmentVariable = (  # type: ignore[attr-defined]
        lambda name, value, **kw: Recorder("SetEnvironmentVariable", name, value, **kw))
    mods["launch.substitutions"].LaunchConfiguration = FakeLaunchConfiguration  # type: ignore[attr-defined]
    mods["launch_ros.actions"].Node = lambda **kw: Recorder("Node", **kw)  # type: ignore[attr-defined]
    mods["launch"].actions = mods["launch.actions"]  # type: ignore[attr-defined]
    mods["launch"].substitutions = mods["launch.substitutions"]  # type: ignore[attr-defined]
    mods["launch_ros"].actions = mods["launch_ros.actions"]  # type: ignore[attr-defined]
    return mods


def load_launch_description(launch_file: Path = LAUNCH_FILE) -> LaunchDescription:
    """Run ``generate_launch_description()`` against the doubles; sys.modules is restored."""
    saved = {name: sys.modules.get(name) for name in _MODULES}
    sys.modules.update(fake_launch_modules())
    try:
        spec = importlib.util.spec_from_file_location("eva_launch_under_test", launch_file)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.generate_launch_description()
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def resolve(value: Any, arguments: dict[str, str]) -> Any:
    """Substitute recorded LaunchConfiguration objects the way launch would."""
    if isinstance(value, FakeLaunchConfiguration):
        return arguments[value.variable_name]
    if isinstance(value, dict):
        return {k: resolve(v, arguments) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve(v, arguments) for v in value]
    return value


def recorded(ld: LaunchDescription) -> tuple[dict[str, Recorder], list[Recorder]]:
    declared = {e.args[0]: e for e in ld.entities if e.kind == "DeclareLaunchArgument"}
    nodes = [e for e in ld.entities if e.kind == "Node"]
    return declared, nodes


@dataclass(frozen=True)
class PlannedNode:
    executable: str
    name: str
    params: dict[str, Any]


def launch_plan(arguments: dict[str, str], launch_file: Path = LAUNCH_FILE) -> tuple[list[PlannedNode], dict[str, str]]:
    """The nodes (with resolved parameters) and environment the launch file sets up."""
    ld = load_launch_description(launch_file)
    declared, nodes = recorded(ld)
    args = {k: r.kwargs.get("default_value") for k, r in declared.items()}
    args.update(arguments)
    env = {e.args[0]: str(resolve(e.args[1], args)) for e in ld.entities if e.kind == "SetEnvironmentVariable"}
    plan = []
    for n in nodes:
        params: dict[str, Any] = {}
        for entry in resolve(n.kwargs["parameters"], args):
            params.update(entry)
        plan.append(PlannedNode(n.kwargs["executable"], n.kwargs["name"], params))
    return plan, env
