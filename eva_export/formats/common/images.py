"""Camera frames of a source episode: decoded from its MP4 or from Parquet image bytes, and
prefetched in a thread so decoding overlaps with writing."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ...errors import ExportError
from .meta import DatasetMeta
from .records import DatasetInfo
from .video import iter_frames


def parquet_image_keys(info: DatasetInfo) -> list[str]:
    """Features stored as images inside the Parquet table (LeRobot's ``use_videos=False``)."""
    return [k for k, f in info.features.items() if f.dtype == "image"]

def decode_png(data: bytes, where: str) -> NDArray[Any]:
    """One encoded image (PNG, as LeRobot embeds it; any still format FFmpeg knows) as RGB uint8."""
    import av  # PyAV decodes the image; no Pillow needed

    for name in ("png", "mjpeg"):
        if name == "mjpeg" and not data.startswith(b"\xff\xd8"):
            continue
        if name == "png" and not data.startswith(b"\x89PNG"):
            continue
        try:
            cc = av.CodecContext.create(name, "r")
            frames = cc.decode(av.Packet(data))
            if frames:
                return np.asarray(frames[0].to_ndarray(format="rgb24"))
        except av.FFmpegError as exc:
            raise ExportError(f"{where}: undecodable image ({exc})") from exc
    raise ExportError(f"{where}: not a PNG or JPEG image ({len(data)} bytes)")

def iter_table_images(table: pa.Table, key: str, where: str) -> Iterator[NDArray[Any]]:
    """The frames of an image column (``struct<bytes, path>`` per row), decoded one at a time."""
    col = table.column(key)
    for i in range(table.num_rows):
        value = col[i].as_py()
        data = value.get("bytes") if isinstance(value, dict) else value
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise ExportError(f"{where}: {key} row {i} holds no embedded image bytes")
        yield decode_png(bytes(data), f"{where}: {key} row {i}")

def camera_frames(meta: DatasetMeta, episode_index: int, table: pa.Table, key: str) -> Iterator[NDArray[Any]]:
    """One camera's frames of one episode, from its MP4 or from its Parquet image column."""
    if meta.info.features[key].dtype == "image":
        return iter_table_images(table, key, f"episode {episode_index}")
    return iter_frames(meta.video_path(key, episode_index))

class Prefetch:
    """Run a frame iterator in a background thread, at most ``depth`` frames ahead.

    Decoding (PyAV releases the GIL) then overlaps with writing in the caller's thread while
    memory stays bounded to ``depth`` frames. Errors of the iterator are re-raised by
    ``next``; ``close`` stops the thread and drops what it had queued.
    """

    _END = object()

    def __init__(self, it: Iterator[NDArray[Any]], depth: int = 4, name: str = "prefetch") -> None:
        self._it = it
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._it:
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._error = exc
        finally:
            close = getattr(self._it, "close", None)
            if close is not None:
                close()
            while not self._stop.is_set():
                try:
                    self._q.put(self._END, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def __iter__(self) -> Prefetch:
        return self

    def __next__(self) -> NDArray[Any]:
        item = self._q.get()
        if item is self._END:
            self._q.put(self._END)  # stay exhausted
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
