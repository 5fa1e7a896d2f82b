"""Confinement of every path that comes from a request or from a dataset's metadata.

Anyone on the ROS graph can call the services and datasets arrive from other machines, so
names, job ids, path templates and the files they resolve to are untrusted. The rules:

* names (dataset names, job ids, video keys used in paths) match a strict pattern and a length
  limit far below the filesystem's 255 bytes, so no request can make ``open`` raise
  ``ENAMETOOLONG`` or leave its directory;
* ``data_path`` / ``video_path`` templates from info.json are relative, free of ``..`` and of
  empty components, use only the placeholders of the LeRobot v2.1 / v3 template shapes and end
  with ``.parquet`` / ``.mp4``;
* every file resolved from a dataset (after symlinks) lies inside the dataset directory, and
  every dataset directory (after symlinks) lies inside its root;
* a review note is capped at ``NOTE_MAX_BYTES``.

Every refusal is an ``UnsafeNameError`` (a ``ConfigError``) with a short reason.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import stat
import string
from collections.abc import Iterator, Sequence
from pathlib import Path

from .errors import ConfigError, UnsafeNameError

#: Longest dataset name accepted (characters; the pattern is ASCII, so also bytes).
NAME_MAX = 100
#: Longest job id accepted.
JOB_ID_MAX = 64
#: Longest review note stored, in UTF-8 bytes.
NOTE_MAX_BYTES = 4096
#: Longest path template accepted from info.json.
TEMPLATE_MAX = 200

#: File suffixes a data_path may have: Parquet (LeRobot), and the HDF5 / MCAP exports' files.
DATA_SUFFIXES = (".parquet", ".hdf5", ".mcap")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# A feature key that becomes a path component ({video_key}): LeRobot uses dotted names.
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_LITERAL_RE = re.compile(r"[A-Za-z0-9._/-]*")
_SPEC_RE = re.compile(r"0?[1-9]?d|")

# Placeholders each template shape may use; the first set in each tuple is required.
_V21_DATA = ({"episode_index"}, {"episode_chunk", "episode_index"})
_V21_VIDEO = ({"episode_index", "video_key"}, {"episode_chunk", "episode_index", "video_key"})
_V3_DATA = ({"file_index"}, {"chunk_index", "file_index"})
_V3_VIDEO = ({"file_index", "video_key"}, {"chunk_index", "file_index", "video_key"})


def short_repr(value: str, limit: int = 40) -> str:
    """A value as it may appear in a reply: repr'd and cut (never echo 10 KB back)."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "...'"


def check_name(name: str, what: str = "dataset name") -> str:
    """A dataset (or task) name: ASCII letters, digits, ``._-``, not starting with ``.``."""
    if not isinstance(name, str) or not name:
        raise UnsafeNameError(f"{what} must be a non-empty string")
    if len(name) > NAME_MAX:
        raise UnsafeNameError(f"{what} is {len(name)} characters long; at most {NAME_MAX} are allowed")
    if not _NAME_RE.fullmatch(name):
        raise UnsafeNameError(f"{what} {short_repr(name)} is refused: use only ASCII letters, digits, '.', '_' "
                              f"and '-', not starting with '.' (no path separators, '..' or absolute paths)")
    return name


def check_job_id(job_id: str) -> str:
    """A job id: the shape ``Job.new`` produces (letters, digits, ``_-``), at most 64 chars."""
    if not isinstance(job_id, str) or not job_id:
        raise UnsafeNameError("job id must be a non-empty string")
    if len(job_id) > JOB_ID_MAX or not _JOB_ID_RE.fullmatch(job_id):
        raise UnsafeNameError(f"job id {short_repr(job_id)} is not a valid job id")
    return job_id


def check_key(key: str, what: str = "feature key") -> str:
    """A feature key that is substituted into a path (``{video_key}``)."""
    if not isinstance(key, str) or len(key) > NAME_MAX or not _KEY_RE.fullmatch(key) or ".." in key:
        raise UnsafeNameError(f"{what} {short_repr(key)} cannot be used in a file path")
    return key


def check_note(note: str) -> str:
    """A review note: at most NOTE_MAX_BYTES of UTF-8 (refused, not silently cut)."""
    size = len(note.encode("utf-8", errors="surrogatepass"))
    if size > NOTE_MAX_BYTES:
        raise UnsafeNameError(f"note is {size} bytes; at most {NOTE_MAX_BYTES} bytes (4 KiB) are stored")
    return note


