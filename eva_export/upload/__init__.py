"""Upload of the current accepted export: the gate, backends (SFTP) and upload jobs."""

from ..jobs import ServiceStatus
from .gate import check_upload, publish_name
from .runner import UploadService
from .sftp import SftpBackend, UploadBackend, UploadResult, backend_for

__all__ = [
    "ServiceStatus",
    "SftpBackend",
    "UploadBackend",
    "UploadResult",
    "UploadService",
    "backend_for",
    "check_upload",
    "publish_name",
]
