"""Camera frames into an HDF5 episode file at the speed of the disk (issue 28).

h5py's ``ds[n] = frame`` costs a Python call, a selection, a chunk-cache pass and a write
through the fileobj driver per frame (47% of an export). Uncompressed image datasets are
therefore created with every chunk allocated at creation and never filled (``ALLOC_TIME_EARLY``,
``FILL_TIME_NEVER``): the layout stays the documented one (chunks ``(1, H, W, 3)``, maxshape
``(None, H, W, 3)``), the chunk index is final before the first frame, and the frames are
written by ``pwritev`` straight to their chunks' bytes, runs of adjacent chunks in one call.
HDF5 never reads or writes those bytes itself (no fill, no cached chunk), so the file is what
``ds[n] = frame`` would have made. The frames are hashed as they are written
(``written.RegionHasher``), in file order: cameras one after the other, each camera's chunks in
frame order. Every camera decodes ahead at once (``images.Prefetch``), so the next camera's
decoder runs while this one's frames are written.

Compressed datasets (lzf, gzip) keep h5py's own write path and get no digest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np
from numpy.typing import NDArray

from ..errors import ExportError, VideoError
from .written import RegionHasher

FRAMES_PER_WRITE = 16  # ~15 MB per pwritev at 640x480: large enough for the disk, small in memory


def compression_opts(compression: str, gzip_level: int) -> dict[str, Any]:
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": gzip_level}
    if compression == "lzf":
        return {"compression": "lzf"}
    return {}


def create_preallocated(g: h5py.Group, rows: int, shape: tuple[int, ...]) -> h5py.Dataset:
    """``value`` (rows, *shape) uint8, one chunk per frame, every chunk allocated now, no fill."""
    sid = h5py.h5s.create_simple((rows,) + shape, (h5py.h5s.UNLIMITED,) + shape)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((1,) + shape)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # the frames overwrite every byte: zeros first would double the writes
    return h5py.Dataset(h5py.h5d.create(g.id, b"value", h5py.h5t.NATIVE_UINT8, sid, dcpl=dcpl))


def chunk_offsets(ds: h5py.Dataset, rows: int, frame_bytes: int) -> list[int]:
    """File offset of frame i's chunk, for every frame (the chunks were allocated at creation)."""
    offsets = [-1] * rows

    def seen(info: Any) -> None:
        if info.size != frame_bytes or info.filter_mask:
            raise ExportError(f"{ds.name}: chunk {info.chunk_offset} is {info.size} bytes, not {frame_bytes}")
        offsets[info.chunk_offset[0]] = info.byte_offset

    ds.id.chunk_iter(seen)
    if min(offsets, default=0) < 0:
        raise ExportError(f"{ds.name}: HDF5 did not allocate every chunk at creation")
    return offsets


def pwritev_all(fd: int, views: list[Any], offset: int) -> None:
    """``views`` written at ``offset``; a short write (rare on files) is continued."""
    views = [memoryview(v).cast("B") for v in views]
    while views:
        n = os.pwritev(fd, views, offset)
        if n <= 0:
            raise OSError(f"pwritev wrote {n} bytes at {offset}")
        offset += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class DirectFrames:
    """Frames to their chunks by ``pwritev``, adjacent chunks batched, hashed on the way."""

    def __init__(self, fd: int, hasher: RegionHasher | None) -> None:
        self._fd = fd
        self._hasher = hasher
        self._batch: list[NDArray[Any]] = []
        self._at = 0
        self._next = 0

    def add(self, offset: int, frame: NDArray[Any]) -> None:
        if self._batch and (offset != self._next or len(self._batch) >= FRAMES_PER_WRITE):
            self.flush()
        if not self._batch:
            self._at = offset
        self._batch.append(frame)
        self._next = offset + frame.nbytes

    def flush(self) -> None:
        if not self._batch:
            return
        if self._hasher is not None:
            self._hasher.data(self._at, self._batch)
        pwritev_all(self._fd, self._batch, self._at)
        self._batch = []


def first_frame(frames: Iterator[NDArray[Any]], episode_index: int, key: str, rows: int) -> NDArray[Any]:
    """A camera's first frame: it fixes H x W x C before its dataset is made."""
    try:
        frame = next(frames, None)
    except VideoError as exc:
        raise ExportError(f"episode {episode_index}: {key}: {exc}") from exc
    if frame is None:  # no frame at all: nothing told the shape
        raise ExportError(f"episode {episode_index}: {key} has no frames, the table has {rows} rows")
    if rows == 0:
        raise ExportError(f"episode {episode_index}: {key} has more frames than the table's {rows} rows")
    return as_frame(frame)


def as_frame(frame: NDArray[Any]) -> NDArray[Any]:
    return np.ascontiguousarray(frame, dtype=np.uint8)


def write_camera(out: DirectFrames, offsets: list[int], first: NDArray[Any], frames: Iterator[NDArray[Any]],
                 episode_index: int, key: str) -> None:
    """Every frame of one camera into its preallocated chunks; the counts checked as h5py's path does."""
    rows, n = len(offsets), 0
    frame = first
    try:
        while True:
            if frame.shape != first.shape:
                raise ExportError(f"episode {episode_index}: {key} frame {n} has shape {frame.shape}, "
                                  f"earlier frames {first.shape}")
            if n >= rows:
                raise ExportError(f"episode {episode_index}: {key} has more frames than the table's {rows} rows")
            out.add(offsets[n], frame)
            n += 1
            nxt = next(frames, None)
            if nxt is None:
                break
            frame = as_frame(nxt)
    except VideoError as exc:
        raise ExportError(f"episode {episode_index}: {key}: {exc}") from exc
    out.flush()
    if n != rows:
        raise ExportError(f"episode {episode_index}: {key} has {n} frames, the table has {rows} rows")
