"""Publishing a staged accepted/rejected pair: all or nothing, with rollback.

The pair lives in one directory, ``<export>/<format>`` (accepted/ and rejected/ inside), and is
moved as one unit, so at every instant, even under SIGKILL, the final paths show the old
complete pair, no pair, or the new complete pair; never a new accepted beside an old rejected.

Steps (each a named fault point, checked right after the step ran):

1. ``check_staged``: both staged subsets exist and carry markers of this job and format; their
   manifests are written and the staged tree is made durable (one syncfs of its file system).
2. ``backup_old``: an existing ``<export>/<format>`` is renamed to ``.backup-<format>-<job>``.
3. ``move_new``: the staged pair directory is renamed to ``<export>/<format>``.
4. ``cleanup``: the backup is removed (a failure here is logged; the new pair stands).

A failure in 2-3 moves the new pair back to staging and restores the backup. A kill between
2 and 3 leaves no pair and a backup; ``recover_pair`` (run before every export of that
format, under its lock) restores it, and removes stale backups once a pair is in place.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ExportError, PublicationError
from ..formats.common import video_facts
from ..fsutil import fsync_dir, sync_filesystem
from ..manifest import record_hashed, recorded_digest, sha256_file, walk_tree, write_manifest, written_digest
from .build import Faults
from .paths import SUBSETS, ExportPaths
from .records import QualitySplit

log = logging.getLogger(__name__)

PUBLISH_STEPS = ("check_staged", "backup_old", "move_new", "cleanup")


@contextmanager
def export_lock(paths: ExportPaths) -> Iterator[None]:
    """One export of a given export root and format at a time, across processes.

    ``flock`` is released by the kernel when the holder dies, so a killed run never blocks
    the next one.
    """
    paths.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ExportError(f"another process is exporting into {paths.pair_dir} "
                              f"(lock {paths.lock_file} is held); wait for it to finish") from exc
        yield
    finally:
        os.close(fd)


def lock_held(paths: ExportPaths) -> bool:
    """True while an export (of any process, this one too) holds ``export_lock(paths)``."""
    try:
        fd = os.open(paths.lock_file, os.O_RDWR)
    except OSError:
        return False  # no lock file: nobody ever locked this pair
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the probe's own lock
    return False


def recover_pair(paths: ExportPaths) -> list[str]:
    """Repair what a killed publication left: restore a lone backup, drop stale ones."""
    actions: list[str] = []
    backups = paths.backups()
    if not backups:
        return actions
    if not paths.pair_dir.exists():
        newest = max(backups, key=lambda p: p.stat().st_mtime_ns)
        os.rename(newest, paths.pair_dir)
        fsync_dir(paths.root)
        actions.append(f"restored {newest.name} to {paths.pair_dir} (a publication was interrupted)")
        backups = [b for b in backups if b != newest]
    for b in backups:
        shutil.rmtree(b, ignore_errors=True)
        actions.append(f"removed stale backup {b.name}")
    for a in actions:
        log.warning("%s", a)
    return actions


def check_staged(pair: Path, fmt: str, job_id: str) -> None:
    """Both subsets complete in staging, markers of this job and format, nothing else."""
    for name in SUBSETS:
        d = pair / name
        if not d.is_dir():
            raise ExportError(f"staged {name} subset {d} is missing")
        try:
            marker = QualitySplit.read(d)
        except (OSError, ValueError, TypeError) as exc:
            raise ExportError(f"staged {name} subset {d} has no readable quality_split.json: {exc}") from exc
        if marker.subset != name or marker.dataset_format != fmt or marker.job_id != job_id:
            raise ExportError(f"staged {d}: marker says subset {marker.subset}, format "
                              f"{marker.dataset_format}, job {marker.job_id}; expected {name}, {fmt}, {job_id}")
    extra = sorted(p.name for p in pair.iterdir() if p.name not in SUBSETS)
    if extra:
        raise ExportError(f"staged pair {pair} holds unexpected entries {extra}")


class _PairHashes:
    """The files of a staged pair the job wrote itself (one link each: a hard-linked source file
    is answered from the facts index), hashed on a thread of their own while the pair is
    verified, for its content manifest (manifest.record_hashed), and a syncfs of it on another
    thread: hashlib and the kernel release the interpreter, so both run beside verification,
    which is Python. The manifest hashes whatever is not recorded, and the sync before the
    publishing rename stays: this only moves work earlier."""

    def __init__(self, pair: Path) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=fn, args=(pair,), name=name, daemon=True)
                         for fn, name in ((self._hash, "pair-hashes"), (self._sync, "pair-sync"))]
        for t in self._threads:
            t.start()

    def _hash(self, pair: Path) -> None:
        try:
            for _rel, path, st in walk_tree(pair):
                if self._stop.is_set():
                    return
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and recorded_digest(path) is None:
                    record_hashed(path, st, sha256_file(path))
        except (OSError, ValueError):
            pass  # the manifest hashes what is not recorded, and names any fault itself

    @staticmethod
    def _sync(pair: Path) -> None:
        """The pair's bytes written back while it is read (the publishing sync is then short)."""
        try:
            sync_filesystem(pair)
        except OSError:
            pass  # the publishing sync reports it

    def join(self, stop: bool = False) -> None:
        if stop:
            self._stop.set()
        for t in self._threads:
            t.join()


