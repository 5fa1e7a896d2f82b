"""The README is a landing page and the docs are findable and true to the tree.

- README.md stays under 400 lines, and every page under docs/ is reachable from it by links.
- Every relative link in README.md, CHANGELOG.md, bench/RESULTS.md and docs/ resolves (pages
  other work is writing right now may be linked before they exist: ``PENDING``).
- docs/architecture.md's code-layout table matches the tree: every module is named in its
  folder's row, and every row names a path that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_DOC = ROOT / "docs" / "architecture.md"
LAYOUT_HEADING = "## Layers and code layout"
PENDING = {"docs/capture.md", "docs/nonfinite.md", "docs/untrusted-input.md", "docs/mcap-viewers.md"}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def layout_rows() -> dict[str, str]:
    """First cell's paths -> the row's text, from the table under the layout heading."""
    text = LAYOUT_DOC.read_text(encoding="utf-8")
    section = text.split(LAYOUT_HEADING, 1)[1].split("\n## ", 1)[0]
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
        # the row of the deepest folder that has one (a format package, else its parent)
        folders = [f"{'/'.join(rel.parts[:n])}/" for n in range(len(rel.parts) - 1, 1, -1)]
        folder = next((f for f in folders if f in rows), folders[-1])
        if f"`{path.name}`" not in rows.get(folder, ""):
            missing.append(str(rel))
    return missing


def links(page: Path) -> list[Path]:
    """The local files ``page`` links to (web links and anchors left out)."""
    out = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" not in target and not target.startswith("mailto:"):
            out.append((page.parent / target).resolve())
    return out


def test_every_module_is_in_the_layout_table() -> None:
    assert missing_modules() == []


def test_every_row_names_a_path_that_exists() -> None:
    gone = [p for p in layout_rows() if not (ROOT / p).exists() and not (ROOT / "eva_export" / p).exists()]
    assert gone == []


def test_readme_is_a_landing_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 400, f"README.md has {len(lines)} lines; move reference material to docs/"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    seen: set[Path] = set()
    todo = [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or not page.is_file() or page.suffix != ".md":
            continue
        seen.add(page)
        todo += links(page)
    unreachable = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if p.resolve() not in seen)
    assert unreachable == []


def test_every_local_link_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in links(page):
            rel = str(target.relative_to(ROOT)) if target.is_relative_to(ROOT) else str(target)
            if not target.exists() and rel not in PENDING:
                broken.append(f"{page.relative_to(ROOT)} -> {rel}")
    assert broken == []
