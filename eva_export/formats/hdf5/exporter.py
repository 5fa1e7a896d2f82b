"""HDF5: one self-contained file per episode, images decoded from the MP4s and embedded.

``data/chunk-XXX/episode_NNNNNN.hdf5``::

    columns/item_NNNNNN   value = one table column (frames first), attrs key, kind
    images/item_NNNNNN    value = (T, H, W, 3) uint8, one chunk per frame, attrs key, kind
    metadata/item_NNNNNN  value = one field of the episode row, or fps; attrs key, kind

``kind`` says how to read ``value``: "array" (numeric or bool array/scalar), "string" (UTF-8
scalar string), "bytes" (opaque scalar, ``bytes(value[()])``), "none" (empty dataset) and
"msgpack" (mappings, lists, tuples: ``msgpack.unpackb(bytes(value[()]))``).

Images: maxshape (None, H, W, 3), chunks (1, H, W, 3), compression "" (none, default), "lzf" or
"gzip" (level ``gzip_level``) on image datasets only. Uncompressed, every chunk is allocated when
the dataset is made and the frames are written straight to them (``hdf5_frames``: camera after
camera, each decoded ahead in a thread, pwritev off the caller's thread), and the file is hashed as it is written; the
digest goes to the manifest (``manifest.record_written``). The first frame fixes H x W x C; a later
frame of another shape, or a final frame count different from the table's rows, raises
ExportError naming the episode and camera.

Each file is written as ``.episode_NNNNNN.hdf5.partial`` and renamed when closed, so a file
with the final name is complete; a rerun into the same staging directory keeps finished
episode files whose frame counts check out (resumable).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import h5py
import msgpack
import numpy as np
from numpy.typing import NDArray

from ...errors import ExportError, VideoError
from ...fsutil import read_json, require_free, storage_error
from ..common.checks import check_sample, check_totals, read_episode_rows, start_report
from ..common.exporter import Progress, VerifyReport
from ..common.images import Prefetch, camera_frames
from ..common.meta import INFO, DatasetMeta
from ..common.records import DatasetInfo
from ..common.train_checks import ValueCheck, check_stats
from ..common.written import RegionHasher
from ..lerobot_v21.episode_files import episode_file, export_episode_files, to_plain
from ..lerobot_v21.subset import column_numpy, state_action_keys
from .frames import (
    ALIGNMENT,
    CameraOut,
    chunk_offsets,
    compression_opts,
    create_preallocated,
    first_frame,
    write_cameras,
)
from .options import COMPRESSIONS, Hdf5Options

FORMAT = "hdf5"
GROUPS = ("columns", "images", "metadata")


def item_name(i: int) -> str:
    return f"item_{i:06d}"


def _write_value(group: h5py.Group, i: int, key: str, value: Any) -> None:
    """One mapping entry as ``item_NNNNNN/value`` with attrs key and kind."""
    g = group.create_group(item_name(i))
    g.attrs["key"] = key
    if value is None:
        g.attrs["kind"] = "none"
        g.create_dataset("value", data=h5py.Empty("u1"))
    elif isinstance(value, str):
        g.attrs["kind"] = "string"
        g.create_dataset("value", data=value, dtype=h5py.string_dtype("utf-8"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        g.attrs["kind"] = "bytes"
        g.create_dataset("value", data=np.void(bytes(value)))
    elif isinstance(value, (dict, list, tuple)):
        g.attrs["kind"] = "msgpack"
        g.create_dataset("value", data=np.void(msgpack.packb(to_plain(value), use_bin_type=True)))
    else:
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            g.attrs["kind"] = "msgpack"
            g.create_dataset("value", data=np.void(msgpack.packb(to_plain(value), use_bin_type=True)))
        else:
            g.attrs["kind"] = "array"
            g.create_dataset("value", data=arr)


def read_value(item: h5py.Group) -> Any:
    """Inverse of the writer's encoding of one item."""
    kind = item.attrs["kind"]
    ds = item["value"]
    if kind == "none":
        return None
    if kind == "string":
        return ds.asstr()[()]
    if kind == "bytes":
        return ds[()].tobytes()
    if kind == "msgpack":
        return msgpack.unpackb(ds[()].tobytes(), raw=False)
    return ds[()]


