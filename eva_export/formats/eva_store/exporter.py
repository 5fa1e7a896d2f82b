"""eva_store: an immutable indexed store for multi-worker random access while training.

Numeric columns go to Zarr v3 arrays, camera frames to indexed MessagePack records (one
encoded image per row, JPEG by default), and a global Parquet sample index maps every sample
to its shard and row and to a train/val/all split. The layout and its typed records are in
``eva_export.formats.eva_store.records``; the reader is ``eva_export.formats.eva_store.open_store``.

Export: one shard per episode, the resumable unit. A shard is written into a hidden
``shards/.shard-NNNNN.partial`` directory, then renamed into place, so a shard directory that
exists is a finished one (never half a shard after a kill). Its ``shard.json`` (ShardRecord)
records the digest of the source files it came from, the writer options and the SHA-256 of each
of its files, taken from the bytes as they were written; a rerun keeps a shard whose record
still matches and rewrites any other. The shards are not fsynced one by one (that was an eighth
of a short episode's time): the published pair is made durable by the job's one sync, and a
shard a power cut tore before it is caught by its file digests on the rerun. The sample index,
manifest.json, meta files and quality_split.json (the marker) are written last.

Frames are decoded from the source MP4s one at a time with PyAV (a background thread decodes
ahead of the encoder, a few frames at most), so memory stays flat with episode length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import os
import platform
import random
import shutil
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ...confine import confined
from ...errors import ExportError, UnsafeNameError, VideoError
from ...fsutil import atomic_write_json, fsync_dir
from ...manifest import record_written, sha256_file
from ..common.exporter import Progress, VerifyReport
from ..common.images import Prefetch
from ..common.meta import INFO, DatasetMeta
from ..common.records import EpisodeRow, QualitySplit
from ..common.video import iter_frames
from ..lerobot_v21.episode_files import to_plain
from ..lerobot_v21.episode_stats import dataset_stats
from ..lerobot_v21.subset import column_numpy, copy_common_meta, load_source, read_episode_table, write_quality_split
from . import zarr_write
from .codecs import CODECS, encode_image, pack_record, sniff_codec
from .options import EvaStoreOptions
from .records import (
    KIND_ZARR,
    SAMPLE_INDEX_FILE,
    SHARD_FILE,
    SHARDS_DIR,
    STORE_VERSION,
    ZARR_GROUP,
    BlockSpec,
    IndexRecord,
    Manifest,
    MaterializedBlocks,
    ShardRecord,
    ShardSpec,
    shard_id_of,
)
from .shard_files import RecordWriter, ShardFiles
from .verify import verify_store

FORMAT = "eva_store"
CHUNK_ROWS = 1024  # Zarr rows per chunk: a whole episode of numeric data is one small read
INLINE_ROWS = 32  # episodes of at most this many frames decode in the writing thread


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """The writer options that change a shard's bytes (part of its resume check)."""

    image_codec: str = "jpeg"
    jpeg_quality: int = 90

    def to_dict(self) -> dict[str, Any]:
        return {"image_codec": self.image_codec,
                "jpeg_quality": self.jpeg_quality if self.image_codec == "jpeg" else None}


def split_of_episodes(episodes: list[int], val_ratio: float, seed: int) -> dict[int, str]:
    """train/val by episode, from a seeded shuffle; every episode ``all`` when no split is asked.

    ``round(val_ratio * n)`` episodes go to val, at least one and never all of them when there
    are two or more episodes (a split with an empty side is useless to a trainer).
    """
    if val_ratio <= 0:
        return {e: "all" for e in episodes}
    order = sorted(episodes)
    random.Random(seed).shuffle(order)
    n = len(order)
    n_val = min(max(1, round(val_ratio * n)), n - 1) if n >= 2 else 0
    val = set(order[:n_val])
    return {e: "val" if e in val else "train" for e in episodes}


def _is_image_column(typ: pa.DataType) -> bool:
    return bool(pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0)  # pyarrow is untyped


