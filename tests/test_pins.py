"""Every Python dependency is pinned exactly once, at the version the test venv runs."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import pins  # noqa: E402  (tools/ is not a package)


def test_constraints_match_the_venv() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "pins.py")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_each_package_pinned_in_one_place() -> None:
    names: Counter[str] = Counter()
    for name in pins.REQUIREMENT_FILES:
        names.update(pins.canonicalize_name(r.name) for r in pins.read_requirements(name)
                     if any(s.operator == "==" for s in r.specifier))
    names.update(list(pins.read_constraints()))
    twice = [n for n, c in names.items() if c > 1]
    assert not twice, f"pinned in two files: {twice}"
    # every package the requirement files pull in has an exact version somewhere
    unpinned = set(pins.closure()) - set(names)
    assert not unpinned, f"not pinned: {sorted(unpinned)}"


def test_setup_installs_with_the_constraints() -> None:
    setup = (ROOT / "tools" / "setup.sh").read_text(encoding="utf-8")
    assert "-r requirements-ros.txt -r requirements.txt -c constraints.txt" in setup


def test_installed_versions_equal_the_pins() -> None:
    """A fresh clone runs exactly what CI tested: every pin (top-level or transitive) is the
    version installed here, the pip-only robot pins (pyarrow, av, mcap, ...) included."""
    pinned = {name: version for name, (version, _file) in pins.top_level_pins().items()}
    pinned.update(pins.read_constraints())
    installed = pins.closure()
    for core in ("pyarrow", "av", "mcap", "mcap-ros2-support", "zarr", "simplejpeg", "h5py", "numpy"):
        assert core in pinned, f"{core} is not pinned"
    wrong = {n: (v, installed.get(n)) for n, v in pinned.items() if n in installed and installed[n] != v}
    assert not wrong, f"pinned (left) but installed (right): {wrong}"
    assert set(installed) <= set(pinned)


def test_requirements_take_the_robot_pins() -> None:
    """requirements.txt constrains its unversioned lines by requirements-robot.txt, so the dev/CI
    venv and a robot install the same versions of the pip-only dependencies."""
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    assert "-c requirements-robot.txt" in lines
    robot = {pins.canonicalize_name(r.name) for r in pins.read_requirements("requirements-robot.txt")}
    assert {"pyarrow", "av", "mcap", "mcap-ros2-support", "zarr", "simplejpeg"} <= robot