def read_group(group: h5py.Group) -> dict[str, Any]:
    return {str(item.attrs["key"]): read_value(item) for _, item in sorted(group.items())}


def find_item(group: h5py.Group, key: str) -> h5py.Group | None:
    for _, item in sorted(group.items()):
        if item.attrs.get("key") == key:
            return item
    return None


class Hdf5Exporter:
    """Write a native v2.1 subset as one HDF5 file per episode."""

    name = FORMAT

    def __init__(self, options: Hdf5Options = Hdf5Options(), *, gzip_level: int = 1, prefetch: int = 8) -> None:
        compression = options.compression
        if compression not in COMPRESSIONS:
            raise ValueError(f"hdf5 compression {compression!r}: choose one of {COMPRESSIONS}")
        self.compression = compression
        self.gzip_level = gzip_level
        self.prefetch = prefetch  # frames decoded ahead per camera, each in its own thread (bounded memory)
        self.resumed: list[int] = []  # episodes kept from an interrupted run by the last export

    def export(self, native_subset: Path, out_dir: Path, progress: Progress | None = None) -> None:
        self.resumed = export_episode_files(
            Path(native_subset), Path(out_dir), progress or Progress(), self.name, "hdf5",
            write_episode=self._write_unit,  # a bound method: picklable for worker processes
            is_complete=lambda path, meta, ep: _complete(path, ep.length, len(meta.info.visual_keys)))

    def _write_unit(self, tmp: Path, meta: DatasetMeta, ep: Any, table: Any) -> str | None:
        return self._write_episode(tmp, meta, ep.episode_index, ep.to_dict(), table)

    def _write_episode(self, tmp: Path, meta: DatasetMeta, episode_index: int, row: dict[str, Any],
                       table: Any) -> str | None:
        """Write one episode file; return the SHA-256 of its bytes when they were hashed as written."""
        require_free(tmp.parent, projected_bytes(meta, table), f"hdf5 episode {episode_index}")
        with open(tmp, "w+b", buffering=0) as fh:  # unbuffered: our pwritev and h5py's writes share the fd
            sink = _Sink(fh)
            digest = self._write_file(sink, meta, episode_index, row, table)
        if sink.error is not None:
            raise storage_error(tmp, sink.error, f"hdf5 episode {episode_index}: writing")
        return digest

    def _write_file(self, sink: _Sink, meta: DatasetMeta, episode_index: int, row: dict[str, Any],
                    table: Any) -> str | None:
        # libver earliest (superblock v0, no status flags): closing rewrites the superblock with
        # the bytes it already had, so the digest taken while writing survives the close.
        with h5py.File(sink, "w", libver="earliest", **(ALIGNMENT if not self.compression else {})) as f:
            f.attrs["dataset_format"] = FORMAT
            f.attrs["episode_index"] = episode_index
            cols, imgs, md = (f.create_group(g) for g in GROUPS)
            visual = meta.info.visual_keys  # MP4 cameras and images stored in Parquet alike
            for i, name in enumerate(n for n in table.column_names if n not in visual):
                _write_value(cols, i, name, column_numpy(table, name))
            for i, (key, value) in enumerate(list(row.items()) + [("fps", meta.info.fps)]):
                _write_value(md, i, key, value)
            if self.compression:
                self._write_compressed(imgs, meta, episode_index, table)
                return None
            hasher = self._write_direct(f, imgs, sink, meta, episode_index, table)
        return hasher.finish(sink.writes or [])

    def _write_direct(self, f: h5py.File, imgs: h5py.Group, sink: _Sink, meta: DatasetMeta, episode_index: int,
                      table: Any) -> RegionHasher:
        """Uncompressed images: preallocated chunks written by pwritev (hdf5_frames), hashed."""
        visual, rows = meta.info.visual_keys, int(table.num_rows)
        iters = [Prefetch(camera_frames(meta, episode_index, table, key), self.prefetch) for key in visual]
        try:  # each camera decodes ahead in its own thread (a later one waits with `prefetch` frames)
            cams = []
            for i, (key, it) in enumerate(zip(visual, iters, strict=True)):
                first = first_frame(it, episode_index, key, rows)
                g = imgs.create_group(item_name(i))
                g.attrs["key"] = key
                g.attrs["kind"] = "array"
                ds = create_preallocated(g, rows, first.shape)
                cams.append(CameraOut(key, it, chunk_offsets(ds, rows, first.nbytes), first))
            f.flush()  # every metadata byte on the file before the frames are hashed behind it
            sink.writes = []
            hasher = RegionHasher(sink.fh.fileno())
            write_cameras(sink.fh.fileno(), str(sink.fh.name), cams, hasher, episode_index)
            return hasher
        finally:
            for it in iters:
                it.close()

    def _write_compressed(self, imgs: h5py.Group, meta: DatasetMeta, episode_index: int, table: Any) -> None:
        for i, key in enumerate(meta.info.visual_keys):
            g = imgs.create_group(item_name(i))
            g.attrs["key"] = key
            g.attrs["kind"] = "array"
            with Prefetch(camera_frames(meta, episode_index, table, key), self.prefetch) as frames:
                self._append_frames(g, episode_index, key, frames, table.num_rows)

    def _append_frames(self, g: h5py.Group, episode_index: int, key: str, frames: Iterable[NDArray[Any]],
                       rows: int) -> None:
        ds: h5py.Dataset | None = None
        n = 0
        try:
            for frame in frames:
                if ds is None:
                    opts = compression_opts(self.compression, self.gzip_level)
                    # Sized for the table's rows at once: a resize per frame rewrote the
                    # chunk index each time. A short camera is still refused below.
                    ds = g.create_dataset("value", shape=(rows,) + frame.shape, maxshape=(None,) + frame.shape,
                                          chunks=(1,) + frame.shape, dtype=np.uint8, **opts)
                elif frame.shape != ds.shape[1:]:
                    raise ExportError(f"episode {episode_index}: {key} frame {n} has shape {frame.shape}, "
                                      f"earlier frames {ds.shape[1:]}")
                if n >= rows:
                    raise ExportError(f"episode {episode_index}: {key} has more frames than the table's {rows} rows")
                ds[n] = frame
                n += 1
        except VideoError as exc:
            raise ExportError(f"episode {episode_index}: {key}: {exc}") from exc
        if ds is None:  # no frame at all: nothing told the shape
            raise ExportError(f"episode {episode_index}: {key} has no frames, the table has {rows} rows")
        if n != rows:
            raise ExportError(f"episode {episode_index}: {key} has {n} frames, the table has {rows} rows")

    def verify(self, out_dir: Path) -> VerifyReport:
        return verify_hdf5(Path(out_dir))


