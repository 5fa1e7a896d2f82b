"""The code base passes the ruff rule set of pyproject.toml (pyflakes, pycodestyle, import order,
bugbear, pyupgrade, simplify, RUF, blind excepts) and keeps its rooms small: no module over 400
lines, no function over 60."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "eva_export", "tests", "bench", "tools",
                           "launch"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- rooms a reader can hold in their head ------------------------------------------
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, lines from ``def`` to the last line) of every function, nested ones too."""
    out: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            out.append((name, (node.end_lineno or node.lineno) - node.lineno + 1))
            out += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            out += _functions(node, prefix + node.name + ".")
        else:
            out += _functions(node, prefix)
    return out


def _sources() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))
            for p in sorted((ROOT / "eva_export").rglob("*.py"))]


def test_no_module_over_400_lines() -> None:
    sources = _sources()
    assert len(sources) > 50  # the walk found the package
    long = {rel: n for rel, text in sources if (n := len(text.splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by purpose): {long}"


def test_no_function_over_60_lines() -> None:
    found = {f"{rel}:{name}": n for rel, text in _sources() for name, n in _functions(ast.parse(text))}
    assert found["eva_export/capture/align.py:GridAligner.push"] > 20  # the walk sees methods by qualified name
    long = {k: n for k, n in found.items() if n > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by purpose): {long}"
