"""The upload backends: one ``BackendSpec`` each, chosen by its section under collection.storage.

A backend is a module with a factory ``(StorageSection) -> UploadBackend`` that parses and
checks its own section; ``BACKENDS`` is read when a service is built (no copies), so adding
a backend = its module + one ``BackendSpec`` line below (see docs/architecture-extending.md).

This module stays light: a backend's module (paramiko for SFTP) is imported only when an
upload service is built from a config that names it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..config import CollectionConfig, StorageSection
from ..errors import ConfigError
from .job import UploadBackend


@dataclass(frozen=True)
class BackendSpec:
    """One upload backend: the storage section that selects it and where its factory lives."""

    name: str  # its section: collection.storage.<name>
    factory: str  # "module:function" inside eva_export.upload (or "pkg.module:function")
    description: str  # one line, for docs and messages

    def load(self) -> Callable[[StorageSection], UploadBackend]:
        """The factory (imports its module, and with it the backend's libraries)."""
        module, fn_name = self.factory.split(":")
        qualified = module if "." in module else f"{__package__}.{module}"
        fn: Callable[[StorageSection], UploadBackend] = getattr(importlib.import_module(qualified), fn_name)
        return fn

    def make(self, section: StorageSection) -> UploadBackend:
        """The backend configured by ``section`` (its factory checks the values)."""
        return self.load()(section)


BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec("sftp", "sftp:from_section", "SFTP with pinned host keys, staged and published by one rename"),
)


def backend_names() -> list[str]:
    return [b.name for b in BACKENDS]


def get_backend_spec(name: str) -> BackendSpec:
    """The backend registered as ``name``; ConfigError names the section and the valid names."""
    for spec in BACKENDS:
        if spec.name == name:
            return spec
    raise ConfigError(f"collection.storage.{name}: no upload backend is registered as {name!r}; "
                      f"registered backends: {', '.join(backend_names())}")


def configured_section(collection: CollectionConfig) -> StorageSection | None:
    """The one storage section of ``collection`` (None: no upload backend is configured)."""
    sections = collection.storage
    for section in sections:
        get_backend_spec(section.name)  # an unknown section is refused, never ignored
    if len(sections) > 1:
        raise ConfigError(f"collection.storage configures {len(sections)} upload backends "
                          f"({', '.join(s.name for s in sections)}); configure one")
    return sections[0] if sections else None


def backend_for(collection: CollectionConfig) -> UploadBackend | None:
    """The upload backend ``collection`` configures, or None when it configures none."""
    section = configured_section(collection)
    return None if section is None else get_backend_spec(section.name).make(section)
