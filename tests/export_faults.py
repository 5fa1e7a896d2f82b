"""An export service with a fault plan armed (eva_export/export/faults.py, the one seam)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eva_export.config import Config
from eva_export.export.faults import FaultPlan, injected
from eva_export.export.runner import ExportService


def faulty_service(config: Config, *, fail_at: str | None = None,
                   exporters: dict[str, Callable[[], Any]] | None = None, **kw: Any) -> ExportService:
    """``ExportService(config, **kw)`` that breaks at ``fail_at`` and uses ``exporters``."""
    with injected(FaultPlan(fail_at, dict(exporters or {}))):
        return ExportService(config, **kw)