def check_template(template: object, kind: str, what: str = "info.json") -> str:
    """``_check_template`` remembered: a pure check of three strings, asked once per path of
    every episode; a refusal is never remembered, so it raises every time."""
    if not isinstance(template, str):
        return _check_template(template, kind, what)
    return _template_ok(template, kind, what)


@functools.lru_cache(maxsize=256)
def _template_ok(template: str, kind: str, what: str) -> str:
    return _check_template(template, kind, what)


def _check_template(template: object, kind: str, what: str = "info.json") -> str:
    """A ``data_path`` (kind ``data``) or ``video_path`` (kind ``video``) template.

    Relative, no ``..`` / ``.`` / empty components, at most TEMPLATE_MAX characters, only the
    placeholders of the v2.1 (``episode_chunk``, ``episode_index``) or v3 (``chunk_index``,
    ``file_index``) shapes with integer format specs, first component ``data`` / ``videos``
    and the suffix ``.parquet`` / ``.mp4``.
    """
    field = f"{kind}_path"
    if not isinstance(template, str) or not template:
        raise UnsafeNameError(f"{what}: {field} must be a non-empty string")
    if len(template) > TEMPLATE_MAX:
        raise UnsafeNameError(f"{what}: {field} is longer than {TEMPLATE_MAX} characters")
    if template.startswith("/") or "\\" in template:
        raise UnsafeNameError(f"{what}: {field} {short_repr(template, 80)} must be a relative path")
    parts = template.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeNameError(f"{what}: {field} {short_repr(template, 80)} has an empty, '.' or '..' component")
    top, suffixes = ("data", DATA_SUFFIXES) if kind == "data" else ("videos", (".mp4",))
    if parts[0] != top or not template.endswith(suffixes):
        raise UnsafeNameError(f"{what}: {field} {short_repr(template, 80)} must start with '{top}/' and end "
                              f"with {' or '.join(suffixes)}")
    fields: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise UnsafeNameError(f"{what}: {field} {short_repr(template, 80)} is not a valid template ({exc})") from exc
    for literal, name, spec, conv in parsed:
        if not _LITERAL_RE.fullmatch(literal):
            raise UnsafeNameError(f"{what}: {field} {short_repr(template, 80)} has characters outside "
                                  f"[A-Za-z0-9._/-]")
        if name is None:
            continue
        if conv or not _SPEC_RE.fullmatch(spec or "") or (name == "video_key" and spec):
            raise UnsafeNameError(f"{what}: {field} placeholder {{{name}}} has an unsupported format")
        fields.add(name)
    shapes = (_V21_DATA, _V3_DATA) if kind == "data" else (_V21_VIDEO, _V3_VIDEO)
    if not any(req <= fields <= allowed for req, allowed in shapes):
        raise UnsafeNameError(f"{what}: {field} {short_repr(template, 80)} uses placeholders {sorted(fields)}, "
                              f"which match neither the LeRobot v2.1 nor the v3 template")
    return template


def is_inside(root: Path | str, path: Path | str) -> bool:
    """True when ``path`` resolves (symlinks and '..' followed) to ``root`` or below it."""
    root_r = os.path.realpath(root)
    path_r = os.path.realpath(path)
    return path_r == root_r or path_r.startswith(root_r.rstrip("/") + "/")


def confined(root: Path, relative: str, what: str = "file") -> Path:
    """``root / relative`` after checking that it resolves inside ``root`` (symlinks followed).

    The returned path is the lexical one (it names the raw file in messages); reading it reads
    the same resolved file that was checked.
    """
    path = Path(root) / relative
    if os.path.isabs(relative) or not (_plain_below(str(root), relative) or is_inside(root, path)):
        raise UnsafeNameError(f"{what} {path} resolves outside {root} (symlink or '..'); refused")
    return path


def _plain_below(root: str, relative: str) -> bool:
    """True when ``relative`` has no '..' / '.' / empty component and none of its components
    under ``root`` is a symlink: it then resolves to realpath(root)/relative, inside ``root``.

    One lstat per component of the relative part, instead of two realpaths (an lstat of every
    component of both absolute paths): the per-episode path checks were 1.7 s of a
    1000-episode export. A missing component ends the walk: nothing below it exists,
    so no symlink either. Anything else (a symlink, a file with components below it, an lstat
    that fails otherwise) takes the full realpath check.
    """
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    known = _dirs_checked.get()
    here = root
    last = len(parts) - 1
    for i, part in enumerate(parts):
        here = os.path.join(here, part)
        if i < last and known is not None and here in known:
            continue  # a directory this job already found to be a real directory
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            # Nothing exists from here on, so no symlink either: the path resolves to the
            # checked prefix plus plain components, inside ``root`` (a file about to be
            # written took two realpaths per path).
            return True
        except OSError:
            return False
        if stat.S_ISLNK(mode):
            return False
        if i < last and known is not None and stat.S_ISDIR(mode):
            if len(known) >= DIRS_CHECKED_MAX:
                known.clear()
            known.add(here)
    return True