def projected_bytes(meta: DatasetMeta, table: Any) -> int:
    """Upper bound of one episode file: the table, every frame uncompressed, and HDF5's object
    and per-frame chunk-index overhead (generous: refusing early is cheap, a full disk is not)."""
    visual = meta.info.visual_keys
    frames = sum(int(np.prod(meta.info.features[k].shape)) for k in visual) * int(table.num_rows)
    objects = int(table.num_columns) + len(visual) + 64
    return int(table.nbytes) + frames + objects * 16384 + int(table.num_rows) * len(visual) * 512 + (1 << 20)


class _Sink(io.RawIOBase):
    """The file h5py writes through (its "fileobj" driver). A failed write (ENOSPC, EIO) is
    recorded and reported as written: HDF5 2.0 crashes (SIGSEGV at exit, after a failed
    ``close``) once a write of its own failed, so it must never see one. The caller raises the
    recorded error after the file is closed, and the partial file is removed."""

    def __init__(self, fh: Any) -> None:
        super().__init__()
        self.fh = fh
        self.error: OSError | None = None
        self.writes: list[tuple[int, int]] | None = None  # (offset, length) of h5py's writes, once set to []

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        return int(self.fh.readinto(buf) or 0)

    def write(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        n = view.nbytes
        if self.writes is not None:
            self.writes.append((self.fh.tell(), n))
        if self.error is None:
            try:
                while view.nbytes:  # the file is unbuffered: a short write is continued
                    k = self.fh.write(view)
                    if not k:
                        raise OSError(f"write returned {k}")
                    view = view[k:]
            except OSError as exc:
                self.error = exc
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.fh.seek(offset, whence))

    def tell(self) -> int:
        return int(self.fh.tell())

    def truncate(self, size: int | None = None) -> int:
        try:
            return int(self.fh.truncate(size))
        except OSError as exc:
            self.error = self.error or exc
            return size or 0

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as exc:
            self.error = self.error or exc


