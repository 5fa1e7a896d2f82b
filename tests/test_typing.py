"""The typed modules stay clean under ``mypy --strict``.

MODULES is the list checked; add a module (one per line, sorted within its group) once it
passes. Imports are followed silently: a listed module is checked against the types of what it
imports, while modules not (yet) listed are not reported. rclpy-facing node modules are listed
too; the generated eva_export_interfaces package has no type information, so their imports of
it carry ``# type: ignore[import-untyped]``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(600)

MODULES = [
    # issue 13 part A: format registry, job engine, job nodes
    "eva_export.export.runner",
    "eva_export.formats.base",
    "eva_export.formats.lerobot_v21",
    "eva_export.formats.registry",
    "eva_export.formats.verify",
    "eva_export.jobs",
    "eva_export.nodes.common",
    "eva_export.nodes.export_node",
    "eva_export.nodes.upload_node",
    "eva_export.upload.cli",
    "eva_export.upload.gate",
    "eva_export.upload.runner",
]


def test_mypy_strict_on_typed_modules() -> None:
    args = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary"]
    for m in MODULES:
        args += ["-m", m]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=550)
    assert proc.returncode == 0, proc.stdout + proc.stderr
