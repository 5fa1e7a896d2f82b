"""A snapshot of the accepted subset to upload from: hard links in ``<export>/.upload-<format>-<job>``.

An export never rewrites a file in place: a re-export builds a new pair in staging and
swaps the whole ``<export>/<format>`` directory (export/publish.py), then deletes the old
one. Hard links to the old files keep their content, so an upload that works from the
links sends exactly one version, whatever is re-exported meanwhile.

The walk holds a file descriptor of the accepted directory and links by names relative to
it, so every file comes from the same directory even if the pair is swapped mid-walk. A
swap followed by the deletion of the old pair can only make files missing, never mix
versions; the snapshot is then checked against its manifest (file list and sizes) and
taken again when it does not match. A subset without a manifest (exported before
manifests existed) gets one built in the snapshot.

A lock file beside each snapshot is held (flock) while its upload runs, so the leftovers of a
killed process are removed by the next upload of that format without touching a live one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import UploadError
from ..manifest import MANIFEST_FILE, Manifest, scan_tree, write_manifest

ATTEMPTS = 3


@dataclass
class Snapshot:
    """A held snapshot; ``close()`` removes it."""

    path: Path
    lock_path: Path
    lock_fd: int
    copied: bool  # True when hard links were impossible and the files were copied
    removed_leftovers: list[str]

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            self.lock_path.unlink(missing_ok=True)
        finally:
            os.close(self.lock_fd)


def _remove_leftovers(area: Path, prefix: str) -> list[str]:
    """Snapshots of this format whose lock no process holds (their upload was killed)."""
    removed = []
    for lock in sorted(area.glob(f"{prefix}*.lock")):
        fd = os.open(lock, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live upload
            snap = lock.with_suffix("")
            shutil.rmtree(snap, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(snap.name)
        finally:
            os.close(fd)
    for snap in area.glob(f"{prefix}*"):  # a snapshot whose lock file is gone
        if snap.is_dir() and not snap.with_name(snap.name + ".lock").exists():
            shutil.rmtree(snap, ignore_errors=True)
            removed.append(snap.name)
    return removed


def _link_tree(src_fd: int, dst: Path) -> bool:
    """Hard-link (or copy) every file below the directory ``src_fd`` into ``dst``; True if copied."""
    copied = False
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=src_fd):
        dirnames.sort()
        out = dst / dirpath
        out.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            try:
                os.link(name, out / name, src_dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as fin, open(out / name, "wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
                copied = True
    return copied


def _matches_manifest(root: Path) -> bool:
    try:
        manifest = Manifest.read(root)
        _dirs, files = scan_tree(root)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    present = {rel: p.stat().st_size for rel, p in files if rel != MANIFEST_FILE}
    return present == {e.path: e.size for e in manifest.files}


def take_snapshot(accepted: Path, area: Path, fmt: str, job_id: str) -> Snapshot:
    """Snapshot ``accepted`` into ``area/.upload-<fmt>-<job_id>``; raise UploadError if impossible."""
    prefix = f".upload-{fmt}-"
    area.mkdir(parents=True, exist_ok=True)
    removed = _remove_leftovers(area, prefix)
    path = area / f"{prefix}{job_id}"
    lock_path = area / f"{prefix}{job_id}.lock"
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    snap = Snapshot(path, lock_path, lock_fd, False, removed)
    try:
        for _ in range(ATTEMPTS):
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            try:
                src_fd = os.open(accepted, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                raise UploadError(f"cannot open {accepted}: {exc.strerror or exc}") from exc
            try:
                snap.copied = _link_tree(src_fd, path)
                deleted = os.fstat(src_fd).st_nlink == 0  # removed while we walked it
            except FileNotFoundError:
                continue  # the pair was replaced and the old one deleted mid-walk: again
            finally:
                os.close(src_fd)
            if deleted:
                continue
            if not (path / MANIFEST_FILE).exists():
                write_manifest(path)  # an export from before manifests: hash the snapshot
                return snap
            if _matches_manifest(path):
                return snap
        raise UploadError(f"{accepted} kept changing while it was snapshotted for the upload "
                          f"({ATTEMPTS} tries); wait for the running export to finish")
    except BaseException:
        snap.close()
        raise
