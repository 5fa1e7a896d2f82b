"""Typed on-disk records of an eva_store: manifest, shard and block specs, sample-index rows.

Layout of one store (one per subset: accepted/ and rejected/)::

    manifest.json                  Manifest (format version, provenance, stats, shard specs)
    sample_index.parquet           one IndexRecord per sample, in global sample order
    meta/info.json, meta/quality_split.json, meta/episodes.jsonl ...   as the other formats
    shards/shard-NNNNN/            one immutable shard per episode (NNNNN = episode index)
        shard.json                 ShardSpec + source digest + writer options (resume check)
        data.zarr/                 Zarr v3 group: one array per numeric column (block kind zarr_array)
        records/<key>.msgpack      concatenated MessagePack frame records (msgpack_indexed_records)
        records/<key>.offsets.npy  int64 offsets, num_records + 1 of them, record i = [o[i], o[i+1])

The shard specs in the manifest are the authoritative physical inventory; a reader never lists
directories. Every record has ``from_dict`` / ``to_dict`` and nothing else reads the JSON.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ... import confine
from ...errors import UnsafeNameError
from ...fsutil import atomic_write_json, dumps_json, read_json, storage_guard
from ...jsonbound import as_dict, as_int, as_list

STORE_FORMAT = "eva_store"
STORE_VERSION = 1
MANIFEST_FILE = "manifest.json"
SAMPLE_INDEX_FILE = "sample_index.parquet"
SHARDS_DIR = "shards"
SHARD_FILE = "shard.json"
ZARR_GROUP = "data.zarr"
KIND_ZARR = "zarr_array"
KIND_RECORDS = "msgpack_indexed_records"
BLOCK_KINDS = (KIND_ZARR, KIND_RECORDS)
SPLITS = ("all", "train", "val")


def shard_id_of(episode_index: int) -> str:
    return f"shard-{episode_index:05d}"


@dataclass(frozen=True)
class BlockSpec:
    """One stored block of a shard.

    ``paths`` are relative to the shard directory: the Zarr array path for ``zarr_array``, the
    payload and offsets files for ``msgpack_indexed_records``. ``shape`` is the full logical
    shape (rows first; for frame records the decoded HxWx3 shape). ``codec`` names the image
    codec of frame records (``jpeg``, ``png``, ``raw``); None for numeric blocks.
    """

    name: str
    kind: str
    paths: tuple[str, ...]
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    optional: bool = False
    codec: str | None = None

    @staticmethod
    def zarr_array_path(name: str) -> str:
        """``observation.state`` -> ``data.zarr/observation.state`` (one flat group per shard)."""
        return f"{ZARR_GROUP}/{name}"

    @staticmethod
    def msgpack_records_path(name: str) -> str:
        return f"records/{name}.msgpack"

    @staticmethod
    def msgpack_records_offsets_path(name: str) -> str:
        return f"records/{name}.offsets.npy"

    @classmethod
    def for_zarr_array(cls, name: str, dtype: str, shape: tuple[int, ...], optional: bool = False) -> BlockSpec:
        return cls(name, KIND_ZARR, (cls.zarr_array_path(name),), dtype, tuple(shape), optional)

    @classmethod
    def for_indexed_msgpack_records(cls, name: str, num_records: int, frame_shape: tuple[int, ...], codec: str,
                                    optional: bool = False) -> BlockSpec:
        return cls(name, KIND_RECORDS, (cls.msgpack_records_path(name), cls.msgpack_records_offsets_path(name)),
                   "uint8", (num_records, *frame_shape), optional, codec)

    @property
    def num_rows(self) -> int:
        return int(self.shape[0]) if self.shape else 0

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "paths": list(self.paths), "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape), "optional": self.optional,
                "codec": self.codec}

    @classmethod
    def from_dict(cls, d: object) -> BlockSpec:
        d = as_dict(d, "a block")
        kind = str(d["kind"])
        if kind not in BLOCK_KINDS:
            raise ValueError(f"block {d.get('name')!r}: unknown kind {kind!r} (expected one of {BLOCK_KINDS})")
        shape = d.get("shape")
        paths = tuple(str(p) for p in as_list(d["paths"], "block paths"))
        want = 1 if kind == KIND_ZARR else 2
        if len(paths) != want or (kind == KIND_ZARR and not paths[0].startswith(f"{ZARR_GROUP}/")):
            raise ValueError(f"block {d.get('name')!r}: paths {list(paths)[:3]} do not fit kind {kind}")
        dims = None if shape is None else tuple(as_int(s, "a block shape entry") for s in as_list(shape, "shape"))
        if dims is not None and (not dims or min(dims) < 0):
            raise ValueError(f"block {d.get('name')!r}: shape {list(dims)} is not a shape")
        return cls(name=str(d["name"]), kind=kind, paths=paths,
                   dtype=None if d.get("dtype") is None else str(d["dtype"]),
                   shape=dims,
                   optional=bool(d.get("optional", False)),
                   codec=None if d.get("codec") is None else str(d["codec"]))


@dataclass(frozen=True)
class ShardSpec:
    """One immutable shard: an episode's rows ``[row_start, row_start + num_rows)`` of the store."""

    shard_id: str
    relative_dir: str
    episode_index: int
    row_start: int
    num_rows: int
    blocks: dict[str, BlockSpec] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"shard_id": self.shard_id, "relative_dir": self.relative_dir, "episode_index": self.episode_index,
                "row_start": self.row_start, "num_rows": self.num_rows,
                "blocks": {k: b.to_dict() for k, b in self.blocks.items()}}

    @classmethod
    def from_dict(cls, d: object) -> ShardSpec:
        d = as_dict(d, "a shard")
        spec = cls(shard_id=str(d["shard_id"]), relative_dir=str(d["relative_dir"]),
                   episode_index=as_int(d["episode_index"], "episode_index"),
                   row_start=as_int(d["row_start"], "row_start"), num_rows=as_int(d["num_rows"], "num_rows"),
                   blocks={str(k): BlockSpec.from_dict(v) for k, v in as_dict(d.get("blocks") or {}, "blocks").items()})
        if spec.row_start < 0 or spec.num_rows < 0:
            raise ValueError(f"shard {spec.shard_id}: negative row_start or num_rows")
        return spec

    def check_paths(self, root: Path) -> None:
        """Every directory and block file this spec names lies inside the store ``root``, after
        resolving symlinks; relative, without '..' (UnsafeNameError otherwise)."""
        rels = [self.relative_dir] + [f"{self.relative_dir}/{p}" for b in self.blocks.values() for p in b.paths]
        for rel in rels:
            if rel.startswith("/") or "\\" in rel or ".." in rel.split("/") or "\x00" in rel:
                raise UnsafeNameError(f"shard {self.shard_id}: path {confine.short_repr(rel, 80)} is absolute or "
                                      f"has '..'; refused")
            confine.confined(root, rel, f"shard {self.shard_id} path")


