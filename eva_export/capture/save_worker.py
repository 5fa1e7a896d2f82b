"""The capture's save worker (a part of Recorder): finishes the encoders, commits each queued
episode through its DatasetWriter, and appends the per-episode diagnostics to the stats file.

A mixin, because the save queue's depth and the last-episode fields are shared with the
lifecycle under Recorder's one lock.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import CollectionConfig
from ..dataset.records import EpisodeRow
from ..fsutil import storage_guard
from .checks import QualityResult
from .episode import EpisodeRun

log = logging.getLogger(__name__)


@dataclass
class SaveJob:
    """One stopped episode waiting in the save queue."""

    ep: EpisodeRun
    rows: int
    expected_index: int
    stopped_at: float
    callback_latency_s: dict[str, list[float]]
    overflow: int


class SaveWorker:
    """The save worker's loop and stats file (mixed into Recorder, which starts its thread)."""

    col: CollectionConfig
    clock: Callable[[], float]
    stats_file: Path | None
    save_delay_s: float
    last_index: int
    last_quality: str
    last_message: str
    _lock: threading.Lock
    _save_q: queue.Queue[SaveJob | None]
    _save_depth: int
    _pending: dict[str, int]

    def _save_loop(self) -> None:
        while True:
            job = self._save_q.get()
            if job is None:
                return
            ep = job.ep
            try:
                t_begin = self.clock()
                if self.save_delay_s > 0:
                    time.sleep(self.save_delay_s)
                with storage_guard(ep.dw.root, f"saving episode {job.expected_index} into"):
                    row, result = ep.save()
                committed = self.clock()
                if row is None:
                    self.last_quality, self.last_message = "empty", "zero-frame episode: nothing written"
                else:
                    self.last_index, self.last_quality = row.episode_index, result.quality
                    self.last_message = (f"episode {row.episode_index} saved: {row.length} frames, "
                                         f"{result.quality}" + (f" ({', '.join(result.codes)})" if result.codes else ""))
                    if row.episode_index != job.expected_index:
                        log.warning("episode saved as %d, announced as %d", row.episode_index, job.expected_index)
                    log.info(self.last_message)
                    self._write_stats(job, row, result, t_begin, committed)
            except Exception as exc:
                log.exception("saving an episode failed")
                self.last_quality, self.last_message = "failed", (f"saving episode {job.expected_index} failed, it is "
                                                                  f"not in the dataset: {exc}")
                try:
                    ep.writer.abort()
                except Exception:  # noqa: BLE001
                    pass
            finally:
                with self._lock:
                    self._save_depth -= 1
                    self._pending[ep.dataset_name] -= 1

    def _write_stats(self, job: SaveJob, row: EpisodeRow, result: QualityResult, t_begin: float,
                     committed: float) -> None:
        if self.stats_file is None:
            return
        ep = job.ep
        duration = row.length / self.col.fps
        lat = {}
        for name, vals in job.callback_latency_s.items():
            if vals:
                arr = np.asarray(vals)
                lat[name] = {"n": int(arr.size), "p50_ms": float(np.percentile(arr, 50) * 1e3),
                             "p99_ms": float(np.percentile(arr, 99) * 1e3), "max_ms": float(arr.max() * 1e3)}
        encode_s = ep.writer.encode_seconds()
        enc = {k: (duration / v if v > 0 else math.inf) for k, v in encode_s.items()}
        rec = {"dataset": ep.dataset_name, "episode_index": row.episode_index, "frames": row.length,
               "duration_s": duration, "quality": result.quality, "codes": result.codes,
               "stream_stats": result.stream_stats, "callback_latency": lat,
               "stop_to_durable_s": committed - job.stopped_at, "save_s": committed - t_begin,
               "encode_seconds": encode_s, "encode_speed_x_realtime": enc,
               "intake_overflow": job.overflow}
        try:
            self.stats_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.stats_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
        except OSError as exc:
            log.warning("cannot write capture stats to %s: %s", self.stats_file, exc)
