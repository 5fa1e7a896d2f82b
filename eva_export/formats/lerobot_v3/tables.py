"""The Parquet side of a LeRobot v3.0 export: data shards written in row groups of many
episodes, and the episode metadata gathered in typed columns as the episodes go by.

Data: one ``ParquetWriter`` per data file; episode tables wait in a bounded batch
(``ROW_GROUP_BYTES``) and are written as one row group (one episode per row group made a
1000-episode file of 1000 tiny row groups, slow to write and to read back). Memory is that
batch, whatever the episode count.

Episode metadata: locator values go into flat integer/float arrays, and each
``stats/<feature>/<stat>`` into one flat numeric array with the stat's shape (a parsed stats
row is about 30 KB of Python objects; its numbers are a few hundred bytes). The Arrow columns
and the dataset statistics are built from those arrays at the end: the same types as
``pa.array`` of the nested lists would give, the same arithmetic as ``dataset.stats.aggregate``.
A stat that is not a rectangular array of numbers in every episode keeps its values as they
are and goes through the generic path.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ..common import stats as stats_mod
from ..common.stats import StatEntry
from .layout import DATA_PATH_V30
from .video import Locator, Numbering

ROW_GROUP_BYTES = 8 * 1024 * 1024
# Every this many waiting episode tables become one contiguous table: a small Arrow table's
# schema, chunk and buffer objects cost more than its rows (memory grew per episode).
COMPACT_TABLES = 256
_HF_DTYPES = {"float": "float32", "double": "float64", "int64": "int64", "int32": "int32", "bool": "bool",
              "string": "string", "large_string": "large_string", "halffloat": "float16"}


def _hf_value(typ: pa.DataType) -> dict[str, object]:
    return {"dtype": _HF_DTYPES.get(str(typ), str(typ)), "_type": "Value"}


def _is_image_struct(typ: pa.DataType) -> bool:
    return pa.types.is_struct(typ) and {typ.field(i).name for i in range(typ.num_fields)} == {"bytes", "path"}


def v3_data_schema(src: pa.Schema) -> pa.Schema:
    """The source schema with the 'huggingface' metadata LeRobot 0.4 writes (``_type: List``)."""
    feats: dict[str, object] = {}
    for f in src:
        if _is_image_struct(f.type):  # LeRobot's image feature: PNG bytes + path, HF type "Image"
            feats[f.name] = {"_type": "Image"}
        elif pa.types.is_fixed_size_list(f.type):
            feats[f.name] = {"feature": _hf_value(f.type.value_type), "length": f.type.list_size, "_type": "List"}
        elif pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            feats[f.name] = {"feature": _hf_value(f.type.value_type), "_type": "List"}
        else:
            feats[f.name] = _hf_value(f.type)
    return pa.schema(list(src), metadata={"huggingface": json.dumps({"info": {"features": feats}})})


class DataShards:
    """Parquet shards, one writer each, episodes written in batches of rows."""

    def __init__(self, out: Path, limit_bytes: int, chunks_size: int, batch_bytes: int = ROW_GROUP_BYTES) -> None:
        self.out = out
        self.limit = limit_bytes
        self.batch_bytes = batch_bytes
        self.numbering = Numbering(chunks_size)
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self._src: pa.Schema | None = None  # the last source schema seen, and its v3 schema
        self._v3: pa.Schema | None = None
        self.loc = Locator(0, 0)
        self.size = 0
        self.files: list[Path] = []
        self._batch: list[pa.Table] = []
        self._batch_size = 0

    def _schema(self, src: pa.Schema) -> pa.Schema:
        # the source files' own metadata (pandas, huggingface) is not part of the schema compared:
        # the writer and concat_tables ignore it too, and the shard carries only the v3 metadata
        if self._src is None or self._v3 is None or not src.equals(self._src, check_metadata=False):
            self._src, self._v3 = src, v3_data_schema(src.remove_metadata())
        return self._v3

    def add(self, table: pa.Table) -> Locator:
        sch = self._schema(table.schema)
        nbytes = table.nbytes
        if self.writer is not None and (sch is not self.schema or self.size + nbytes > self.limit):
            self.close()
        if self.writer is None:
            self.loc = self.numbering.next()
            path = self.out / DATA_PATH_V30.format(chunk_index=self.loc.chunk_index, file_index=self.loc.file_index)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, sch)
            self.schema, self.size = sch, 0
            self.files.append(path)
        self._batch.append(table)
        if len(self._batch) >= COMPACT_TABLES:
            self._batch = [self._concat().combine_chunks()]
        self._batch_size += nbytes
        self.size += nbytes
        if self._batch_size >= self.batch_bytes:
            self._flush()
        return Locator(self.loc.chunk_index, self.loc.file_index)

    def _concat(self) -> pa.Table:
        """The waiting tables as one, with the shard's schema (its v3 metadata)."""
        assert self.schema is not None
        return pa.concat_tables(self._batch).replace_schema_metadata(self.schema.metadata)

    def _flush(self) -> None:
        if self._batch and self.writer is not None:
            self.writer.write_table(self._concat(), row_group_size=1 << 30)
        self._batch, self._batch_size = [], 0

    def close(self) -> None:
        """Write what waits and finish the file (also on failure: nothing half-written is kept
        by the caller, which removes the output)."""
        if self.writer is not None:
            try:
                self._flush()
            finally:
                self.writer.close()
                self.writer = None
        self._batch, self._batch_size = [], 0


