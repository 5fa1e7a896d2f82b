"""The timing a consumer's frame lookup relies on in a v3 camera shard.

The checks of ``dataset.video.timing_problems`` on the shard's demuxed packets (nothing
decoded): decode times strictly increasing, presentation times on the fps grid within
LeRobot's 1e-4 s, one frame per slot, and a stated duration that covers the last frame without
reaching a frame past it. A shard holds 10^4-10^5 packets: the times stay integer ticks.
"""

from __future__ import annotations

from pathlib import Path

from ..common import mp4_timing
from ..common.video import stream_timing, timing_problems


def shard_timing_problems(path: Path, fps: int, frames: int) -> list[str]:
    """Why a consumer reading ``frames`` frames at ``i / fps`` from ``path`` would fail ([] if not).
    A shard of the plain shape is timed from its moov box (mp4_timing), any other by PyAV."""
    timing = mp4_timing.stream_timing(path)
    return timing_problems(timing if timing is not None else stream_timing(path), fps, frames)
