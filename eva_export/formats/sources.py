"""The source kinds: one ``SourceSpec`` each, the only place a kind is defined.

A dataset's kind is decided by what is on disk: each kind's class says whether it recognises
a directory (``recognises(root)``), asked in the order below; a directory no kind recognises
is refused with an error naming it and the registered kinds (never read as some default
kind). Apart from base.py so the kind modules, which build on base, are never imported by it.

Adding a source kind = one module with a source class (``recognises``, ``validate``,
``episode_indices``, ``locate``; see base.Source) whose episodes override what differs from
an episode owning one Parquet and one MP4 per camera (formats/common/source_rules.SourceEpisode) +
one ``SourceSpec`` line below (see docs/architecture-extending.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import DatasetError
from .common.meta import INFO
from .common.source import Source, SourceCheck, SourceKind, codebase_version


@dataclass(frozen=True)
class SourceSpec:
    """One source kind and where its class lives."""

    kind: str  # the kind's name (``Source.kind``)
    source: str  # ".module:Class" relative to eva_export.formats, or "pkg.module:Class", imported on first use

    def load(self) -> type[Source]:
        module, cls_name = self.source.split(":")
        cls: type[Source] = getattr(importlib.import_module(module, __package__), cls_name)
        return cls

    def make(self) -> Source:
        return self.load()()


SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec(SourceKind.LEROBOT_V21, ".lerobot_v21.source:V21Source"),
    SourceSpec(SourceKind.LEROBOT_V30, ".lerobot_v3.source:V30Source"),
    SourceSpec(SourceKind.LEROBOT_V20, ".lerobot_v20.source:V20Source"),
)


class UnknownSourceError(DatasetError):
    """No registered source kind recognises the directory."""


def source_kinds() -> list[str]:
    return [str(s.kind) for s in SOURCES]


def _refusal(root: Path) -> str:
    """Why nothing recognised ``root``: what is (not) on disk, and the kinds there are."""
    kinds = f"registered source kinds: {', '.join(source_kinds())}"
    if not root.is_dir():
        return f"{root} is not a directory; {kinds}"
    version = codebase_version(root)
    seen = f"{root / INFO} is missing" if version is None else f"{root / INFO}: codebase_version is {version!r}"
    return f"{seen}: no source kind recognises {root} as a dataset ({kinds})"


def detect_kind(root: Path) -> str:
    """The kind of the dataset at ``root``; UnknownSourceError names the directory otherwise."""
    root = Path(root)
    for spec in SOURCES:
        if spec.load().recognises(root):
            return spec.kind
    raise UnknownSourceError(_refusal(root))


def get_source(kind: str) -> Source:
    """The source implementation registered as ``kind`` (its module imported on first use)."""
    for spec in SOURCES:
        if spec.kind == kind:
            return spec.make()
    raise UnknownSourceError(f"unknown source kind {kind!r}; registered source kinds: {', '.join(source_kinds())}")


def open_source(root: Path) -> Source:
    return get_source(detect_kind(root))


def validate_any(root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
    """Validate ``root`` as an export source of whatever kind it is."""
    return open_source(root).validate(Path(root), allow_empty_dataset=allow_empty_dataset)
