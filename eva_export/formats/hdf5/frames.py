"""Camera frames into an HDF5 episode file at the speed of the disk.

h5py's ``ds[n] = frame`` costs a Python call, a selection, a chunk-cache pass and a write
through the fileobj driver per frame (47% of an export). Uncompressed image datasets are
therefore created with every chunk allocated at creation and never filled (``ALLOC_TIME_EARLY``,
``FILL_TIME_NEVER``): the layout stays the documented one (chunks ``(1, H, W, 3)``, maxshape
``(None, H, W, 3)``), the chunk index is final before the first frame, and the frames are
written by ``pwritev`` straight to their chunks' bytes, runs of adjacent chunks in one call
(``write_cameras``).
HDF5 never reads or writes those bytes itself (no fill, no cached chunk), so the file is what
``ds[n] = frame`` would have made. The frames are hashed as they are written
(``written.RegionHasher``), in file order: the cameras one after the other, each camera's chunks
in frame order, each camera decoding ahead in its own ``images.Prefetch`` thread (PyAV's frame
threads use both cores: one camera decodes 1500+ frames/s here, several times the disk's rate).
Cameras used to decode at once, when a decoder was slower than the disk; the later cameras' frames
were then hashed by reading them back at the end of each episode, with nothing else running.

Compressed datasets (lzf, gzip) keep h5py's own write path and get no digest.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
from numpy.typing import NDArray

from ...errors import ExportError, VideoError
from ..common.written import DIRECT_ALIGN, DirectWrites, RegionHasher, StepThread

FRAMES_PER_WRITE = 8  # ~7 MB per pwritev at 640x480: large for the disk, small in memory
# h5py.File options: every allocation of 256 KiB or more (frame chunks, not metadata) on a page
ALIGNMENT = {"alignment_threshold": 256 << 10, "alignment_interval": DIRECT_ALIGN}


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


class _FrameWrites:
    """The writer thread's step: a batch of frames to its chunks.

    A batch on page boundaries (640x480 RGB is 225 pages; the file is made with chunks aligned,
    ``ALIGNMENT``) goes through a second descriptor opened ``O_DIRECT``, from one reused
    page-aligned buffer: the frames are written once and never read again here, and the
    buffered path (a copy into the page cache, dirty-page throttling, writeback) cost 2.5-6
    CPU-s of the kernel's per 2.2 GB on this loaded machine against 0.1-0.15 direct (1.4-1.7 s
    against 7.7-12.4 s wall). Anything else, or a file system that refuses ``O_DIRECT`` (tmpfs,
    EINVAL), takes the buffered path and starts its writeback.
    """

    def __init__(self, fd: int, path: str) -> None:
        self._out = DirectWrites(fd, path)
        self._stage: mmap.mmap | None = None

    def __call__(self, item: tuple[list[Any], int]) -> None:
        views, offset = item
        n = sum(memoryview(v).nbytes for v in views)
        if self._out.direct is None or offset % DIRECT_ALIGN or n % DIRECT_ALIGN:
            self._out.buffered(views, offset, n)
            return
        if self._stage is None or len(self._stage) < n:
            self._stage = mmap.mmap(-1, n)  # anonymous: page-aligned, reused for every batch
        stage = np.frombuffer(self._stage, np.uint8, n)
        pos = 0
        for v in views:  # numpy's copy releases the GIL
            a = np.frombuffer(v, np.uint8)
            stage[pos:pos + a.size] = a
            pos += a.size
        self._out.write([stage], offset, n)

    def close(self) -> None:
        self._out.close()


def background_writes(fd: int, path: str, depth: int = 2) -> tuple[Writes, _FrameWrites]:
    """``_FrameWrites`` on a thread of its own, at most ``depth`` batches behind the caller.

    The kernel's write path took 57% of the writer's wall time and the hash 27%; both release
    the GIL, so the caller hashes a batch while this thread writes the previous one. A failed
    write is raised by the next ``put`` or ``drain``. Close the step after the thread.
    """
    step = _FrameWrites(fd, path)
    return StepThread(step, "hdf5-writes", depth), step


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


def _flush(out: Writes, cam: CameraOut, hasher: RegionHasher | None) -> None:
    if not cam.batch:
        return
    if hasher is not None:
        hasher.data(cam.at, cam.batch)
    out.put((cam.batch, cam.at))
    cam.batch = []


def _take(out: Writes, cam: CameraOut, hasher: RegionHasher | None, episode_index: int) -> bool:
    """The camera's next frame into its batch; False once the camera has ended (counts checked)."""
    rows = len(cam.offsets)
    try:
        raw = cam.first if cam.n == 0 else next(cam.frames, None)
    except VideoError as exc:
        raise ExportError(f"episode {episode_index}: {cam.key}: {exc}") from exc
    if raw is None:
        _flush(out, cam, hasher)
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
        _flush(out, cam, hasher)
    if not cam.batch:
        cam.at = offset
    cam.batch.append(frame)
    cam.n += 1
    return True


def write_cameras(fd: int, path: str, cams: list[CameraOut], hasher: RegionHasher | None,
                  episode_index: int) -> None:
    """Every camera's frames, in file order (``cams`` are): one camera after the other, so every
    byte is hashed from the frame itself as it goes to the writer thread, none read back.
    ``fd`` is the file (``path``) h5py writes through."""
    out, step = background_writes(fd, path)
    try:
        for cam in cams:
            while _take(out, cam, hasher, episode_index):
                pass
        out.drain()
    finally:
        out.close()
        step.close()
