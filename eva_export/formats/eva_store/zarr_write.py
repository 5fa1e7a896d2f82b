"""A shard's numeric columns written as a Zarr v3 group, file by file.

zarr's own API costs ~2-3 ms of Python per array (each call hops to its event-loop thread),
which made the numeric columns the largest part of a short episode's shard. The layout of a
plain array is small and fixed, so it is written here directly: ``zarr.json`` as zarr writes it
(regular chunk grid, "/" chunk keys, codecs ``bytes`` little-endian then ``zstd`` level 0) and
every chunk, the last one padded to the chunk shape with the fill value as zarr pads it. Every
chunk is written, a chunk of fill values too (zarr may leave those out; either reads the same).
The store's reader and verifier read these arrays back through zarr itself.

Each file's bytes are returned with its path, so the shard's record can carry their digests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numcodecs import Zstd
from numpy.typing import NDArray

_ZSTD = Zstd(level=0, checksum=False)  # zarr's ZstdCodec default
_GROUP = {"attributes": {}, "zarr_format": 3, "node_type": "group"}
_NAMES = {"b": "bool", "i": "int", "u": "uint", "f": "float"}


def data_type(dtype: np.dtype[np.generic]) -> str:
    """The Zarr v3 data type name of a numeric NumPy dtype (ValueError for any other)."""
    kind = _NAMES.get(dtype.kind)
    if kind is None or (kind == "float" and dtype.itemsize not in (2, 4, 8)):
        raise ValueError(f"dtype {dtype} has no Zarr v3 numeric data type")
    return kind if kind == "bool" else f"{kind}{dtype.itemsize * 8}"


def check_name(name: str) -> None:
    """An array name that is one plain directory of the group (Zarr v3 reserves "__" names)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or name.startswith("__"):
        raise ValueError(f"column name {name!r} cannot name a Zarr array (one plain path component)")


def group_files() -> Iterator[tuple[str, bytes]]:
    """The group's own ``zarr.json`` (relative path, bytes)."""
    yield "zarr.json", json.dumps(_GROUP, indent=2).encode()


def array_files(name: str, arr: NDArray[np.generic], chunk_rows: int) -> Iterator[tuple[str, bytes]]:
    """(path relative to the group, bytes) of array ``name``: its zarr.json, then its chunks.
    Chunks span ``chunk_rows`` rows (fewer when the array is shorter) and the whole of every
    other dimension."""
    check_name(name)
    dtype = data_type(arr.dtype)
    shape = tuple(int(s) for s in arr.shape)
    rows = max(1, min(shape[0], chunk_rows))
    chunk = (rows,) + shape[1:]
    fill: bool | int | float = False if dtype == "bool" else 0.0 if dtype.startswith("float") else 0
    meta = {"shape": list(shape), "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": fill,
            "codecs": [_bytes_codec(arr.dtype.itemsize), {"name": "zstd", "configuration": {"level": 0, "checksum": False}}],
            "attributes": {}, "zarr_format": 3, "node_type": "array", "storage_transformers": []}
    yield f"{name}/zarr.json", json.dumps(meta, indent=2).encode()
    little = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    tail = "/0" * (len(shape) - 1)
    for n, start in enumerate(range(0, shape[0], rows)):
        block = little[start:start + rows]
        if len(block) < rows:  # the edge chunk, padded as zarr pads it
            pad = np.zeros(chunk, dtype=little.dtype)
            pad[:len(block)] = block
            block = pad
        yield f"{name}/c/{n}{tail}", bytes(_ZSTD.encode(block.tobytes()))


def _bytes_codec(itemsize: int) -> dict[str, object]:
    """zarr states no byte order for one-byte types."""
    return {"name": "bytes"} if itemsize == 1 else {"name": "bytes", "configuration": {"endian": "little"}}


def write_files(root: Path, files: Iterator[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    """Each (relative path, bytes) written under ``root``, and handed on."""
    for rel, data in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        yield rel, data
