"""`mypy --strict` runs clean on the typed core modules listed here.

One module per line (branches add theirs without conflicts). rclpy-facing code (nodes/) is not
listed: rclpy ships no type information for its generated message classes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULES = [
    "eva_export.confine",
    "eva_export.fsutil",
    "eva_export.dataset.records",
    "eva_export.dataset.meta",
    "eva_export.dataset.stats",
    "eva_export.dataset.table",
    "eva_export.dataset.video",
    "eva_export.dataset.writer",
    "eva_export.export.manifest",
    "eva_export.export.records",
    "eva_export.store",
    "eva_export.store.codecs",
    "eva_export.store.reader",
    "eva_export.store.records",
    "eva_export.formats.checks",
    "eva_export.formats.episode_files",
    "eva_export.formats.episode_stats",
    "eva_export.formats.images",
    "eva_export.formats.source",
]


def test_mypy_strict() -> None:
    args = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml")]
    for module in MODULES:
        args += ["-m", module]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
