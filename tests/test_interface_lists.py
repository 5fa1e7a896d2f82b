"""The names the ROS interfaces list in their comments are the registries' names.

A ``string format`` field says which formats it takes, a ``string source_kind`` field which
kinds it reports: each comment's list must be exactly what the format and source registries
hold, so adding a format (or a kind) without its interface line fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eva_export.formats.registry import format_names
from eva_export.formats.sources import source_kinds

REPO = Path(__file__).resolve().parents[1]
FIELD = re.compile(r"^string\s+(format|source_kind)\s+#\s*(.+)$")
REGISTRY = {"format": format_names, "source_kind": source_kinds}


def listed(comment: str) -> list[str]:
    """'a, b, c or d' -> [a, b, c, d]; anything after the list (a sentence) is not a name."""
    head = re.split(r"[;:(]", comment, maxsplit=1)[0]
    return [n.strip() for n in re.split(r",|\bor\b", head) if n.strip()]


def interface_lists() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in sorted([*REPO.glob("msg/*.msg"), *REPO.glob("srv/*.srv")]):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = FIELD.match(line.strip())
            if m:
                found.append((path.relative_to(REPO).as_posix(), m.group(1), listed(m.group(2))))
    return found


def test_the_listed_comments_are_found() -> None:
    files = {f for f, _field, _names in interface_lists()}
    assert {"msg/Job.msg", "srv/StartExport.srv", "srv/CheckDataset.srv"} <= files


@pytest.mark.parametrize(("where", "field", "names"), interface_lists(), ids=lambda v: str(v))
def test_an_interface_lists_exactly_the_registered_names(where: str, field: str, names: list[str]) -> None:
    registered = REGISTRY[field]()
    assert sorted(names) == sorted(registered), (
        f"{where}: the {field} comment lists {names}, the registry holds {registered}")
    assert len(set(names)) == len(names), f"{where}: {names} lists a name twice"
