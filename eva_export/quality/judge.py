"""Every quality rule over one episode's evidence: the one entry point of live capture
(capture/checks.py) and ``eva-export check`` (quality/offline.py). Its own module so the
kinematic rules can build on rules.py's records without a circle."""

from __future__ import annotations

import numpy as np

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


def evaluate(ev: EpisodeEvidence, th: Thresholds = Thresholds()) -> list[Finding]:
    """Every rule over one episode's evidence, in a fixed order."""
    out: list[Finding] = []
    breaks = None
    if ev.timestamps is not None and ev.timestamps.size > 1:
        # rows after a timestamp gap start a new segment: the gap is reported once, not as a jump
        breaks = np.flatnonzero(np.diff(ev.timestamps) > th.gap_periods / ev.fps) + 1
    if ev.rows < th.min_frames:
        out.append(error("too_short", "", f"{ev.rows} frames, fewer than min_frames={th.min_frames}"))
    if ev.timestamps is not None:
        out += timestamp_rules("timestamp", ev.timestamps, np.arange(ev.timestamps.size, dtype=np.int64),
                               ev.fps, th, on_grid=True)
    for m in ev.messages:
        out += message_rules(m, ev.fps, th)
    for v in ev.vectors:
        out += vector_row_rules(v)
        out += kinematic_rules(v, ev.fps, th, breaks)
    for c in ev.cameras:
        out += camera_rules(c, ev.rows, th)
    return out
