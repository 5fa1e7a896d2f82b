"""Where an export of a source goes, and where its staging, backup and lock live.

``<log_dir>/<name>/raw`` exports to ``<log_dir>/<name>/export/<format>/{accepted,rejected}``;
a source with another name ``S`` exports to ``S_export/<format>/{accepted,rejected}``; a named
export (one or several sources, merge.py) to ``<data root>/<name>/export/<format>/...``.

The directory ``<export>/<format>`` holds exactly the published pair and is published as one
unit (see publish.py); its staging root, backups and lock file live beside it in ``<export>``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .. import confine
from .records import ACCEPTED, REJECTED


def export_root(source_dir: Path) -> Path:
    """``<dataset>/export`` for a ``raw`` source, else ``<source>_export``."""
    src = Path(os.path.realpath(source_dir))
    if src.name == "raw":
        return src.parent / "export"
    return src.parent / f"{src.name}_export"


def source_key(source_dir: Path, fmt: str) -> str:
    """A short stable key of (resolved source, format): names the resumable staging root."""
    real = os.path.realpath(source_dir)
    return hashlib.sha256(f"{real}\0{fmt}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExportPaths:
    source_dir: Path  # resolved
    fmt: str
    root: Path  # <export>

    @classmethod
    def of(cls, source_dir: Path, fmt: str) -> ExportPaths:
        confine.check_name(fmt, "format")  # it names directories and lock files beside the pair
        return cls(Path(os.path.realpath(source_dir)), fmt, export_root(source_dir))

    @classmethod
    def named(cls, home: Path, fmt: str) -> ExportPaths:
        """A named export (merge.py): ``<data root>/<name>/export/<format>``; ``source_dir`` is
        the home, which no single source's export uses."""
        confine.check_name(fmt, "format")
        real = Path(os.path.realpath(home))
        return cls(real, fmt, real / "export")

    @property
    def pair_dir(self) -> Path:
        """``<export>/<format>``: holds accepted/ and rejected/, replaced as one unit."""
        return self.root / self.fmt

    @property
    def accepted(self) -> Path:
        return self.pair_dir / ACCEPTED

    @property
    def rejected(self) -> Path:
        return self.pair_dir / REJECTED

    def subset(self, name: str) -> Path:
        return self.pair_dir / name

    @property
    def staging(self) -> Path:
        """Resumable staging root, stable across reruns of the same source and format."""
        return self.root / f".staging-{self.fmt}-{source_key(self.source_dir, self.fmt)}"

    def backup(self, job_id: str) -> Path:
        return self.root / f".backup-{self.fmt}-{job_id}"

    def backups(self) -> list[Path]:
        """Existing backups of this format's pair, oldest name first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f".backup-{self.fmt}-*") if p.is_dir())

    @property
    def lock_file(self) -> Path:
        return self.root / f".lock-{self.fmt}"


SUBSETS = (ACCEPTED, REJECTED)
