"""Durable file operations: atomic replace, fsync of directories, bounded JSON (Lines), and the
disk-full / I/O-error mapping every writer shares."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from . import jsonbound
from .errors import StorageError

#: errnos that mean "the storage failed", not "the program is wrong": reported as StorageError.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


def free_bytes(path: Path | str) -> int:
    """Bytes available to this user on the filesystem holding ``path`` (its nearest existing
    ancestor); -1 when even that cannot be asked."""
    p = Path(os.path.abspath(path))
    for anc in (p, *p.parents):
        try:
            st = os.statvfs(anc)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return -1


def _mib(n: int) -> str:
    """A size for a message: MiB, or KiB below one MiB (a small need is not "0.0 MiB")."""
    if n < 0:
        return "unknown"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def storage_error(path: Path | str, exc: OSError, what: str = "writing", need: int = -1) -> StorageError:
    """``exc`` (ENOSPC, EIO ...) as a StorageError naming the path, the free space and, when the
    caller knows it (``need`` >= 0), a lower bound of what the work needs."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else path  # the exact file, if known
    needs = f", at least {_mib(need)} needed" if need >= 0 else ""
    err = StorageError(f"{what} {where} failed: {reason} ({_mib(free_bytes(where))} free there{needs})")
    err.errno, err.where, err.what, err.need = exc.errno, str(where), what, need
    return err


def is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and not isinstance(exc, StorageError) and exc.errno in STORAGE_ERRNOS


@contextlib.contextmanager
def storage_guard(path: Path | str, what: str = "writing", need: Callable[[], int] | None = None) -> Iterator[None]:
    """Turn a disk-full or I/O error inside the block into a StorageError naming ``path``
    (and ``need()``, at least the bytes the block had to write, asked only on a failure)."""
    try:
        yield
    except StorageError as exc:  # raised deeper (an atomic write): add what this block needs
        if need is None or exc.need >= 0:
            raise
        raise storage_error(exc.where or path, exc, exc.what, need()) from exc
    except OSError as exc:
        if is_storage_error(exc):
            raise storage_error(path, exc, what, need() if need is not None else -1) from exc
        raise


def require_free(path: Path | str, need: int, what: str) -> None:
    """Refuse (StorageError) before writing ``need`` bytes under ``path`` when they do not fit."""
    free = free_bytes(path)
    if 0 <= free < need:
        err = StorageError(f"{what}: needs about {_mib(need)} under {path}, only {_mib(free)} free there; "
                           f"free some space and start again")
        err.errno = errno.ENOSPC
        raise err


