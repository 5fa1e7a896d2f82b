"""The project speaks of itself: no references to filed issues and no work-log narration in
code, comments, tests, tools, docs or the README. Comments say why, not which request asked;
what changed when belongs in CHANGELOG.md (which follows the same rule)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("eva_export", "tests", "tools", "bench", "docs", "launch", "config", "deploy", "srv", "msg",
           "interfaces", ".ci")
FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml", "setup.py", "setup.cfg", "package.xml",
         "requirements.txt", "requirements-robot.txt", "requirements-ros.txt")
SUFFIXES = {".py", ".md", ".sh", ".bash", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".xml", ".srv", ".msg",
            ".service", ".js", ".css", ".html", ".cmake", ""}
# words are split so that this file does not match itself
PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"\biss" r"ues? ?#? ?\d+",          # a filed request by number
    r"\brou" r"nd \d+\b",               # a numbered work round
    r"\bthis rou" r"nd\b",
    r"\bthis sess" r"ion\b",
    r"\bthe tas" r"k asked\b",
)]


def sources() -> list[Path]:
    out = [ROOT / f for f in FILES if (ROOT / f).is_file()]
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts \
                    and path.resolve() != Path(__file__).resolve():
                out.append(path)
    return out


def test_no_issue_references_or_work_log_narration() -> None:
    found = []
    for path in sources():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary fixtures
        for number, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert found == [], "\n".join(found)


def test_the_patterns_catch_what_they_are_for() -> None:
    caught = ["see iss" "ue 28", "(Iss" "ue #12)", "rou" "nd 3 of the work", "Iss" "ue 26: sources", "this rou" "nd's runs"]
    clean = ["the issue codes of a red episode", "quality_issues", "interleaved rounds", "rounds 3 times",
             "color #fff", "frame #", "a list of issues"]
    assert all(any(p.search(s) for p in PATTERNS) for s in caught)
    assert not [s for s in clean if any(p.search(s) for p in PATTERNS)]
