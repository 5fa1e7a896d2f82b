"""One episode streamed into its staging directory: the table columns in memory, one MP4
per camera encoded frame by frame in a thread per camera (or, for a camera whose rows are the
source's own H.264 frames, the source's packets copied: video_copy.py). ``DatasetWriter.commit`` (writer.py)
moves the finished episode into the dataset."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ...errors import DatasetError, VideoError
from ..common import stats as stats_mod
from ..common.records import DEFAULT_FEATURES, DatasetInfo, Feature
from ..common.video import VideoEncoder, VideoSettings
from .video_copy import PacketCopy

_DEFAULT_KEYS = tuple(DEFAULT_FEATURES)


class _CameraThread:
    """Encodes one camera's frames off the caller's thread; the queue bounds memory."""

    def __init__(self, path: Path, feature: Feature, fps: int, settings: VideoSettings, depth: int) -> None:
        h, w = feature.shape[0], feature.shape[1]
        self.encoder = VideoEncoder(path, w, h, fps, settings)
        self.fps = fps
        self.copy: PacketCopy | None = None  # copying the source's packets (until a row is not one)
        self.stats = stats_mod.ImageStats()
        #: seconds spent inside the encoder (the capture's encoding-speed diagnostic reads it)
        self.encode_s = 0.0
        self.q: queue.Queue[tuple[NDArray[Any], bytes | None] | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"encode-{path.stem}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is not None:
                continue  # keep draining so the producer never blocks on a dead encoder
            frame, packet = item
            try:
                t = time.perf_counter()
                self._write(frame, packet)
                self.encode_s += time.perf_counter() - t
                self.stats.add(frame)
            except BaseException as exc:  # noqa: BLE001 - reported by finish()
                self.error = exc

    def _write(self, frame: NDArray[Any], packet: bytes | None) -> None:
        if packet is not None and self.copy is None and self.encoder.frames == 0:
            self.copy = PacketCopy(self.encoder.path, self.fps)  # the first row is a source packet
        if self.copy is not None:
            if packet is not None:
                self.copy.add(packet)
                return
            # a row that is not the source's next frame (a repeat, a drop): the episode is encoded
            # after all, starting with the frames copied so far (decoded: the same pixels)
            copy, self.copy = self.copy, None
            try:
                for img in copy.decoded():
                    self.encoder.add(img)
            finally:
                copy.discard()
        self.encoder.add(frame)

    def put(self, frame: NDArray[Any], packet: bytes | None = None) -> None:
        self.q.put((frame, packet))

    def finish(self) -> int:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            self.abort_files()
            raise VideoError(f"encoding {self.encoder.path.name} failed: {self.error}") from self.error
        if self.copy is not None:
            self.encoder.abort()  # opened for nothing: the copy writes the MP4
            return self.copy.close()
        return self.encoder.close()

    def abort_files(self) -> None:
        self.encoder.abort()
        if self.copy is not None:
            self.copy.discard()

    def abort(self) -> None:
        self.error = self.error or RuntimeError("aborted")
        self.q.put(None)
        self.thread.join()
        self.abort_files()


@dataclass
class FinishedEpisode:
    rows: int
    video_frames: dict[str, int]
    image_stats: dict[str, dict[str, Any]] = field(default_factory=dict)


class EpisodeWriter:
    """Streams one episode into staging. Not thread-safe: one producer thread."""

    def __init__(self, staging: Path, info: DatasetInfo, task: str, settings: VideoSettings,
                 queue_depth: int = 30) -> None:
        self.staging = staging
        self.info = info
        self.task = task
        staging.mkdir(parents=True, exist_ok=False)
        self._columns: dict[str, list[NDArray[Any]]] = {
            k: [] for k in info.table_keys if k not in _DEFAULT_KEYS}
        self._cams = {k: _CameraThread(staging / f"{k}.mp4", info.features[k], info.fps, settings, queue_depth)
                      for k in info.video_keys}
        self.rows = 0
        self.finished: FinishedEpisode | None = None

    def add_frame(self, values: dict[str, Any], images: dict[str, NDArray[Any]],
                  packets: dict[str, bytes | None] | None = None) -> None:
        """Append one grid frame: every non-default table feature and every camera image
        (``packets``: per H.264 camera, the source packet the image was decoded from, when the
        video can still be the source's own; None otherwise)."""
        for key, col in self._columns.items():
            if key not in values:
                raise DatasetError(f"frame {self.rows} lacks feature {key!r}")
            col.append(np.asarray(values[key]).reshape(self.info.features[key].shape))
        if images.keys() != self._cams.keys():
            # never drop a camera silently: its video would lack the frames the table has
            raise DatasetError(f"frame {self.rows} has images for {sorted(images)}, the dataset's "
                               f"cameras are {sorted(self._cams)}")
        for key, cam in self._cams.items():
            cam.put(images[key], packets.get(key) if packets else None)
        self.rows += 1

    def finish(self) -> FinishedEpisode:
        """Close every encoder; returns row and video frame counts (checked by the caller)."""
        if self.finished is None:
            counts: dict[str, int] = {}
            stats: dict[str, dict[str, Any]] = {}
            errors = []
            for key, cam in self._cams.items():
                try:
                    counts[key] = cam.finish()
                    if counts[key]:
                        stats[key] = cam.stats.to_dict()
                except VideoError as exc:
                    errors.append(str(exc))
            if errors:
                raise VideoError("; ".join(errors))
            self.finished = FinishedEpisode(self.rows, counts, stats)
        return self.finished

    def failure(self) -> str:
        """Why an encoder already failed (a full disk while recording), or ""."""
        return "; ".join(f"{k}: {cam.error}" for k, cam in self._cams.items() if cam.error is not None)

    def encode_seconds(self) -> dict[str, float]:
        """Seconds each camera's encoder has been busy so far (feature key -> seconds)."""
        return {k: cam.encode_s for k, cam in self._cams.items()}

    def columns(self) -> dict[str, NDArray[Any]]:
        return {k: np.stack(v) if v else np.zeros((0,) + self.info.features[k].shape)
                for k, v in self._columns.items()}

    def abort(self) -> None:
        for cam in self._cams.values():
            cam.abort()
        shutil.rmtree(self.staging, ignore_errors=True)
