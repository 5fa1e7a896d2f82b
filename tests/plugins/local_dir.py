"""An upload backend that lives in the tests only: a directory on the local file system.

It proves what adding a backend costs: this module (a factory that parses its own section,
``collection.storage.local_dir``, and a class with ``describe`` and ``upload``) plus one
``BackendSpec`` in the registry; the gate, the upload service, its jobs and the nodes take it
from there. Like the SFTP backend it stages into ``<root>/.<name>.staging-<digest>`` (one per
export version, so a failed upload resumes), checks every file's SHA-256 against the
manifest and publishes by one rename, never over an existing directory.

``fail_after_files`` (tests only) stops an upload after that many files were copied: the
point is one the code reaches for sure, so the resume test is deterministic.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from eva_export.config import StorageSection
from eva_export.errors import ConfigError, UploadError
from eva_export.manifest import MANIFEST_FILE, manifest_digest, sha256_file
from eva_export.upload.job import AttemptFn, ProgressFn, UploadResult, load_manifest, staging_name

NAME = "local_dir"


class LocalDirBackend:
    def __init__(self, root: Path, fail_after_files: int = 0) -> None:
        self.root = root
        self.fail_after_files = fail_after_files
        self.last: UploadResult | None = None  # what the last upload published (tests read it)

    def describe(self) -> str:
        return f"file://{self.root}"

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        if on_attempt is not None:
            on_attempt(1, "")
        manifest, manifest_bytes, _built = load_manifest(local_dir)
        staging = self.root / staging_name(name, manifest_digest(manifest_bytes))
        resumed = staging.is_dir()
        files = [(e.path, e.size, e.sha256) for e in manifest.files]
        total = sum(size for _p, size, _h in files) + len(manifest_bytes)
        done = sent = skipped = 0
        for i, (rel, size, digest) in enumerate(files):
            if self.fail_after_files and i == self.fail_after_files:
                raise UploadError(f"upload to {self.describe()} stopped after {i} files (fail_after_files); "
                                  f"the staging directory {staging} is kept")
            dst = staging / rel
            if dst.is_file() and dst.stat().st_size == size and sha256_file(dst) == digest:
                skipped += size
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local_dir / rel, dst)
                sent += size
                if sha256_file(dst) != digest:
                    raise UploadError(f"{dst} does not match its manifest entry after the copy")
            done += size
            if progress is not None:
                progress(i + 1, len(files) + 1, done, total)
        (staging / MANIFEST_FILE).parent.mkdir(parents=True, exist_ok=True)
        (staging / MANIFEST_FILE).write_bytes(manifest_bytes)
        target = self.root / name
        taken = target.exists()
        if taken:
            target = self.root / f"{name}_{time.strftime('%Y%m%dT%H%M%S')}"
        os.rename(staging, target)  # one rename publishes the whole directory
        if progress is not None:
            progress(len(files) + 1, len(files) + 1, total, total)
        self.last = UploadResult(str(target), len(files) + 1, total, taken, sent_bytes=sent, skipped_bytes=skipped,
                                 notes=(f"resumed into {staging}",) if resumed else ())
        return self.last


def from_section(section: StorageSection) -> LocalDirBackend:
    """collection.storage.local_dir: ``root`` (an existing absolute directory), ``fail_after_files``."""
    values = dict(section.values)
    unknown = set(values) - {"root", "fail_after_files"}
    if unknown:
        raise ConfigError(f"collection.storage.{NAME}: unknown keys {sorted(unknown)}")
    root = Path(str(values.get("root", "")))
    if not root.is_absolute() or not root.is_dir():
        raise ConfigError(f"collection.storage.{NAME}.root {str(root)!r} must be an existing absolute directory")
    return LocalDirBackend(root, int(values.get("fail_after_files", 0)))