@dataclass(frozen=True)
class ShardRecord:
    """``shard.json``: the shard's spec, the digest of the source files it came from, the writer
    options, and each file's SHA-256 (path relative to the shard). A rerun keeps a shard only when
    all of them still match, so a shard whose files were renamed into place but never reached the
    disk (a power cut before the job's one sync) is found torn and written again."""

    spec: ShardSpec
    source_digest: str
    options: dict[str, object]
    files: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, object]:
        return {"spec": self.spec.to_dict(), "source_digest": self.source_digest, "options": self.options,
                "files": [list(f) for f in self.files]}

    @classmethod
    def from_dict(cls, d: object) -> ShardRecord:
        d = as_dict(d, "shard.json")
        files = tuple((str(rel), str(sha)) for rel, sha in (as_list(f, "a file entry") for f in as_list(d["files"], "files")))
        for rel, _ in files:
            if not rel or rel.startswith("/") or "\\" in rel or ".." in rel.split("/") or "\x00" in rel:
                raise ValueError(f"shard.json: file {confine.short_repr(rel, 80)} is not a path inside the shard")
        return cls(ShardSpec.from_dict(d["spec"]), str(d["source_digest"]), dict(as_dict(d["options"], "options")), files)

    def write(self, shard_dir: Path) -> bytes:
        """Into the shard's partial directory (renamed whole into place), not fsynced: the
        file digests it carries are what a rerun trusts, not the record's own durability.
        Returns the bytes written."""
        path = shard_dir / SHARD_FILE
        data = dumps_json(self.to_dict()).encode("utf-8")
        with storage_guard(path):
            path.write_bytes(data)
        return data

    @classmethod
    def read(cls, shard_dir: Path) -> ShardRecord:
        return cls.from_dict(read_json(shard_dir / SHARD_FILE))


@dataclass(frozen=True)
class MaterializedBlocks:
    """Store-wide block families; each shard's block specs remain the physical inventory."""

    numeric: tuple[str, ...]  # Zarr columns (state, action, vectors, timestamp, indices)
    cameras: tuple[str, ...]  # frames decoded from the source MP4s, re-encoded per row
    images: tuple[str, ...] = ()  # Parquet image columns carried as their original encoded bytes
    image_codec: str = "jpeg"
    jpeg_quality: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {"numeric": list(self.numeric), "cameras": list(self.cameras), "images": list(self.images),
                "image_codec": self.image_codec, "jpeg_quality": self.jpeg_quality}

    @classmethod
    def from_dict(cls, d: object) -> MaterializedBlocks:
        d = as_dict(d, "materialized_blocks")
        q = d.get("jpeg_quality")

        def names(key: str) -> tuple[str, ...]:
            return tuple(str(n) for n in as_list(d.get(key) or (), key))
        return cls(numeric=names("numeric"), cameras=names("cameras"), images=names("images"),
                   image_codec=str(d.get("image_codec", "jpeg")),
                   jpeg_quality=None if q is None else as_int(q, "jpeg_quality"))


