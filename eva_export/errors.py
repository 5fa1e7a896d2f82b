"""One exception tree for the whole core library.

Every error names the file, episode or setting at fault and, where it helps, what to do.
"""

from __future__ import annotations


class EvaError(Exception):
    """Base class of every error raised on purpose by eva_export."""


class ConfigError(EvaError):
    """The configuration (YAML or a service request) is invalid."""


class UnsafeNameError(ConfigError):
    """A dataset name or path would escape its root directory."""


class DatasetError(EvaError):
    """A LeRobot dataset on disk is missing a file or breaks the v2.1 contract."""


class VideoError(EvaError):
    """Encoding, decoding or joining video failed, or frame counts disagree."""


class ExportError(EvaError):
    """An export job could not produce or publish its accepted/rejected pair."""


class PublicationError(ExportError):
    """Moving a staged pair into place failed (the old pair has been restored)."""


class VerificationError(EvaError):
    """An export does not match what its metadata claims."""


class UploadError(EvaError):
    """An upload was refused by the gate, or the transfer failed."""


class UploadRefused(UploadError):
    """The upload gate refused to start a job; the message says which check failed."""


class StorageError(EvaError, OSError):
    """A write failed for lack of space (ENOSPC, EDQUOT) or an I/O error (EIO): the message
    names the path and the free space. Also an OSError, so code that handled the raw error still does."""

    what: str = "writing"  # the work that failed, as the message says it
    where: str = ""  # the path it failed at
    need: int = -1  # bytes the work needed at least (-1: not known where it failed)