@contextmanager
def hashed_meanwhile(pair: Path) -> Iterator[None]:
    """Hash (and sync) the staged ``pair`` beside the work of the block (its verification);
    returns once the hashing is done, or, when the block fails, once it stopped."""
    hashes = _PairHashes(pair)
    try:
        yield
    except BaseException:
        hashes.join(stop=True)
        raise
    hashes.join()


def publish_pair(paths: ExportPaths, staged_pair: Path, job_id: str, faults: Faults | None = None) -> None:
    """Move ``staged_pair`` (accepted/ + rejected/) to ``<export>/<format>`` as one unit."""
    faults = faults or Faults()
    check_staged(staged_pair, paths.fmt, job_id)
    hash_file = functools.partial(video_facts.known_sha256, compute=written_digest)  # linked source files: once
    for name in SUBSETS:  # content manifest (meta/manifest.json), hashed while the page cache is hot
        write_manifest(staged_pair / name, hash_file)
    # The staged files were written without an fsync each: one sync of the file system before
    # the rename that publishes them, so a power loss never shows a pair with lost bytes.
    sync_filesystem(staged_pair)
    faults.check("check_staged")
    backup: Path | None = None
    published = False
    try:
        if paths.pair_dir.exists():
            backup = paths.backup(job_id)
            os.rename(paths.pair_dir, backup)
            fsync_dir(paths.root)
        faults.check("backup_old")
        os.rename(staged_pair, paths.pair_dir)
        published = True
        fsync_dir(paths.root)
        faults.check("move_new")
    except BaseException as exc:
        _rollback(paths, staged_pair, backup, published)
        if isinstance(exc, ExportError):
            raise PublicationError(f"publishing {paths.pair_dir} failed ({exc}); "
                                   f"{'the old pair was restored' if backup else 'nothing was published'}") from exc
        if isinstance(exc, OSError):
            raise PublicationError(f"publishing {paths.pair_dir} failed: {exc}; "
                                   f"{'the old pair was restored' if backup else 'nothing was published'}") from exc
        raise
    try:
        faults.check("cleanup")
        if backup is not None:
            shutil.rmtree(backup)
    except (OSError, ExportError) as exc:
        log.warning("published %s, but removing the backup %s failed: %s (removed on the next export)",
                    paths.pair_dir, backup, exc)


def _rollback(paths: ExportPaths, staged_pair: Path, backup: Path | None, published: bool) -> None:
    if published and paths.pair_dir.exists():
        os.rename(paths.pair_dir, staged_pair)  # keep the new pair in staging for a rerun
    if backup is not None and backup.exists() and not paths.pair_dir.exists():
        os.rename(backup, paths.pair_dir)
    fsync_dir(paths.root)
