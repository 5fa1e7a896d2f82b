"""An export request as the boundary checked it, carried inward as one value.

``ExportService.check_export`` builds it from a service call or CLI arguments: every source
resolved inside the data roots, and the format resolved in the registry (the one place a
format name is looked up; an unknown name is ``UnknownFormatError``, wherever it came from).
The job body receives the value, so nothing downstream looks the format up again.

A single source without a name is the classic export (its pair beside the source); with a
``name`` (required for several sources, export/merge.py) the pair goes to
``<data root>/<name>/export/<format>`` and every episode row records where it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import confine
from ..errors import ConfigError
from ..formats.common.meta import INFO
from ..formats.registry import FormatSpec
from ..fsutil import read_json


@dataclass(frozen=True)
class ExportRequest:
    sources: tuple[Path, ...]  # in order; each resolved (symlinks, '..'), inside export.data_roots, a directory
    spec: FormatSpec  # the requested format, from formats.registry
    name: str = ""  # required for several sources: the merged set's directory under the data root

    def __post_init__(self) -> None:
        if not self.sources:
            raise ConfigError("source_dir is required")
        if len(self.sources) > 1 and not self.name:
            raise ConfigError(f"{len(self.sources)} sources are merged into one set: a name is required "
                              "(eva-export export --name NAME; StartExport name)")
        if self.name:
            confine.check_name(self.name, "export name")
        real = [os.path.realpath(s) for s in self.sources]
        dup = next((s for i, s in enumerate(real) if s in real[:i]), None)
        if dup is not None:
            raise ConfigError(f"source {dup} is given twice")

    @property
    def source(self) -> Path:
        """The first (for a classic export: the only) source."""
        return self.sources[0]

    @property
    def fmt(self) -> str:
        return self.spec.name

    def episodes_hint(self) -> int:
        """The sources' episode counts as their info.json states them (0 for one unreadable or
        outside its source): a size hint taken before validation, trusted for nothing else."""
        total = 0
        for s in self.sources:
            try:
                n = read_json(s / INFO).get("total_episodes", 0) if confine.inside(s, s / INFO) else 0
            except (OSError, ValueError, AttributeError):
                continue
            total += n if isinstance(n, int) and 0 < n < 1 << 40 else 0
        return total

    @property
    def named(self) -> bool:
        """A named export: the pair under the data root, provenance in every row."""
        return bool(self.name)

    def home(self, roots: tuple[Path, ...]) -> Path:
        """``<data root>/<name>``: the merged set's home, in the data root holding the first source."""
        root = next((r for r in roots if confine.inside(r, self.sources[0])), roots[0])
        home = Path(os.path.realpath(root)) / self.name
        if (home / INFO).exists() or (home / "raw").exists() or any(
                confine.inside(home, s) for s in self.sources):
            raise ConfigError(f"export name {self.name!r}: {home} holds a recorded dataset; choose another name")
        return home
