"""The eva_store training format: its exporter and verifier, typed records, image codecs and the random-access reader.

``open_store(path)`` is the entry point for training code; it needs NumPy, zarr, msgpack and
simplejpeg (and PyAV only for PNG frames), never torch.
"""

from __future__ import annotations

from .reader import Store, StoreError, StoreView, open_store

__all__ = ["Store", "StoreError", "StoreView", "open_store"]
