"""Durable file operations: atomic replace, fsync of directories, JSON Lines."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Flush a directory entry so a rename inside it survives power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, mode: int = FILE_MODE) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def dumps_json(obj: Any) -> str:
    return json.dumps(obj, indent=4, ensure_ascii=False) + "\n"


def atomic_write_json(path: Path, obj: Any, mode: int = FILE_MODE) -> None:
    atomic_write_text(path, dumps_json(obj), mode)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def jsonl_dumps(rows: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def atomic_write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, jsonl_dumps(rows))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSON Lines file, naming the line on a parse error."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            yield obj


def tree_size(root: Path) -> tuple[int, int]:
    """Return (files, bytes) of every regular file under ``root``."""
    files = 0
    size = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size
