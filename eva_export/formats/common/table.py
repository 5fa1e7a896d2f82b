"""Arrow schema and Parquet I/O for LeRobot tables (float32 fixed-size vectors, int64 indices)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from .records import Feature

_ARROW = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
          "bool": pa.bool_(), "string": pa.string()}


def arrow_type(feature: Feature) -> pa.DataType:
    base = _ARROW.get(feature.dtype)
    if base is None:
        raise ValueError(f"unsupported table dtype {feature.dtype!r}")
    if feature.shape == (1,):
        return base  # LeRobot stores shape-[1] features as plain scalars
    if len(feature.shape) == 1:
        return pa.list_(base, feature.shape[0])
    raise ValueError(f"unsupported table shape {feature.shape}")


def hf_features(features: dict[str, Feature]) -> dict[str, object]:
    """The 'huggingface' schema metadata LeRobot's writer adds (datasets.Features JSON)."""
    out: dict[str, object] = {}
    for key, f in features.items():
        value = {"dtype": f.dtype, "_type": "Value"}
        out[key] = value if f.shape == (1,) else {"feature": value, "length": f.shape[0], "_type": "Sequence"}
    return out


def schema(features: dict[str, Feature]) -> pa.Schema:
    table_features = {k: f for k, f in features.items() if not f.is_visual}
    fields = [pa.field(k, arrow_type(f)) for k, f in table_features.items()]
    meta = {"huggingface": json.dumps({"info": {"features": hf_features(table_features)}})}
    return pa.schema(fields, metadata=meta)


def column(values: NDArray[np.generic], typ: pa.DataType) -> pa.Array:
    if pa.types.is_fixed_size_list(typ):
        v = np.ascontiguousarray(values, dtype=typ.value_type.to_pandas_dtype())
        return pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1), type=typ.value_type), typ.list_size)
    v = np.asarray(values)
    if v.ndim == 2 and v.shape[1] == 1:
        v = v[:, 0]
    return pa.array(v.astype(typ.to_pandas_dtype(), copy=False), type=typ)


def build_table(columns: dict[str, NDArray[np.generic]], sch: pa.Schema) -> pa.Table:
    missing = [f.name for f in sch if f.name not in columns]
    if missing:
        raise ValueError(f"missing columns {missing}")
    return pa.table([column(columns[f.name], f.type) for f in sch], schema=sch)


def write_table(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


#: Parquet files up to this size are read whole and parsed in memory: pyarrow reading
#: a file hands every column chunk read to its I/O thread (six futex round trips a small table;
#: on a loaded machine each wake-up waits for a core). Larger ones stream as before.
IN_MEMORY_BYTES = 4 * 1024 * 1024


def in_memory(fh: pa.NativeFile) -> pa.NativeFile:
    """A small open file's bytes as a BufferReader (one read, parsed without the I/O thread);
    a larger one as it is."""
    size = fh.size()
    return pa.BufferReader(fh.read_buffer(size)) if size <= IN_MEMORY_BYTES else fh


@contextlib.contextmanager
def parquet_file(path: Path, data: bytes | None = None) -> Iterator[pq.ParquetFile]:
    """The Parquet file at ``path`` open for reading, a small one parsed in memory
    (``in_memory``); ``data``: its every byte, read already (validation's read-ahead)."""
    if data is not None:
        with pq.ParquetFile(pa.BufferReader(data)) as pf:
            yield pf
        return
    with pa.OSFile(str(path)) as fh, pq.ParquetFile(in_memory(fh)) as pf:
        yield pf


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file read through ``pa.OSFile``, closed when this returns.

    Not a path (pyarrow resolves a path's filesystem on every open: 3x the cost of reading a
    small file), not a Python file object (a pyarrow reader over one was a suspect of a
    teardown crash), not read_table (its dataset layer costs ms per file). A small file is
    parsed in memory without the thread pools (``in_memory``); a larger one uses them (column
    decoding in parallel, the I/O pool's pre-buffering), where they cost less than they save."""
    with pa.OSFile(str(path)) as fh:
        src = in_memory(fh)
        threads = src is fh  # not read into memory: large enough for the pools
        with pq.ParquetFile(src, pre_buffer=threads) as pf:
            return pf.read(columns=columns, use_threads=threads)


def to_numpy(col: pa.ChunkedArray | pa.Array) -> NDArray[np.generic]:
    """A column as numpy; fixed-size lists become 2-D arrays (rows, size)."""
    if isinstance(col, pa.ChunkedArray):  # not combine_chunks(): it imports pyarrow.compute (0.2 s)
        arr = (col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks) if col.num_chunks
               else pa.array([], col.type))
    else:
        arr = col
    if pa.types.is_fixed_size_list(arr.type):
        n = arr.type.list_size  # the child slice, not flatten(): it imports pyarrow.compute
        flat = (arr.flatten() if arr.null_count else arr.values.slice(arr.offset * n, len(arr) * n)).to_numpy(
            zero_copy_only=False)
        return np.asarray(flat).reshape(len(arr), arr.type.list_size)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return np.array(arr.to_pylist())
    return np.asarray(arr.to_numpy(zero_copy_only=False))