#: Bound on the directories remembered by one ``checked_dirs`` block (paths, about 100 B each).
DIRS_CHECKED_MAX = 1 << 16
_dirs_checked: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("confine_dirs_checked", default=None)


@contextlib.contextmanager
def checked_dirs() -> Iterator[None]:
    """Inside the block (one export job, one batch of units), a directory component that
    ``confined`` found to be a real directory is not lstat'ed again: 1000 episodes share
    ``data/chunk-000`` and the camera directories, and the per-component lstat of every path
    was most of the path checks' cost. The file itself is always checked. Nested
    blocks share the outer one's set."""
    if _dirs_checked.get() is not None:
        yield
        return
    token = _dirs_checked.set(set())
    try:
        yield
    finally:
        _dirs_checked.reset(token)


def confined_dir(root: Path, path: Path, what: str = "dataset directory") -> Path:
    """``path`` itself checked to resolve inside ``root`` (a symlinked ``raw`` pointing out)."""
    if not is_inside(root, path):
        raise UnsafeNameError(f"{what} {path} resolves outside {root} (symlink or '..'); refused")
    return Path(path)


def export_tree_of(path: Path) -> Path | None:
    """The export tree (``<ds>/export`` beside ``raw``, or ``S_export`` beside ``S``) holding
    ``path``, if any; also ``path`` itself when it carries ``meta/quality_split.json``."""
    real = Path(os.path.realpath(path))
    if (real / "meta" / "quality_split.json").exists():
        return real
    for anc in (real, *real.parents):
        if anc.name == "export" and (anc.parent / "raw").is_dir():
            return anc
        if anc.name.endswith("_export") and len(anc.name) > 7 and (anc.parent / anc.name[:-7]).is_dir():
            return anc
    return None


def check_is_source(path: Path) -> Path:
    """Refuse an export (a subset, a pair, anything inside an export tree) as an export source."""
    tree = export_tree_of(path)
    if tree is not None:
        raise UnsafeNameError(f"{path} is an export (inside {tree} or carrying meta/quality_split.json), "
                              f"not a source: export the raw dataset it came from instead")
    return Path(path)


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with each non-empty secret (host, user@host, key paths, remote dir) replaced."""
    for s in sorted((s for s in secrets if s and len(s) > 1), key=len, reverse=True):
        text = text.replace(s, "<redacted>")
    return text


#: Longest path component / path the filesystem accepts (Linux NAME_MAX / PATH_MAX).
COMPONENT_MAX_BYTES = 255
PATH_MAX_BYTES = 4096


def check_request_path(path: str, what: str = "source_dir") -> str:
    """A path from a request: non-empty, no NUL, every component short enough to open.

    Refused here, with a reason, instead of an ``OSError(ENAMETOOLONG)`` deeper down.
    """
    if not isinstance(path, str) or not path:
        raise UnsafeNameError(f"{what} is required")
    raw = os.fsencode(path) if "\x00" not in path else b"\x00"
    if b"\x00" in raw:
        raise UnsafeNameError(f"{what} contains a NUL byte")
    if len(raw) > PATH_MAX_BYTES or any(len(c) > COMPONENT_MAX_BYTES for c in raw.split(b"/")):
        raise UnsafeNameError(f"{what} is too long (a component over {COMPONENT_MAX_BYTES} bytes or the path "
                              f"over {PATH_MAX_BYTES} bytes)")
    return path


def inside(root: Path, path: Path) -> bool:
    """True when ``path`` resolves (symlinks and '..' followed) inside ``root``."""
    root_r = Path(os.path.realpath(root))
    path_r = Path(os.path.realpath(path))
    return path_r == root_r or root_r in path_r.parents


def resolve_in_roots(path: Path, roots: Sequence[Path], what: str, shown: str) -> Path:
    """``path`` resolved (symlinks and '..' followed), refused unless it is a directory inside
    one of ``roots``; messages call it ``what`` and show the request's text as ``shown``."""
    real = Path(os.path.realpath(path))
    if not any(inside(r, real) for r in roots):
        raise UnsafeNameError(f"{what} {shown} (resolved {real}) is outside the export data roots "
                              f"{[str(r) for r in roots]}; refused")
    if not real.is_dir():
        raise ConfigError(f"{what} {real} is not a directory")
    return real
