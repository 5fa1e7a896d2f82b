"""An export request as the boundary checked it, carried inward as one value.

``ExportService.check_request`` builds it from a service call or CLI arguments: the source
resolved inside the data roots, and the format resolved in the registry (the one place a
format name is looked up; an unknown name is ``UnknownFormatError``, wherever it came from).
The job body receives the value, so nothing downstream looks the format up again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..formats.registry import FormatSpec


@dataclass(frozen=True)
class ExportRequest:
    source: Path  # resolved (symlinks, '..'), inside export.data_roots, a directory
    spec: FormatSpec  # the requested format, from formats.registry

    @property
    def fmt(self) -> str:
        return self.spec.name