def _complete(path: Path, rows: int, cameras: int) -> bool:
    """A finished file from an earlier run: readable, every image value has ``rows`` frames."""
    try:
        with h5py.File(path, "r") as f:
            imgs = f["images"]
            if len(imgs) != cameras:
                return False
            return all(item["value"].shape[0] == rows for item in imgs.values())
    except (OSError, KeyError):
        return False


def verify_hdf5(root: Path) -> VerifyReport:
    report, info = start_report(root, FORMAT, embedded_images=True)
    if info is None:
        return report
    image_keys = [k for k, f in info["features"].items() if f["dtype"] == "image"]
    rows_total = 0
    episodes = read_episode_rows(root, report)
    n_err = len(report.errors)
    sample: tuple[Any, Any, Any] = (None, None, None)
    feats = DatasetInfo.from_dict(info)
    state_key, action_key = state_action_keys(feats)
    values = ValueCheck(root, info)
    for ep in episodes:
        path = root / episode_file(info, ep.episode_index)
        try:
            with h5py.File(path, "r") as f:
                missing = [g for g in GROUPS if g not in f]
                if missing:
                    report.errors.append(f"{path.name}: lacks groups {missing}")
                    continue
                index_item = find_item(f["columns"], "index")
                if index_item is None:
                    report.errors.append(f"{path.name}: no 'index' column")
                    continue
                rows = index_item["value"].shape[0]
                rows_total += rows
                if rows != ep.length:
                    report.errors.append(f"{path.name}: {rows} rows, episodes.jsonl length {ep.length}")
                keys = set()
                for _, item in sorted(f["images"].items()):
                    keys.add(item.attrs["key"])
                    n = item["value"].shape[0]
                    if n != rows:
                        report.errors.append(f"{path.name}: images {item.attrs['key']} has {n} frames, {rows} rows")
                if keys != set(image_keys):
                    report.errors.append(f"{path.name}: image keys {sorted(keys)}, info.json has {image_keys}")
                values.episode(path.name, ep.episode_index, {
                    k: it["value"][()] for k in (*values.floats, "timestamp") if (it := find_item(f["columns"], k))})
                md = read_group(f["metadata"])
                if md.get("episode_index") != ep.episode_index or md.get("fps") != info["fps"]:
                    report.errors.append(f"{path.name}: metadata episode_index/fps do not match")
                if sample[0] is None and state_key and action_key and image_keys:
                    s_item, a_item = find_item(f["columns"], state_key), find_item(f["columns"], action_key)
                    i_item = find_item(f["images"], image_keys[0])
                    sample = (None if s_item is None else s_item["value"][0],
                              None if a_item is None else a_item["value"][0],
                              None if i_item is None else i_item["value"][0])
        except OSError as exc:
            report.errors.append(f"{path}: unreadable ({exc})")
    if len(report.errors) == n_err:
        report.checks.append(f"{len(episodes)} episode files: columns/images/metadata present, axis 0 of every "
                             "images/*/value equals the rows")
    check_totals(report, info, len(episodes), rows_total, "the HDF5 files")
    values.finish(report)
    check_stats(report, root, info, empty=not episodes)
    check_sample(report, *sample, where="episode 0 (h5py)", empty=not episodes)
    return report


def read_info(root: Path) -> dict[str, Any]:
    return dict(read_json(Path(root) / INFO))
