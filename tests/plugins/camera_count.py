"""A quality rule that lives in the tests only: an episode recorded with fewer cameras than a
policy needs.

It proves what adding a rule costs: this function plus one ``RuleSpec`` in
``quality/judge.py``'s ``RULES``; live capture and ``eva-export check`` both run it from there.
"""

from __future__ import annotations

from eva_export.quality.judge import Judged, RuleSpec
from eva_export.quality.rules import Finding, warning

MIN_CAMERAS = 2


def too_few_cameras(j: Judged) -> list[Finding]:
    n = len(j.ev.cameras)
    if n >= MIN_CAMERAS:
        return []
    return [warning("too_few_cameras", "", f"{n} camera(s), a policy here needs {MIN_CAMERAS}")]


SPEC = RuleSpec("camera_count", too_few_cameras)