class StatColumn:
    """One ``stats/<feature>/<stat>`` column: flat numbers and their shape, or the raw values."""

    def __init__(self) -> None:
        self.shape: tuple[int, ...] | None = None
        self.ints: array[int] | None = array("q")
        self.floats: array[float] | None = None
        self.raw: list[Any] | None = None  # the generic path (not numeric, ragged, or missing somewhere)
        self.rows = 0  # episodes seen (values or gaps)

    def add(self, row: int, value: Any) -> None:
        if self.raw is None and row == self.rows and self._flat(value):
            self.rows = row + 1
            return
        if self.raw is None and (row != self.rows or not self._numeric(value)):
            self.raw = self.values()
        if self.raw is not None:
            self.raw.extend([None] * (row - len(self.raw)))
            self.raw.append(value)
        self.rows = row + 1

    def _flat(self, value: Any) -> bool:
        """The common case without numpy: a list of floats (or of ints, in an int column) of the
        column's shape, flat or nested (an image's (3, 1, 1))."""
        if type(value) is not list or not value or not self.shape or len(value) != self.shape[0]:
            return False
        if len(self.shape) > 1:
            value = _flattened(value, self.shape)
            if value is None:
                return False
        if self.floats is not None:
            # array("d") takes floats and ints (as np.float64 would) and refuses anything else;
            # a refused list may have left a prefix, taken back before the numpy path decides
            n = len(self.floats)
            try:
                self.floats.extend(value)
            except (TypeError, OverflowError):
                del self.floats[n:]
                return False
            return True
        if (self.ints is not None and all(type(v) is int for v in value)
                and min(value) >= -(1 << 63) and max(value) < 1 << 63):
            self.ints.extend(value)
            return True
        return False

    def _numeric(self, value: Any) -> bool:
        try:
            a = np.asarray(value)
        except (ValueError, TypeError):
            return False
        if a.dtype.kind not in "iuf" or (self.shape is not None and a.shape != self.shape):
            return False
        self.shape = a.shape
        if a.dtype.kind == "f" and self.ints is not None:
            self.floats, self.ints = array("d", self.ints), None
        if self.ints is not None:
            if a.size and (int(a.min()) < -(1 << 63) or int(a.max()) >= 1 << 63):
                return False
            self.ints.extend(a.astype(np.int64).ravel().tolist())
        else:
            assert self.floats is not None
            self.floats.extend(a.astype(np.float64).ravel().tolist())
        return True

    def matrix(self) -> NDArray[np.generic] | None:
        """(episodes, *shape) of the numbers, or None on the generic path."""
        if self.raw is not None or self.shape is None:
            return None
        flat = np.asarray(self.ints if self.ints is not None else self.floats,
                          dtype=np.int64 if self.ints is not None else np.float64)
        return flat.reshape((self.rows, *self.shape))

    def values(self) -> list[Any]:
        if self.raw is not None:
            return self.raw
        m = self.matrix()
        return [] if m is None else list(m.tolist())

    def arrow(self, episodes: int) -> pa.Array:
        m = self.matrix()
        if m is None or self.rows != episodes:
            vals = self.values()
            return stats_column(vals + [None] * (episodes - len(vals)))
        arr: pa.Array = pa.array(m.reshape(-1))
        for dim in reversed(m.shape[1:]):  # nested lists, as pa.array of the nested values gives
            arr = pa.ListArray.from_arrays(pa.array(np.arange(0, len(arr) + 1, dim, dtype=np.int32)), arr)
        return arr