def fsync_dir(path: Path) -> None:
    """Flush a directory entry so a rename inside it survives power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_filesystem(path: Path) -> None:
    """Everything written on ``path``'s file system made durable by one syncfs(2) (os.sync where
    there is none): a staged tree of thousands of files costs one journal commit, where an
    fsync of each file cost one commit per file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        syncfs = getattr(_libc(), "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


@functools.cache
def _libc() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


#: Mode of every file we write (data and meta alike): mkstemp's 0600 would make meta files
#: unreadable to the consumers that can read the data files beside them.
FILE_MODE = 0o644


def set_file_mode(fd_or_path: int | Path) -> None:
    """Give a written file the common FILE_MODE (by descriptor or by path)."""
    if isinstance(fd_or_path, int):
        os.fchmod(fd_or_path, FILE_MODE)
    else:
        os.chmod(fd_or_path, FILE_MODE)


def atomic_write_bytes(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data``: readers see the old or the new file, never a mix."""
    atomic_write_with(path, lambda fh: fh.write(data), mode)


def atomic_write_with(path: Path, fill: Callable[[BinaryIO], object], mode: int = FILE_MODE) -> None:
    """Replace ``path`` with what ``fill`` writes to the new file (streamed: e.g. a spool
    copied in), by rename after an fsync: readers see the old or the new file, never a mix."""
    with storage_guard(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, mode: int = FILE_MODE) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def dumps_json(obj: object) -> str:
    return json.dumps(obj, indent=4, ensure_ascii=False) + "\n"


def atomic_write_json(path: Path, obj: object, mode: int = FILE_MODE) -> None:
    atomic_write_text(path, dumps_json(obj), mode)


def read_json(path: Path) -> Any:
    """One JSON document, bounded (jsonbound): ValueError("line N: ...") for any fault of the
    content, OSError when the file cannot be read. Callers add the path."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        # read(n) allocates n bytes up front: ask for the file's size, not the 64 MiB bound
        size = st.st_size if stat.S_ISREG(st.st_mode) else jsonbound.MAX_BYTES
        data = fh.read(min(size, jsonbound.MAX_BYTES) + 1)
    return jsonbound.loads(jsonbound.decode(data))


def jsonl_dumps(rows: Iterable[dict[str, object]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def atomic_write_jsonl(path: Path, rows: Iterable[dict[str, object]]) -> None:
    atomic_write_text(path, jsonl_dumps(rows))


def iter_jsonl(path: Path) -> Iterator[dict[str, object]]:
    """Yield the JSON objects of a JSON Lines file; ValueError("path:line: ...") on any fault
    (not UTF-8, too long, too deep, a number out of range, not an object)."""
    for _lineno, obj in iter_jsonl_lines(path):
        yield obj


def iter_jsonl_lines(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """``iter_jsonl`` with each object's line number."""
    for lineno, _offset, _length, obj in iter_jsonl_spans(path):
        yield lineno, obj


#: JSON Lines files whose lines are rows of a few hundred bytes (statistics rows may be long).
ROW_FILES = ("episodes.jsonl", "tasks.jsonl", "eva_quality.jsonl")


def line_limit(path: Path) -> int:
    """Longest line accepted in a JSON Lines file: ROW_MAX_BYTES for row files, else MAX_BYTES."""
    return jsonbound.ROW_MAX_BYTES if Path(path).name in ROW_FILES else jsonbound.MAX_BYTES


def iter_jsonl_spans(path: Path, fh: BinaryIO | None = None,
                     limit: int | None = None) -> Iterator[tuple[int, int, int, dict[str, object]]]:
    """``iter_jsonl_lines`` with each line's byte offset and length, so a reader can keep where
    a row is and parse it again later (``jsonl_object``) instead of holding every object.
    ``fh``: the file already open (read from its start); ``path`` then only names it.
    A line over ``limit`` (default ``line_limit``) or more than BLANK_LINES_MAX blank lines:
    ValueError naming the line."""
    limit = line_limit(path) if limit is None else min(limit, jsonbound.MAX_BYTES)
    with contextlib.nullcontext(fh) if fh is not None else open(path, "rb") as f:
        lineno = offset = blank = 0
        while raw := f.readline(limit + 1):  # bounded: a 1 GB line is not read whole
            lineno += 1
            obj = jsonl_object(path, raw, lineno, limit)
            if obj is not None:
                yield lineno, offset, len(raw), obj
            else:
                blank += 1
                if blank > jsonbound.BLANK_LINES_MAX:
                    raise ValueError(f"{path}:{lineno}: more than {jsonbound.BLANK_LINES_MAX} blank lines")
            offset += len(raw)


def jsonl_object(path: Path, raw: bytes, lineno: int, limit: int = jsonbound.MAX_BYTES) -> dict[str, object] | None:
    """One line's object (None for a blank line); ValueError naming ``path:line``."""
    try:
        if len(raw) > limit:
            raise ValueError(f"line {lineno}: longer than {limit} bytes")
        line = jsonbound.decode(raw, lineno).strip()
        if not line:
            return None
        if limit <= jsonbound.ROW_MAX_BYTES and line.count(":") > jsonbound.ROW_KEYS_MAX:  # a row file's line
            raise ValueError(f"line {lineno}: more than {jsonbound.ROW_KEYS_MAX} keys")
        obj = jsonbound.loads(line, lineno)
    except ValueError as exc:
        raise ValueError(f"{path}:{str(exc).removeprefix('line ')}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}:{lineno}: expected a JSON object")
    return obj


def tree_size(root: Path) -> tuple[int, int]:
    """Return (files, bytes) of every file under ``root``; a file removed while the walk runs
    (a staging tree in use) is left out."""
    files = 0
    size = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            files += 1
    return files, size


class LockHeld(Exception):
    """Another holder has the lock; ``holder`` is the pid it wrote ("unknown" if none)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by process {holder}")
        self.holder = holder


def take_lock(path: Path, per_process: bool = False) -> int:
    """Open (create) ``path``, lock it exclusively without waiting, write this pid; return the fd.

    ``per_process``: a POSIX record lock, shared by the process's threads (writers within one
    process do not conflict); else flock, which belongs to the open file, so a second taker in
    the same process is refused too. The kernel drops either when the process dies: no stale
    lock after a crash. Raises LockHeld when another holds it; close the fd to release.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if per_process:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeld(path, holder) from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
