"""Free space for capture: START is refused below the configured floor, and STOP refuses to
queue an episode whose save cannot fit (the encoders already failed, or the table will not),
so neither reply reports success for data that will be lost."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import CollectionConfig
from ..formats.common.records import DatasetInfo
from ..formats.lerobot_v21.episode_writer import EpisodeWriter
from ..fsutil import free_bytes

MIB = 1 << 20
#: What a save writes besides the table: meta rows, statistics, the journal.
META_BYTES = MIB


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def start_refusal(col: CollectionConfig, root: Path) -> str:
    """The reason START must be refused for lack of space under log_dir, or ""."""
    floor = col.capture.min_free_mb * MIB
    free = free_bytes(root)
    if 0 <= free < floor:
        return (f"refused: only {_mib(free)} free under {col.log_dir}, below collection.capture.min_free_mb "
                f"({col.capture.min_free_mb} MiB, room for one expected episode); free some space first")
    return ""


def save_bytes(info: DatasetInfo, rows: int) -> int:
    """Bytes a save still writes for ``rows`` frames (the MP4s are written while recording)."""
    per_row = sum(8 * int(np.prod(f.shape)) + 16 for k, f in info.features.items() if f.dtype != "video")
    return rows * per_row + META_BYTES


def stop_refusal(root: Path, info: DatasetInfo, writer: EpisodeWriter) -> str:
    """The reason the stopped episode cannot be saved (said in STOP's reply), or ""."""
    failed = writer.failure()
    if failed:
        return f"saving failed: the video encoders failed while recording ({failed}; {_mib(free_bytes(root))} free " \
               f"under {root})"
    need, free = save_bytes(info, writer.rows), free_bytes(root)
    if 0 <= free < need:
        return f"saving failed: the episode needs about {_mib(need)} under {root}, only {_mib(free)} free"
    return ""
