"""The content manifest of a published subset: ``meta/manifest.json``.

Every file of the subset (except the manifest itself) is listed with its relative POSIX path,
its size and its SHA-256. The upload resumes and verifies against it, and the receiver of an
upload can check what arrived with it.

Why JSON and not a ``sha256sum``-style text file: the subset's other records (info.json,
quality_split.json) are JSON already, so one reader serves all of them; a JSON record carries
its own version and the sizes (a size check is cheap and catches a truncated file before any
hashing); and paths need no escaping rules (``sha256sum`` escapes backslashes and newlines
in names with a leading ``\\``, which receivers often get wrong). The digest of the manifest
file's bytes names one exact version of the subset (the upload's remote staging name uses it).

The manifest is written once, over the staged subset just before publication (its files were
just written, so the read is served from the page cache); hashing inside every format writer
would need the same change in each of them. ``write_manifest`` streams: entries go to a spool
file as they are hashed and the manifest is assembled from it, so a subset of 10,000 episodes
does not hold 30,000 entries (and their JSON) in memory; ``build_manifest`` is the in-memory
form the readers and tests use, and writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .fsutil import atomic_write_bytes, atomic_write_with, read_json
from .jsonbound import as_dict, as_int, as_list, as_str

MANIFEST_FILE = "meta/manifest.json"
MANIFEST_VERSION = 1
HASH_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)  # one per file of a subset: no per-entry __dict__
class ManifestEntry:
    """One file of the subset."""

    path: str  # POSIX path relative to the subset root
    size: int
    sha256: str  # lowercase hex

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: object) -> ManifestEntry:
        d = as_dict(d, "a manifest entry")
        path, size, digest = as_str(d["path"], "a manifest path"), d["size"], d["sha256"]
        if not _safe_rel(path):
            raise ValueError(f"manifest path {path!r} is not a plain relative path")
        size = as_int(size, f"manifest size of {path[:200]}", 0)
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"manifest sha256 of {path} is not 64 lowercase hex digits")
        return cls(path, size, digest)


@dataclass(frozen=True)
class Manifest:
    """Every file of a subset, sorted by path; ``directories`` keeps empty ones too."""

    files: tuple[ManifestEntry, ...]
    directories: tuple[str, ...] = ()  # every directory, relative, parents first
    version: int = MANIFEST_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)

    def by_path(self) -> dict[str, ManifestEntry]:
        return {e.path: e for e in self.files}

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "algorithm": "sha256",
                "directories": list(self.directories),
                "files": [e.to_dict() for e in self.files]}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Manifest:
        if not isinstance(d, dict) or d.get("version") != MANIFEST_VERSION or d.get("algorithm") != "sha256":
            raise ValueError(f"not a version {MANIFEST_VERSION} sha256 manifest")
        files = tuple(ManifestEntry.from_dict(e) for e in as_list(d.get("files", []), "manifest files"))
        dirs = tuple(as_str(x, "a manifest directory") for x in as_list(d.get("directories", []), "directories"))
        if any(not _safe_rel(x) for x in dirs):
            raise ValueError("manifest directories must be plain relative paths")
        if len({e.path for e in files}) != len(files):
            raise ValueError("manifest lists a path twice")
        return cls(files, dirs)

    @classmethod
    def read(cls, subset_dir: Path) -> Manifest:
        path = Path(subset_dir) / MANIFEST_FILE
        try:
            return cls.from_dict(read_json(path))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None

    def write(self, subset_dir: Path) -> bytes:
        """Write ``meta/manifest.json`` atomically; return the bytes written."""
        data = self.to_bytes()
        atomic_write_bytes(Path(subset_dir) / MANIFEST_FILE, data)
        return data


def _safe_rel(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts) \
        and "\0" not in path


def sha256_file(path: Path, limit: int | None = None) -> str:
    """SHA-256 of a file, or of its first ``limit`` bytes."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as fh:
        while left is None or left > 0:
            chunk = fh.read(HASH_CHUNK if left is None else min(HASH_CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


# (device, inode, size, mtime_ns) packed -> the sha256 as its 32 bytes (a tuple of
# four ints and a 64-character str were ~300 bytes per episode file held until the manifest)
_WRITTEN: dict[bytes, bytes | str] = {}
_WRITTEN_MAX = 100_000  # a long-running node: the oldest records (of jobs that never published) go
_KEY = struct.Struct("<QQQq")


def _written_key(path: Path) -> bytes:
    st = os.stat(path)
    return _KEY.pack(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _packed(sha256: str) -> bytes | str:
    """The digest as bytes when its lowercase hex gives it back exactly, else the text as is."""
    try:
        raw = bytes.fromhex(sha256)
    except ValueError:
        return sha256
    return raw if raw.hex() == sha256 else sha256


def _text(value: bytes | str | None) -> str | None:
    return value.hex() if isinstance(value, bytes) else value


def record_written(path: Path, sha256: str) -> None:
    """An exporter hashed ``path``'s bytes as it wrote them: ``build_manifest`` takes this
    digest (once) instead of reading the file again, while (device, inode, size, mtime_ns) match."""
    _WRITTEN[_written_key(path)] = _packed(sha256)
    while len(_WRITTEN) > _WRITTEN_MAX:
        del _WRITTEN[next(iter(_WRITTEN))]


def record_hashed(path: Path, before: os.stat_result, sha256: str) -> None:
    """``record_written`` for a file hashed after the stat ``before``: only while the file is
    still the one stated then (unchanged during the hash)."""
    if _written_key(path) == _KEY.pack(before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns):
        record_written(path, sha256)


def recorded_digest(path: Path) -> str | None:
    """The digest ``record_written`` holds for ``path`` as it is now, or None."""
    return _text(_WRITTEN.get(_written_key(path)))


def written_digest(path: Path) -> str:
    """The digest recorded while ``path`` was written (taken), else the file hashed."""
    return _text(_WRITTEN.pop(_written_key(path), None)) or sha256_file(path)


def walk_tree(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative POSIX path, path, stat) of every directory (parents first, ``root`` itself
    not) and regular file of ``root``, sorted; anything else is refused."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)  # normalised, "/"-separated on POSIX
        here = Path(dirpath)
        if rel_dir != ".":
            yield rel_dir, here, os.stat(dirpath)
        prefix = "" if rel_dir == "." else rel_dir + "/"
        for name in sorted(filenames):
            # joined as strings: two pathlib parses per file were most of the walk's cost
            st = os.stat(os.path.join(dirpath, name))
            p = here / name
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{p} is not a regular file; a subset holds only files and directories")
            yield prefix + name, p, st


def scan_tree(root: Path) -> tuple[list[str], list[tuple[str, Path]]]:
    """Directories and regular files (relative POSIX path, path) of ``root``, sorted."""
    dirs: list[str] = []
    files: list[tuple[str, Path]] = []
    for rel, p, st in walk_tree(root):
        (dirs.append(rel) if stat.S_ISDIR(st.st_mode) else files.append((rel, p)))
    return dirs, files


def _entries(root: Path, hash_file: Callable[[Path], str] | None,
             dirs: list[str]) -> Iterator[ManifestEntry]:
    """The manifest's files in order, hashed one at a time; directories appended to ``dirs``."""
    digest = hash_file or written_digest
    for rel, p, st in walk_tree(root):
        if stat.S_ISDIR(st.st_mode):
            dirs.append(rel)
        elif rel != MANIFEST_FILE:
            yield ManifestEntry(rel, st.st_size, digest(p))


def build_manifest(subset_dir: Path, hash_file: Callable[[Path], str] | None = None) -> Manifest:
    """Hash every file of ``subset_dir`` except an existing manifest. ``hash_file``: the export
    job passes one that answers a hard-linked source file from its facts index."""
    dirs: list[str] = []
    files = tuple(_entries(Path(subset_dir), hash_file, dirs))
    return Manifest(files, tuple(dirs))


def _entry_json(e: ManifestEntry) -> str:
    # exactly json.dumps(e.to_dict(), indent=1) one level down, as Manifest.to_bytes lays it out
    return (f'  {{\n   "path": {json.dumps(e.path, ensure_ascii=False)},\n   "size": {e.size},'
            f'\n   "sha256": "{e.sha256}"\n  }}')


def write_manifest(subset_dir: Path, hash_file: Callable[[Path], str] | None = None) -> None:
    """Write ``meta/manifest.json`` for a finished (staged) subset, byte for byte what
    ``build_manifest(...).write`` writes, streamed: each entry goes to a spool file as it is
    hashed, so memory does not grow with the file count; the manifest replaces
    the old one by rename."""
    root = Path(subset_dir)
    dirs: list[str] = []
    with tempfile.TemporaryFile("w+b") as spool:  # outside the tree being walked
        count = 0
        for e in _entries(root, hash_file, dirs):
            spool.write(((",\n" if count else "") + _entry_json(e)).encode("utf-8"))
            count += 1
        spool.seek(0)
        head = {"version": MANIFEST_VERSION, "algorithm": "sha256", "directories": dirs}
        text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # without the closing "\n}"

        def fill(fh: BinaryIO) -> None:
            fh.write((text + (',\n "files": [\n' if count else ',\n "files": []')).encode("utf-8"))
            shutil.copyfileobj(spool, fh)
            fh.write(b"\n ]\n}\n" if count else b"\n}\n")

        atomic_write_with(root / MANIFEST_FILE, fill)


def manifest_digest(data: bytes) -> str:
    """Names one version of a subset: the SHA-256 of its manifest file's bytes."""
    return hashlib.sha256(data).hexdigest()


def verify_manifest(subset_dir: Path, required: bool = True) -> list[str]:
    """Problems found comparing ``subset_dir`` with its manifest (empty: it matches).

    Checks that the manifest is readable, that every listed file exists with its size and
    SHA-256, and that no unlisted file is present. With ``required=False`` a subset without
    a manifest (written by an exporter directly, or before manifests existed) passes.
    """
    root = Path(subset_dir)
    try:
        manifest = Manifest.read(root)
    except FileNotFoundError:
        return [f"{MANIFEST_FILE} is missing"] if required else []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST_FILE} is unreadable: {exc}"]
    problems: list[str] = []
    try:
        _dirs, files = scan_tree(root)
    except (OSError, ValueError) as exc:
        return [f"cannot list {root}: {exc}"]
    present = {rel: p for rel, p in files if rel != MANIFEST_FILE}
    for entry in manifest.files:
        p = present.pop(entry.path, None)
        if p is None:
            problems.append(f"{entry.path}: listed in {MANIFEST_FILE} but missing")
            continue
        size = p.stat().st_size
        if size != entry.size:
            problems.append(f"{entry.path}: {size} bytes, {MANIFEST_FILE} says {entry.size}")
        elif sha256_file(p) != entry.sha256:
            problems.append(f"{entry.path}: SHA-256 differs from {MANIFEST_FILE} (content changed or corrupt)")
    for rel in sorted(present):
        problems.append(f"{rel}: not listed in {MANIFEST_FILE}")
    return problems