class EvaStoreExporter:
    """Write a native v2.1 subset as an eva_store (see the module docstring)."""

    name = FORMAT

    def __init__(self, options: EvaStoreOptions = EvaStoreOptions(), *, prefetch: int = 4) -> None:
        image_codec, jpeg_quality, val_ratio = options.image_codec, options.jpeg_quality, options.val_ratio
        if image_codec not in CODECS:
            raise ValueError(f"eva_store image_codec {image_codec!r}: choose one of {CODECS}")
        if not 1 <= int(jpeg_quality) <= 100:
            raise ValueError(f"eva_store jpeg_quality {jpeg_quality}: must be 1..100")
        if not 0.0 <= float(val_ratio) < 1.0:
            raise ValueError(f"eva_store val_ratio {val_ratio}: must be in [0, 1)")
        self.options = StoreOptions(image_codec, int(jpeg_quality))
        self.val_ratio = float(val_ratio)
        self.split_seed = int(options.split_seed)
        self.prefetch = prefetch
        self.resumed: list[int] = []  # episodes whose shard an interrupted run had finished

    # ---- export ----------------------------------------------------------------------------
    def export(self, native_subset: Path, out_dir: Path, progress: Progress | None = None) -> None:
        src, out = Path(native_subset), Path(out_dir)
        progress = progress or Progress()
        meta = load_source(src)
        shards_dir = out / SHARDS_DIR
        shards_dir.mkdir(parents=True, exist_ok=True)
        for stale in shards_dir.glob(".shard-*.partial"):  # a killed run's unfinished shard
            shutil.rmtree(stale, ignore_errors=True)
        splits = split_of_episodes([e.episode_index for e in meta.episodes], self.val_ratio, self.split_seed)
        task_text = meta.task_text
        self.resumed = []
        specs: list[ShardSpec] = []
        index: list[IndexRecord] = []
        offset = 0
        for ep in meta.episodes:
            table = read_episode_table(meta, ep, first_index=offset)
            digest = self._source_digest(meta, ep)
            final = shards_dir / shard_id_of(ep.episode_index)
            spec = self._reusable(final, digest)
            if spec is not None:
                self.resumed.append(ep.episode_index)
                progress.on_episode(ep.episode_index, 0)
            else:
                spec = self._write_shard(meta, ep, table, final, digest)
                progress.on_episode(ep.episode_index, sum(p.stat().st_size for p in final.rglob("*") if p.is_file()))
            spec = dataclasses.replace(spec, row_start=offset)
            specs.append(spec)
            index.extend(self._index_rows(ep, table, spec, offset, splits[ep.episode_index], task_text))
            offset += ep.length
        keep = {s.shard_id for s in specs}
        for p in shards_dir.iterdir():  # shards of episodes the subset no longer has
            if p.name not in keep:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        tmp_index = out / f".{SAMPLE_INDEX_FILE}.partial"
        IndexRecord.write_many(tmp_index, index)
        os.replace(tmp_index, out / SAMPLE_INDEX_FILE)
        copy_common_meta(src, out)
        info = self._info(meta, offset)
        atomic_write_json(out / INFO, info)
        self._manifest(src, meta, specs, splits, info).write(out)
        write_quality_split(src, out, FORMAT)  # the marker: last
        fsync_dir(out)

    def _source_digest(self, meta: DatasetMeta, ep: EpisodeRow) -> str:
        h = hashlib.sha256(meta.info.data_file(ep.episode_index).encode())
        h.update(sha256_file(meta.data_path(ep.episode_index)).encode())
        for key in meta.info.video_keys:
            h.update(key.encode())
            h.update(sha256_file(meta.video_path(key, ep.episode_index)).encode())
        return h.hexdigest()

    def _reusable(self, final: Path, digest: str) -> ShardSpec | None:
        """The spec of a finished shard from an earlier run with the same source and options,
        every file still the bytes its record names."""
        if not final.is_dir():
            return None
        try:
            rec = ShardRecord.read(final)
            ok = rec.source_digest == digest and rec.options == self.options.to_dict() and bool(rec.files)
            named = {rel for rel, _ in rec.files}
            ok = ok and all(p in named or p.startswith(f"{ZARR_GROUP}/") for b in rec.spec.blocks.values()
                            for p in b.paths)
            ok = ok and all(sha256_file(confined(final, rel, "shard file")) == sha for rel, sha in rec.files)
        except (OSError, ValueError, KeyError, TypeError, UnsafeNameError):
            ok = False
        if not ok:
            shutil.rmtree(final)  # stale (other source bytes or options) or torn: rewrite it
            return None
        for rel, sha in rec.files:  # just read and matched: the manifest need not read them again
            record_written(final / rel, sha)
        return rec.spec

    def _write_shard(self, meta: DatasetMeta, ep: EpisodeRow, table: pa.Table, final: Path,
                     digest: str) -> ShardSpec:
        sid = final.name
        tmp = final.with_name(f".{sid}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        files = ShardFiles()
        try:
            blocks = self._write_numeric(tmp, ep, table, files)
            blocks.update(self._write_table_images(tmp, meta, ep, table, files))
            for key in meta.info.video_keys:
                blocks[key] = self._write_camera(tmp, meta, ep, key, table.num_rows, files)
            spec = ShardSpec(sid, f"{SHARDS_DIR}/{sid}", ep.episode_index, 0, table.num_rows, blocks)
            record = ShardRecord(spec, digest, self.options.to_dict(), tuple(files.digests)).write(tmp)
            os.replace(tmp, final)  # the shard appears whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for rel, sha in files.digests:  # the manifest takes them instead of reading the shard again
            record_written(final / rel, sha)
        record_written(final / SHARD_FILE, hashlib.sha256(record).hexdigest())
        return spec

    def _write_numeric(self, tmp: Path, ep: EpisodeRow, table: pa.Table, files: ShardFiles) -> dict[str, BlockSpec]:
        arrays: dict[str, NDArray[np.generic]] = {}
        for name in table.column_names:
            typ = table.schema.field(name).type
            if _is_image_column(typ):
                continue
            arr = column_numpy(table, name)
            if arr.dtype.kind not in "biuf":
                raise ExportError(f"episode {ep.episode_index}: column {name!r} has type {typ}; eva_store "
                                  "stores numeric columns and images only")
            try:
                zarr_write.check_name(name)
            except ValueError as exc:
                raise ExportError(f"episode {ep.episode_index}: {exc}") from exc
            arrays[name] = arr
        group = tmp / ZARR_GROUP
        written = zarr_write.group_files()
        for name, arr in arrays.items():
            written = itertools.chain(written, zarr_write.array_files(name, arr, CHUNK_ROWS))
        for rel, data in zarr_write.write_files(group, written):
            files.add(f"{ZARR_GROUP}/{rel}", data)
        return {name: BlockSpec.for_zarr_array(name, str(arr.dtype.newbyteorder("=")), arr.shape)
                for name, arr in arrays.items()}

    def _write_table_images(self, tmp: Path, meta: DatasetMeta, ep: EpisodeRow,
                            table: pa.Table, files: ShardFiles) -> dict[str, BlockSpec]:
        """Parquet image columns (LeRobot's dtype "image": struct{bytes, path}) carried as encoded."""
        blocks: dict[str, BlockSpec] = {}
        for name in table.column_names:
            if not _is_image_column(table.schema.field(name).type):
                continue
            feat = meta.info.features.get(name)
            shape = tuple(feat.shape) if feat is not None else ()
            w = RecordWriter(tmp, name, files)
            try:
                codec = None
                for i, data in enumerate(table.column(name).combine_chunks().field("bytes").to_pylist()):
                    if not data:
                        raise ExportError(f"episode {ep.episode_index}: image column {name!r} row {i} has no bytes")
                    try:
                        c = sniff_codec(data)
                    except ValueError as exc:
                        raise ExportError(f"episode {ep.episode_index}: image column {name!r} row {i}: {exc}") from exc
                    codec = codec or c
                    w.add(pack_record(c, shape, data))
            finally:
                w.close()
            blocks[name] = BlockSpec.for_indexed_msgpack_records(name, w.rows, shape, codec or "png")
        return blocks

    def _write_camera(self, tmp: Path, meta: DatasetMeta, ep: EpisodeRow, key: str, rows: int,
                      files: ShardFiles) -> BlockSpec:
        codec, quality = self.options.image_codec, self.options.jpeg_quality
        w = RecordWriter(tmp, key, files)
        shape: tuple[int, ...] | None = None
        try:
            source = iter_frames(meta.video_path(key, ep.episode_index))
            # a decoding thread per camera file pays off for long episodes; for a few frames its
            # start costs more than the decode it overlaps
            ahead = (Prefetch(source, self.prefetch) if rows > INLINE_ROWS
                     else contextlib.closing(cast(Generator[NDArray[np.uint8], None, None], source)))
            with ahead as frames:
                for frame in frames:
                    if shape is None:
                        shape = tuple(frame.shape)
                    elif tuple(frame.shape) != shape:
                        raise ExportError(f"episode {ep.episode_index}: {key} frame {w.rows} has shape "
                                          f"{frame.shape}, earlier frames {shape}")
                    if w.rows >= rows:
                        raise ExportError(f"episode {ep.episode_index}: {key} has more frames than the table's "
                                          f"{rows} rows")
                    w.add(pack_record(codec, shape, encode_image(frame, codec, quality)))
        except VideoError as exc:
            raise ExportError(f"episode {ep.episode_index}: {key}: {exc}") from exc
        finally:
            w.close()
        if w.rows != rows:
            raise ExportError(f"episode {ep.episode_index}: {key} has {w.rows} frames, the table has {rows} rows")
        return BlockSpec.for_indexed_msgpack_records(key, rows, shape or (0, 0, 3), codec)

    @staticmethod
    def _index_rows(ep: EpisodeRow, table: pa.Table, spec: ShardSpec, offset: int, split: str,
                    task_text: dict[int, str]) -> list[IndexRecord]:
        n = table.num_rows
        frames = (column_numpy(table, "frame_index").astype(np.int64) if "frame_index" in table.column_names
                  else np.arange(n))
        default_task = ep.tasks[0] if ep.tasks else ""
        tasks = ([task_text.get(int(t), default_task) for t in column_numpy(table, "task_index")]
                 if "task_index" in table.column_names else [default_task] * n)
        return [IndexRecord(offset + r, f"{ep.episode_index}:{int(frames[r])}", ep.episode_index, tasks[r], split,
                            spec.shard_id, r) for r in range(n)]

    def _info(self, meta: DatasetMeta, frames: int) -> dict[str, Any]:
        d: dict[str, Any] = meta.info.to_dict()  # features as dicts, edited in place
        for feat in d["features"].values():
            if feat["dtype"] == "video":
                feat["dtype"] = "image"
                feat.pop("info", None)
        d.update(total_episodes=len(meta.episodes), total_frames=frames, total_videos=0,
                 data_path=SHARDS_DIR + "/shard-{episode_index:05d}", embedded_images=True,
                 dataset_format=FORMAT)
        d.pop("video_path", None)
        return d

    def _manifest(self, src: Path, meta: DatasetMeta, specs: list[ShardSpec], splits: dict[int, str],
                  info: dict[str, Any]) -> Manifest:
        qs = QualitySplit.read(src)
        source: dict[str, object] = {"source_dir": qs.source_dir, "subset": qs.subset,
                                  "source_episode_indices": qs.source_episode_indices,
                                  "codebase_version": meta.info.codebase_version,
                                  "subset_info_sha256": sha256_file(src / INFO)}
        raw_info = Path(qs.source_dir) / INFO
        source["info_sha256"] = sha256_file(raw_info) if raw_info.is_file() else None
        numeric = tuple(k for k, b in specs[0].blocks.items() if b.kind == KIND_ZARR) if specs else ()
        images = tuple(k for k in meta.info.features if meta.info.features[k].dtype == "image")
        mb = MaterializedBlocks(numeric=numeric, cameras=tuple(meta.info.video_keys), images=images,
                                image_codec=self.options.image_codec,
                                jpeg_quality=self.options.to_dict()["jpeg_quality"])
        per_split: dict[str, list[int]] = {}
        for e, s in splits.items():
            per_split.setdefault(s, []).append(e)
        stats = {"total_episodes": len(specs), "total_frames": sum(s.num_rows for s in specs),
                 "features": to_plain(dataset_stats(meta))}
        import msgpack
        import zarr

        from ... import __version__

        provenance: dict[str, object] = {"writer": f"eva_export {__version__} ({__name__})", "python": platform.python_version(),
                      "zarr": zarr.__version__, "msgpack": ".".join(map(str, msgpack.version)),
                      "options": {**self.options.to_dict(), "val_ratio": self.val_ratio,
                                  "split_seed": self.split_seed, "chunk_rows": CHUNK_ROWS}}
        return Manifest(version=STORE_VERSION, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        fps=meta.info.fps, source=source, materialized_blocks=mb, features=info["features"],
                        split={"seed": self.split_seed, "val_ratio": self.val_ratio, "episodes": per_split},
                        stats=stats, provenance=provenance, shards=tuple(specs))

    # ---- verify ----------------------------------------------------------------------------
    def verify(self, out_dir: Path) -> VerifyReport:
        return verify_store(Path(out_dir))
