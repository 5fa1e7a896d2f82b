"""The eva_store training format: its exporter and verifier, typed records, image codecs and the random-access reader.

``open_store(path)`` is the entry point for training code; it needs NumPy, zarr, msgpack and
simplejpeg (and PyAV only for PNG frames), never torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reader import Store, StoreError, StoreView, open_store

__all__ = ["Store", "StoreError", "StoreView", "open_store"]


def __getattr__(name: str) -> object:
    """The reader's names, loaded on first use: the exporter and the options live in this
    package too, and a job of another format, or the config, must not load zarr and msgpack."""
    if name in __all__:
        from . import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