def _flattened(value: list[Any], shape: tuple[int, ...]) -> list[Any] | None:
    """The items of nested lists of exactly ``shape``, in row-major order (as numpy ravels
    them), or None; a leaf that is a list is refused by the array it extends."""
    level = value
    for n in shape[1:]:
        inner: list[Any] = []
        for v in level:
            if type(v) is not list or len(v) != n:
                return None
            inner.extend(v)
        level = inner
    return level


def stats_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        floats = [None if v is None else np.asarray(v, dtype=np.float64).tolist() for v in values]
        return pa.array(floats)


class EpisodeStatsColumns:
    """Every episode's statistics, by feature and stat, as the episodes are written."""

    def __init__(self) -> None:
        self.cols: dict[str, dict[str, StatColumn]] = {}
        self.episodes = 0

    def add(self, st: dict[str, StatEntry]) -> None:
        row = self.episodes
        for feat, entry in st.items():
            if not isinstance(entry, dict):
                continue
            by_stat = self.cols.setdefault(feat, {})
            for name, value in entry.items():
                col = by_stat.get(name)
                if col is None:
                    col = by_stat[name] = StatColumn()
                col.add(row, value)
        self.episodes += 1

    def arrow_columns(self, features: list[str]) -> dict[str, pa.Array]:
        """``stats/<feature>/<stat>`` in the features' order, stats in first-seen order."""
        return {f"stats/{feat}/{name}": col.arrow(self.episodes)
                for feat in features for name, col in self.cols.get(feat, {}).items()}

    def aggregate(self) -> dict[str, StatEntry]:
        """Dataset statistics, as ``dataset.stats.aggregate`` of the per-episode dicts gives them."""
        out: dict[str, StatEntry] = {}
        for feat, by_stat in self.cols.items():
            mats = {name: col.matrix() for name, col in by_stat.items()}
            need = ("count", "mean", "std", "min", "max")
            if all(mats.get(n) is not None and by_stat[n].rows == self.episodes for n in need):
                got = _aggregate_matrices({n: m for n, m in mats.items() if m is not None and
                                           by_stat[n].rows == self.episodes})
            else:  # a stat missing in some episode, or not numeric: the per-episode dicts
                vals = {n: c.values() for n, c in by_stat.items()}
                per = [{feat: {n: v[i] for n, v in vals.items() if i < len(v) and v[i] is not None}}
                       for i in range(self.episodes)]
                got = stats_mod.aggregate([p for p in per if p[feat]]).get(feat)
            if got is not None:
                out[feat] = got
        return out


def _aggregate_matrices(m: dict[str, NDArray[np.generic]]) -> StatEntry | None:
    """stats_mod.aggregate's arithmetic on (episodes, *shape) arrays of one feature: only the
    episodes with a finite row (count > 0) and finite numbers are pooled."""
    counts = m["count"].reshape(len(m["count"]), -1)[:, 0].astype(np.float64)
    usable = counts > 0
    for name in ("mean", "std", "min", "max", *stats_mod.QUANTILES):
        if name in m:
            usable &= np.isfinite(m[name].astype(np.float64)).reshape(len(counts), -1).all(axis=1)
    if not usable.any():
        return stats_mod.empty_stats(tuple(m["mean"].shape[1:]))
    if not usable.all():
        m = {name: a[usable] for name, a in m.items()}
        counts = counts[usable]
    total = counts.sum()
    means, stds = m["mean"].astype(np.float64), m["std"].astype(np.float64)
    w = (counts / total).reshape((-1,) + (1,) * (means.ndim - 1))
    mean = (w * means).sum(0)
    var = (w * (stds ** 2 + (means - mean) ** 2)).sum(0)
    out: StatEntry = {"min": m["min"].astype(np.float64).min(0).tolist(),
                           "max": m["max"].astype(np.float64).max(0).tolist(), "mean": mean.tolist(),
                           "std": np.sqrt(np.maximum(var, 0)).tolist(), "count": [int(total)]}
    for name in stats_mod.QUANTILES:
        if name in m:
            out[name] = (w * m[name].astype(np.float64)).sum(0).tolist()
    return out
