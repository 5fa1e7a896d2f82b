"""A finished MCAP file's summary, read by both MCAP profiles when a stopped run resumes."""

from __future__ import annotations

from pathlib import Path

from mcap.exceptions import McapError
from mcap.reader import make_reader


def channel_counts(path: Path) -> dict[str, int] | None:
    """Messages per topic from a finished MCAP file's summary (how a stopped run tells a complete
    episode file from a cut one); None when the file is unreadable or has no statistics."""
    try:
        with open(path, "rb") as fh:
            summary = make_reader(fh).get_summary()
        if summary is None or summary.statistics is None:
            return None
        return {summary.channels[c].topic: n for c, n in summary.statistics.channel_message_counts.items()}
    except (OSError, McapError, KeyError, ValueError):
        return None
