"""The capture's save worker (a part of Recorder): finishes the encoders, commits each queued
episode through its DatasetWriter, and appends the per-episode diagnostics to the stats file.

A mixin, because the save queue's depth and the last-episode fields are shared with the
lifecycle under Recorder's one lock.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import faults
from ..config import CollectionConfig
from ..formats.common.records import EpisodeRow
from ..fsutil import storage_guard
from .checks import QualityResult
from .episode import EpisodeRun

log = logging.getLogger(__name__)

#: Niceness of the save worker thread (Linux: per thread), above recording's.
SAVE_NICE = 5
#: Seconds between attempts to save a take whose save failed (a full disk being freed).
SAVE_RETRY_S = 2.0


def save_seam() -> tuple[float, Path | None]:
    """(delay in seconds, hold directory): the save worker's fault points (``eva_export/faults.py``)."""
    hold = faults.from_env("save_hold")
    return float(faults.from_env("save_delay") or 0), Path(hold) if hold else None


def _held(hold: Path, index: int, attempt: int) -> None:
    (hold / f"held-{index}-{attempt}").write_text("", encoding="utf-8")
    with open(hold / "release", encoding="utf-8") as fh:
        word = fh.read().strip()
    if word == "fail":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(hold))


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
    save_hold: Path | None
    last_index: int
    last_take_id: str
    last_quality: str
    last_message: str
    _lock: threading.Lock
    _save_q: queue.Queue[SaveJob | None]
    _save_depth: int
    _closed: threading.Event

    def _save_loop(self) -> None:
        try:  # a backlog of saves yields the CPU to the intake and align threads (recording)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SAVE_NICE)
        except OSError as exc:
            log.warning("cannot lower the save worker's priority: %s", exc)
        halted = ""  # why the takes still queued cannot be saved (set once one was lost)
        while True:
            job = self._save_q.get()
            if job is None:
                return
            try:
                if halted:  # saving it would put it below a lost take's index: reported instead
                    self._lose(job, halted)
                elif not self._save_until_done(job):
                    halted = (f"the take before it (episode {job.expected_index}) could not be saved before the "
                              f"capture closed")
            finally:
                with self._lock:
                    self._save_depth -= 1

    def _save_until_done(self, job: SaveJob) -> bool:
        """Save ``job``; a failed save (a full disk) is retried, the take kept and the takes behind
        it waiting, so every STOP reply's index stays true. False: lost at close (reported)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                self._save_once(job, attempt)
                return True
            except Exception as exc:
                log.exception("saving episode %d failed (attempt %d)", job.expected_index, attempt)
                with self._lock:
                    behind = self._save_depth - 1
                self.last_quality, self.last_message = "failed", (
                    f"saving episode {job.expected_index} failed, retrying every {SAVE_RETRY_S:g} s; the take is "
                    f"kept and {behind} take(s) wait behind it with their indices: {exc}")
                if self._closed.wait(SAVE_RETRY_S):
                    self._lose(job, f"its save failed and the capture closed: {exc}")
                    return False

    def _save_once(self, job: SaveJob, attempt: int) -> None:
        ep = job.ep
        t_begin = self.clock()
        if self.save_delay_s > 0:
            time.sleep(self.save_delay_s)
        with storage_guard(ep.dw.root, f"saving episode {job.expected_index} into"):
            if self.save_hold is not None:
                _held(self.save_hold, job.expected_index, attempt)
            row, result = ep.save()
        committed = self.clock()
        if row is None:
            self.last_quality, self.last_message = "empty", "zero-frame episode: nothing written"
            return
        self.last_index, self.last_take_id, self.last_quality = row.episode_index, row.take_id, result.quality
        self.last_message = (f"episode {row.episode_index} saved: {row.length} frames, "
                             f"{result.quality}" + (f" ({', '.join(result.codes)})" if result.codes else ""))
        log.info(self.last_message)
        self._write_stats(job, row, result, t_begin, committed)

    def _lose(self, job: SaveJob, reason: str) -> None:
        """The take will not be saved: its promised index is reported lost (status, log, dataset)."""
        self.last_quality, self.last_message = "failed", (
            f"episode {job.expected_index} (take {job.ep.writer.staging.name}) was not saved and is not in the "
            f"dataset: {reason}")
        log.error(self.last_message)
        try:
            job.ep.dw.give_up(job.ep.writer, reason)
        except Exception:  # noqa: BLE001 - the loss above is what is reported
            log.exception("cannot record the loss of episode %d", job.expected_index)

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
