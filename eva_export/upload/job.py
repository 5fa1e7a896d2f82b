"""What one upload is made of: its files, its state across attempts, its result and errors.

Shared by the SFTP backend's rooms (sftp.py orchestrates; connection.py, transfer.py,
bulk_openssh.py and remotefs.py do the work).
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .. import jsonbound
from ..errors import UploadError
from ..manifest import MANIFEST_FILE, Manifest, ManifestEntry, build_manifest, scan_tree
from .limiter import RateLimiter

#: ``progress(files_done, files_total, bytes_done, bytes_total)``
ProgressFn = Callable[[int, int, int, int], None]
#: ``on_attempt(attempt_number, error_of_the_previous_attempt)``
AttemptFn = Callable[[int, str], None]


STAGING_MARK = ".staging-"


class UploadCancelled(UploadError):
    """The caller stopped the upload (service shutdown); the staging directory is kept."""


class PermanentError(UploadError):
    """A failure that another attempt cannot fix."""


@dataclass(frozen=True)
class UploadResult:
    """What a backend published."""

    remote_path: str  # the published directory
    files: int
    bytes: int
    preferred_name_taken: bool  # True when ``remote_path`` is a timestamped copy name
    attempts: int = 1
    sent_bytes: int = 0  # file bytes written to the server over all attempts
    skipped_bytes: int = 0  # bytes found complete (or as a verified prefix) on the server
    verified: str = "sha256"  # "sha256": every remote file hashed; "size": sizes only
    notes: tuple[str, ...] = ()  # resumed / leftovers removed / corrupt copies re-sent


class UploadBackend(Protocol):
    """Publishes a local directory as ``name`` on some storage, all or nothing."""

    def describe(self) -> str:
        """Where uploads go, for messages (no secrets)."""
        ...

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        """Upload ``local_dir`` and publish it as ``name``; raise UploadError on failure."""
        ...


@dataclass(frozen=True)
class UploadFile:
    entry: ManifestEntry
    path: Path | None  # local file; None for the manifest itself (sent from memory)
    data: bytes | None = None

    @property
    def rel(self) -> str:
        return self.entry.path

    @property
    def size(self) -> int:
        return self.entry.size


@dataclass
class UploadJob:
    """State of one upload across its attempts."""

    local_dir: Path
    name: str
    manifest: Manifest
    files: list[UploadFile]  # the manifest's files, then the manifest itself
    staging: str
    progress: ProgressFn
    limiter: RateLimiter | None
    bulk_exe: str | None = None  # OpenSSH's sftp client, when it sends the bulk bytes
    attempt: int = 0
    sent_bytes: int = 0
    skipped_bytes: int = 0  # counted on the first attempt that looked at the server
    notes: list[str] = field(default_factory=list)
    verified_remote: set[str] = field(default_factory=set)  # hashed complete on the server
    staging_ours: bool = False  # True once an attempt of this job created or adopted it
    publishing: bool = False  # the last attempt failed while renaming
    verified_kind: str = "sha256"
    lock: threading.Lock = field(default_factory=threading.Lock)
    # live progress of the current attempt
    done_files: int = 0
    done_bytes: int = 0
    inflight: dict[str, int] = field(default_factory=dict)
    bulk_started_at: float | None = None  # time.monotonic() when OpenSSH's client got its batch
    remote_hashes: dict[str, str] = field(default_factory=dict)  # SHA-256 on the server, hashed while sending

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file_done(self, f: UploadFile, offset: int) -> None:
        """``f`` is complete on the server (it was sent from ``offset``)."""
        with self.lock:
            self.inflight.pop(f.rel, None)
            self.done_files += 1
            self.done_bytes += f.size - offset
        self.report()

    def report(self) -> None:
        with self.lock:
            args = (self.done_files, len(self.files), self.done_bytes + sum(self.inflight.values()),
                    self.total_bytes)
        self.progress(*args)


def load_manifest(local_dir: Path) -> tuple[Manifest, bytes, bool]:
    """The subset's manifest and its bytes; built here when the subset has none (older export).

    The third value is True when it was built (then it is uploaded from memory). A manifest
    whose file list or sizes disagree with the directory is refused: the directory changed
    after the export (the upload works from a snapshot, so this means something is wrong).
    """
    path = local_dir / MANIFEST_FILE
    if not path.is_file():
        built = build_manifest(local_dir)
        return built, built.to_bytes(), True
    try:
        data = path.read_bytes()
        manifest = Manifest.from_dict(jsonbound.loads(jsonbound.decode(data)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UploadError(f"{path} is unreadable ({exc}); export again") from exc
    try:
        _dirs, files = scan_tree(local_dir)
    except (OSError, ValueError) as exc:
        raise UploadError(f"cannot list {local_dir}: {exc}") from exc
    present = {rel: p.stat().st_size for rel, p in files if rel != MANIFEST_FILE}
    listed = {e.path: e.size for e in manifest.files}
    if present != listed:
        diff = sorted(set(present.items()) ^ set(listed.items()))[:3]
        raise UploadError(f"{local_dir} does not match its {MANIFEST_FILE} (first differences: {diff}); "
                          "it changed after the export: export again")
    return manifest, data, False


def staging_name(name: str, digest: str) -> str:
    """The hidden staging directory of one version (manifest digest) of an export."""
    return f".{name}{STAGING_MARK}{digest[:16]}"


def directories(job: UploadJob) -> list[str]:
    """Every remote directory to create, parents first: the manifest's (empty ones too) and
    the parents of every file (the manifest may list no directories, e.g. meta/ of itself)."""
    dirs = set(job.manifest.directories)
    for f in job.files:
        parent = posixpath.dirname(f.rel)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    return sorted(dirs, key=lambda d: (d.count("/"), d))
