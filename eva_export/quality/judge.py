"""Every quality rule over one episode's evidence: the one entry point of live capture
(capture/checks.py) and ``eva-export check`` (quality/offline.py). Its own module so the
kinematic rules can build on rules.py's records without a circle.

The rules are a registry, ``RULES``: one ``RuleSpec`` a rule family, run in that order, each
returning its findings. Adding a rule is its function plus one line here;
``tests/plugins/flat_action.py`` does exactly that in the tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .kinematics import kinematic_rules
from .rules import (
    EpisodeEvidence,
    Finding,
    Thresholds,
    camera_rules,
    error,
    message_rules,
    timestamp_rules,
    vector_row_rules,
)


@dataclass(frozen=True)
class Judged:
    """What a rule sees: the episode's evidence, the thresholds, and the rows where a timestamp
    gap starts a new segment (computed once: a gap is reported once, not as a jump)."""

    ev: EpisodeEvidence
    th: Thresholds
    breaks: NDArray[np.intp] | None


@dataclass(frozen=True)
class RuleSpec:
    name: str  # the rule family, for docs and messages
    run: Callable[[Judged], list[Finding]]


def _length(j: Judged) -> list[Finding]:
    if j.ev.rows < j.th.min_frames:
        return [error("too_short", "", f"{j.ev.rows} frames, fewer than min_frames={j.th.min_frames}")]
    return []


def _timestamps(j: Judged) -> list[Finding]:
    t = j.ev.timestamps
    if t is None:
        return []
    return timestamp_rules("timestamp", t, np.arange(t.size, dtype=np.int64), j.ev.fps, j.th, on_grid=True)


def _messages(j: Judged) -> list[Finding]:
    return [f for m in j.ev.messages for f in message_rules(m, j.ev.fps, j.th)]


def _vectors(j: Judged) -> list[Finding]:
    # per vector, its row rules then its kinematics: the order findings are stored in
    return [f for v in j.ev.vectors for f in (*vector_row_rules(v), *kinematic_rules(v, j.ev.fps, j.th, j.breaks))]


def _cameras(j: Judged) -> list[Finding]:
    return [f for c in j.ev.cameras for f in camera_rules(c, j.ev.rows, j.th)]


RULES: tuple[RuleSpec, ...] = (
    RuleSpec("length", _length),
    RuleSpec("timestamps", _timestamps),
    RuleSpec("messages", _messages),
    RuleSpec("vectors", _vectors),
    RuleSpec("cameras", _cameras),
)


def evaluate(ev: EpisodeEvidence, th: Thresholds = Thresholds()) -> list[Finding]:
    """Every registered rule over one episode's evidence, in the registry's order."""
    breaks = None
    if ev.timestamps is not None and ev.timestamps.size > 1:
        breaks = np.flatnonzero(np.diff(ev.timestamps) > th.gap_periods / ev.fps) + 1
    judged = Judged(ev, th, breaks)
    return [f for spec in RULES for f in spec.run(judged)]
