"""Camera frames into an HDF5 episode file at the speed of the disk (issue 28).

h5py's ``ds[n] = frame`` costs a Python call, a selection, a chunk-cache pass and a write
through the fileobj driver per frame (47% of an export). Uncompressed image datasets are
therefore created with every chunk allocated at creation and never filled (``ALLOC_TIME_EARLY``,
``FILL_TIME_NEVER``): the layout stays the documented one (chunks ``(1, H, W, 3)``, maxshape
``(None, H, W, 3)``), the chunk index is final before the first frame, and the frames are
written by ``pwritev`` straight to their chunks' bytes, runs of adjacent chunks in one call
(``write_cameras``).
HDF5 never reads or writes those bytes itself (no fill, no cached chunk), so the file is what
``ds[n] = frame`` would have made. The frames are hashed as they are written
(``written.RegionHasher``), in file order: cameras one after the other, each camera's chunks in
frame order; every camera decodes at once (one ``images.Prefetch`` thread each: one PyAV
decoder uses under one core here, two run at twice its rate), so a later camera's frames written
while an earlier one was still going are hashed from the page cache when their turn comes.

Compressed datasets (lzf, gzip) keep h5py's own write path and get no digest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
from numpy.typing import NDArray

from ..errors import ExportError, VideoError
from .written import RegionHasher, StepThread, pwritev_all, start_writeback

FRAMES_PER_WRITE = 8  # ~7 MB per pwritev at 640x480: large for the disk, small in memory


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
    dcpl.set_obj_track_times(False)  # as h5py's own datasets: no clock in the file, equal runs give equal bytes
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


Writes = StepThread[tuple[list[Any], int]]  # (frames for adjacent chunks, file offset of the first)


def background_writes(fd: int, depth: int = 2) -> Writes:
    """``pwritev`` calls on a thread of their own, at most ``depth`` batches behind the caller.

    The kernel's write path (page cache, dirty-page throttling) took 57% of the writer's wall
    time and the hash 27%; both release the GIL, so the caller hashes a batch while this thread
    writes the previous one, and starts its writeback to the disk. A failed write is raised by
    the next ``put`` or ``drain``.
    """

    def write(item: tuple[list[Any], int]) -> None:
        views, offset = item
        pwritev_all(fd, views, offset)
        start_writeback(fd, offset, sum(memoryview(v).nbytes for v in views))

    return StepThread(write, "hdf5-writes", depth)


@dataclass
class CameraOut:
    """One camera of an episode on its way into its preallocated chunks."""

    key: str
    frames: Iterator[NDArray[Any]]  # after ``first``
    offsets: list[int]  # file offset of frame i's chunk
    first: NDArray[Any]
    n: int = 0  # frames taken
    batch: list[NDArray[Any]] = field(default_factory=list)  # frames for adjacent chunks, not written yet
    at: int = 0  # file offset of the batch
    end: int = 0  # file offset just after the last frame written
    done: bool = False


def _flush(out: Writes, cam: CameraOut, hasher: RegionHasher | None, hashing: bool) -> None:
    if not cam.batch:
        return
    if hasher is not None and hashing:
        hasher.data(cam.at, cam.batch)
    out.put((cam.batch, cam.at))
    cam.end = cam.at + sum(f.nbytes for f in cam.batch)
    cam.batch = []


def _take(out: Writes, cam: CameraOut, hasher: RegionHasher | None, hashing: bool, episode_index: int) -> bool:
    """The camera's next frame into its batch; False once the camera has ended (counts checked)."""
    rows = len(cam.offsets)
    try:
        raw = cam.first if cam.n == 0 else next(cam.frames, None)
    except VideoError as exc:
        raise ExportError(f"episode {episode_index}: {cam.key}: {exc}") from exc
    if raw is None:
        _flush(out, cam, hasher, hashing)
        if cam.n != rows:
            raise ExportError(f"episode {episode_index}: {cam.key} has {cam.n} frames, the table has {rows} rows")
        return False
    frame = as_frame(raw)
    if frame.shape != cam.first.shape:
        raise ExportError(f"episode {episode_index}: {cam.key} frame {cam.n} has shape {frame.shape}, "
                          f"earlier frames {cam.first.shape}")
    if cam.n >= rows:
        raise ExportError(f"episode {episode_index}: {cam.key} has more frames than the table's {rows} rows")
    offset = cam.offsets[cam.n]
    if cam.batch and (offset != cam.at + len(cam.batch) * frame.nbytes or len(cam.batch) >= FRAMES_PER_WRITE):
        _flush(out, cam, hasher, hashing)
    if not cam.batch:
        cam.at = offset
    cam.batch.append(frame)
    cam.n += 1
    return True


def write_cameras(fd: int, cams: list[CameraOut], hasher: RegionHasher | None, episode_index: int) -> None:
    """Every camera's frames, one from each in turn, so all their decoders run at once.

    ``cams`` are in file order. The first camera not yet finished is hashed as it is written;
    what a later camera wrote meanwhile is hashed from the page cache when its turn comes.
    """
    head = 0
    out = background_writes(fd)
    try:
        while head < len(cams):
            for i, cam in enumerate(cams):
                if not cam.done and not _take(out, cam, hasher, i == head, episode_index):
                    cam.done = True
            while head < len(cams) and cams[head].done:
                head += 1
                if head < len(cams) and hasher is not None and cams[head].end:
                    out.drain()  # its frames must be in the file to be read back
                    hasher.read_back(cams[head].end)
        out.drain()
    finally:
        out.close()
