"""The code base passes the ruff rule set of pyproject.toml (pyflakes, pycodestyle, import order, bugbear, pyupgrade, simplify, RUF, blind excepts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "eva_export", "tests", "bench", "tools",
                           "launch"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
