"""Which source module reads a dataset: the kind from its info.json, then that kind's module
(imported on first use). Apart from base.py so the kind modules, which build on base, are
never imported by it."""

from __future__ import annotations

from pathlib import Path

from .. import confine
from ..dataset.meta import INFO
from ..dataset.validate import SourceCheck
from ..errors import DatasetError
from ..fsutil import read_json
from .base import KIND_OF_CODEBASE, Source, SourceKind


def detect_kind(root: Path) -> SourceKind:
    """The kind of the dataset at ``root``, from meta/info.json's codebase_version."""
    path = Path(root) / INFO
    if not path.is_file():
        return SourceKind.LEROBOT_V21  # its validation reports the missing files
    try:
        raw = read_json(confine.confined(Path(root), INFO, "meta file"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc})") from exc
    version = raw.get("codebase_version") if isinstance(raw, dict) else None
    return KIND_OF_CODEBASE.get(str(version), SourceKind.LEROBOT_V21)


def get_source(kind: SourceKind) -> Source:
    """The source implementation of ``kind`` (its module imported on first use)."""
    if kind == SourceKind.LEROBOT_V30:
        from .lerobot_v30 import V30Source
        return V30Source()
    if kind == SourceKind.LEROBOT_V20:
        from .lerobot_v20 import V20Source
        return V20Source()
    from .lerobot_v21 import V21Source
    return V21Source()


def open_source(root: Path) -> Source:
    return get_source(detect_kind(root))


def validate_any(root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
    """Validate ``root`` as an export source of whatever kind it is."""
    return open_source(root).validate(Path(root), allow_empty_dataset=allow_empty_dataset)
