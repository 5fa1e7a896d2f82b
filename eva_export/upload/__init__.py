"""Upload of the current accepted export: the gate, the backend registry (SFTP) and upload jobs.

The names below are imported on first use (PEP 562), so ``eva-export export`` (whose CLI
registers the ``upload`` command) never imports paramiko; an upload does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..jobs import ServiceStatus
    from .backends import BACKENDS, BackendSpec, backend_for
    from .gate import check_upload, publish_name
    from .runner import UploadService
    from .sftp import SftpBackend, UploadBackend, UploadResult

_HOMES = {
    "ServiceStatus": "eva_export.jobs",
    "check_upload": "eva_export.upload.gate",
    "publish_name": "eva_export.upload.gate",
    "UploadService": "eva_export.upload.runner",
    "SftpBackend": "eva_export.upload.sftp",
    "UploadBackend": "eva_export.upload.sftp",
    "UploadResult": "eva_export.upload.sftp",
    "backend_for": "eva_export.upload.backends",
    "BACKENDS": "eva_export.upload.backends",
    "BackendSpec": "eva_export.upload.backends",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [  # literal, for the type checker and linters (the same names as _HOMES)
    "BACKENDS",
    "BackendSpec",
    "ServiceStatus",
    "SftpBackend",
    "UploadBackend",
    "UploadResult",
    "UploadService",
    "backend_for",
    "check_upload",
    "publish_name",
]
