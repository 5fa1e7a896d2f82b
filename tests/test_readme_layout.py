"""The README's code-layout table matches the tree: every module is named in its folder's row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_rows() -> dict[str, str]:
    """First cell's paths -> the row's text, from the table under '## Code layout'."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line[2:].split(" | ", 1)[0]
            for path in re.findall(r"`([^`]+)`", first):
                rows[path] = line
    return rows


def missing_modules() -> list[str]:
    rows = layout_rows()
    top = " ".join(v for k, v in rows.items() if k.startswith("eva_export/") and k.endswith(".py"))
    missing = []
    for path in sorted((ROOT / "eva_export").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py":
            continue
        if len(rel.parts) == 2:  # eva_export/x.py: a row of its own or named beside one
            if f"`{rel}`" not in top and f"`{path.name}`" not in top:
                missing.append(str(rel))
            continue
        folder = f"{rel.parts[0]}/{rel.parts[1]}/"
        if f"`{path.name}`" not in rows.get(folder, ""):
            missing.append(str(rel))
    return missing


def test_every_module_is_in_the_readme_layout_table() -> None:
    assert missing_modules() == []


def test_every_row_names_a_path_that_exists() -> None:
    gone = [p for p in layout_rows() if not (ROOT / p).exists() and not (ROOT / "eva_export" / p).exists()]
    assert gone == []
