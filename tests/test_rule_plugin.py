"""Adding a quality rule is its function + one registry line: shown with a camera-count rule.

The rule (tests/plugins/camera_count.py) is registered for one test by extending
``quality/judge.py``'s ``RULES``; ``eva-export check``'s driver reads a real dataset and reports
it beside the built-in rules, and a dataset that meets it gets nothing from it (the control)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset
from plugins import camera_count

from eva_export.quality import judge
from eva_export.quality.offline import check_dataset


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "RULES", (*judge.RULES, camera_count.SPEC))  # the one registry line


def codes(root: Path) -> list[list[str]]:
    return [[f.code for f in ep.findings] for ep in check_dataset(root).episodes]


def test_a_registered_rule_reports_on_a_real_dataset(tmp_path: Path, registered: None) -> None:
    one = make_dataset(tmp_path / "one" / "raw", [Ep(frames=30), Ep(frames=30)], cameras=1)
    two = make_dataset(tmp_path / "two" / "raw", [Ep(frames=30)], cameras=2)
    assert [c.count("too_few_cameras") for c in codes(one)] == [1, 1]
    assert codes(two) == [[]]  # the control: two cameras, nothing from the new rule or the others


def test_an_unregistered_rule_does_not_run(tmp_path: Path) -> None:
    one = make_dataset(tmp_path / "one" / "raw", [Ep(frames=30)], cameras=1)
    assert "too_few_cameras" not in [code for c in codes(one) for code in c]
    assert [s.name for s in judge.RULES] == ["length", "timestamps", "messages", "vectors", "cameras"]