@dataclass(frozen=True)
class Manifest:
    """manifest.json: what the store is, where it came from, and every shard's blocks."""

    version: int
    created_at: str
    fps: int
    source: dict[str, object]  # source_dir, info_sha256, subset, source_episode_indices ...
    materialized_blocks: MaterializedBlocks
    features: dict[str, object] = field(default_factory=dict)  # info.json-style feature declarations
    split: dict[str, object] = field(default_factory=dict)  # seed, val_ratio, episodes per split
    stats: dict[str, object] = field(default_factory=dict)  # totals and per-feature aggregate stats
    provenance: dict[str, object] = field(default_factory=dict)  # writer, versions, options
    shards: tuple[ShardSpec, ...] = ()
    format: str = STORE_FORMAT

    @property
    def total_rows(self) -> int:
        return sum(s.num_rows for s in self.shards)

    def to_dict(self) -> dict[str, object]:
        return {"format": self.format, "version": self.version, "created_at": self.created_at, "fps": self.fps,
                "source": self.source, "materialized_blocks": self.materialized_blocks.to_dict(),
                "features": self.features, "split": self.split, "stats": self.stats,
                "provenance": self.provenance, "shards": [s.to_dict() for s in self.shards]}

    @classmethod
    def from_dict(cls, d: object) -> Manifest:
        d = as_dict(d, "manifest.json")
        if d.get("format") != STORE_FORMAT:
            raise ValueError(f"format {str(d.get('format'))[:40]!r}, expected {STORE_FORMAT!r}")
        version = as_int(d["version"], "version")
        if version > STORE_VERSION:
            raise ValueError(f"store format version {version} is newer than this reader ({STORE_VERSION})")
        fps = as_int(d["fps"], "fps")
        if fps <= 0:
            raise ValueError(f"fps {fps} is not positive")
        return cls(version=version, created_at=str(d["created_at"]), fps=fps,
                   source=as_dict(d.get("source") or {}, "source"),
                   materialized_blocks=MaterializedBlocks.from_dict(d.get("materialized_blocks") or {}),
                   features=as_dict(d.get("features") or {}, "features"), split=as_dict(d.get("split") or {}, "split"),
                   stats=as_dict(d.get("stats") or {}, "stats"),
                   provenance=as_dict(d.get("provenance") or {}, "provenance"),
                   shards=tuple(ShardSpec.from_dict(s) for s in as_list(d.get("shards") or (), "shards")))

    def write(self, root: Path) -> None:
        atomic_write_json(Path(root) / MANIFEST_FILE, self.to_dict())

    @classmethod
    def read(cls, root: Path) -> Manifest:
        """Load ``root/manifest.json``; ValueError/OSError name the file."""
        path = Path(root) / MANIFEST_FILE
        try:
            confine.confined(Path(root), MANIFEST_FILE, "manifest")
            manifest = cls.from_dict(read_json(path))
            for spec in manifest.shards:
                spec.check_paths(Path(root))
            return manifest
        except (KeyError, TypeError, ValueError, UnsafeNameError) as exc:
            what = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{path}: {what}") from None


INDEX_SCHEMA = pa.schema([
    ("sample_index", pa.int64()), ("sample_key", pa.string()), ("episode_index", pa.int64()),
    ("task", pa.string()), ("split", pa.string()), ("shard_id", pa.string()), ("row", pa.int64()),
])


@dataclass(frozen=True)
class IndexRecord:
    """One sample of the global index: where it lives and which split it belongs to."""

    sample_index: int
    sample_key: str  # "<episode_index>:<frame_index>", stable across re-exports of the subset
    episode_index: int
    task: str
    split: str  # all, train or val
    shard_id: str
    row: int

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IndexRecord:
        return cls(int(d["sample_index"]), str(d["sample_key"]), int(d["episode_index"]), str(d["task"]),
                   str(d["split"]), str(d["shard_id"]), int(d["row"]))

    @staticmethod
    def write_many(path: Path, records: list[IndexRecord]) -> None:
        """Write the index as Parquet (columnar, so a reader loads it without Python objects)."""
        cols = {name: [getattr(r, name) for r in records] for name in INDEX_SCHEMA.names}
        pq.write_table(pa.table(cols, schema=INDEX_SCHEMA), path)

    @staticmethod
    def read_table(path: Path) -> pa.Table:
        table = pq.read_table(path)
        missing = [n for n in INDEX_SCHEMA.names if n not in table.column_names]
        if missing:
            raise ValueError(f"{path}: lacks columns {missing}")
        return table

    @classmethod
    def read_many(cls, path: Path) -> list[IndexRecord]:
        return [cls.from_dict(d) for d in cls.read_table(path).to_pylist()]
