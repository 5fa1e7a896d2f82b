"""The exporter interface every format implements (the formats are listed in registry.py).

An exporter turns one staged native subset (a complete LeRobot v2.1 dataset directory with
its meta/quality_split.json, produced by the quality split) into the same subset in its own
format, inside a staging directory the export core owns. It never publishes anything: the
core moves accepted and rejected into place together, only after both exporters returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class Progress:
    """Callback bundle: an exporter reports each finished episode (and bytes written)."""

    on_episode: Callable[[int, int], None] = lambda episode_index, bytes_written: None


@dataclass
class VerifyReport:
    """What `eva-export verify` found; ``ok`` is False when any check failed."""

    path: str
    dataset_format: str
    episodes: int = 0
    frames: int = 0
    checks: list[str] = field(default_factory=list)  # human-readable lines, one per check passed
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class Exporter(Protocol):
    name: str  # the format value (its FormatSpec.name in registry.py)

    def export(self, native_subset: Path, out_dir: Path, progress: Progress) -> None:
        """Write ``native_subset`` in this format into the empty or absent ``out_dir``.

        Must copy meta/quality_split.json (with dataset_format set to ``name``) and raise an
        ``ExportError`` naming the episode on any mismatch (frame counts, shapes...).
        Episodes already finished in ``out_dir`` by an interrupted run may be reused.
        """
        ...

    def verify(self, out_dir: Path) -> VerifyReport:
        """Check an export against its own metadata and read one value of each kind."""
        ...
