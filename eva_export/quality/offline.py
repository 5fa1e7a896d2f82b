"""The offline driver of the quality rules: evidence read from a dataset's own files.

``check_dataset`` reads a LeRobot v2.1 dataset episode by episode (its Parquet table, every
camera's MP4 decoded frame by frame) without the export's source validation, which refuses
exactly the damage this check exists to name (off-grid or repeated timestamps). One
``EpisodeEvidence`` per episode goes through ``rules.evaluate``, the code live capture runs.
Another source kind plugs in by yielding ``EpisodeInput`` records (``check_inputs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ..dataset.meta import DatasetMeta, read_meta
from ..dataset.records import EpisodeRow, Feature, QualityIssue, Severity
from ..errors import DatasetError
from .rules import (
    F64,
    OFFLINE_THRESHOLDS,
    CameraSeries,
    EpisodeEvidence,
    Finding,
    Thresholds,
    VectorSeries,
    evaluate,
    frame_change,
    signature,
)

#: Table columns that are bookkeeping, not signals (capture_time is the observed clock).
NOT_SIGNALS = ("timestamp", "frame_index", "episode_index", "index", "task_index", "capture_time")
SIGNAL_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class EpisodeInput:
    """One episode as any source reader hands it over: its row and its evidence."""

    episode_index: int
    row: EpisodeRow | None  # None: the source keeps no eva row (v3.0 / v2.0 readers)
    evidence: EpisodeEvidence


@dataclass(frozen=True)
class EpisodeCheck:
    episode_index: int
    findings: tuple[Finding, ...]
    stream_stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def quality(self) -> str:
        return "red" if any(f.severity == Severity.ERROR for f in self.findings) else "green"

    @property
    def issues(self) -> list[QualityIssue]:
        return [f.issue("offline") for f in self.findings]


@dataclass(frozen=True)
class DatasetCheck:
    root: Path
    fps: float
    episodes: tuple[EpisodeCheck, ...]
    rows: dict[int, EpisodeRow] = field(default_factory=dict)  # the source rows, when it has them


# ---- reading a v2.1 episode ---------------------------------------------------------------------
def _vector(name: str, col: pa.ChunkedArray, feature: Feature) -> VectorSeries:
    arr = col.combine_chunks()
    n = len(arr)
    dims = feature.shape[0] if feature.shape else 1
    if pa.types.is_fixed_size_list(arr.type):
        flat = np.asarray(arr.flatten().to_numpy(zero_copy_only=False), np.float64)
        return VectorSeries(name, flat.reshape(n, arr.type.list_size), dim_names=_names(feature))
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        # a variable-length list column can change width from row to row: the evidence keeps it
        lists = arr.to_pylist()
        widths = np.array([len(v) if v is not None else 0 for v in lists], np.int64)
        vals = np.full((n, dims), np.nan)
        for k, v in enumerate(lists):
            if v is not None and len(v) == dims:
                vals[k] = np.asarray(v, np.float64)
        return VectorSeries(name, vals, widths, dim_names=_names(feature))
    scalar = np.asarray(arr.to_numpy(zero_copy_only=False), np.float64).reshape(n, 1)
    return VectorSeries(name, scalar, dim_names=_names(feature))


def _names(feature: Feature) -> tuple[str, ...]:
    names = feature.names
    if isinstance(names, dict):  # LeRobot's {"motors": [...]} form
        names = next(iter(names.values()), [])
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


def luma_frames(path: Path) -> Iterator[NDArray[np.uint8]]:
    """The luma plane of every decoded frame, without a colour conversion (most of the cost)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            if frame.format.name not in ("yuv420p", "yuvj420p", "yuv422p", "yuv444p", "gray"):
                yield np.asarray(frame.to_ndarray(format="gray"), np.uint8)
                continue
            plane = frame.planes[0]
            rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)
            yield rows[:, : plane.width]


def _camera(name: str, path: Path) -> CameraSeries:
    """Every decoded frame's change against the previous one (the live rule's signature)."""
    changes: list[float] = []
    prev = None
    try:
        for img in luma_frames(path):
            sig = signature(img)
            changes.append(frame_change(prev, sig))
            prev = sig
    except (av.FFmpegError, OSError):
        pass  # a missing or unreadable file counts the frames it gave: the mismatch rule says so
    return CameraSeries(name, np.asarray(changes, np.float64), len(changes))


def v21_evidence(meta: DatasetMeta, row: EpisodeRow) -> EpisodeEvidence:
    """The evidence of one v2.1 episode, read from its Parquet table and MP4 files."""
    info = meta.info
    path = meta.data_path(row.episode_index)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: cannot read episode {row.episode_index}: {exc}") from exc
    ts: F64 | None = None
    if "timestamp" in table.column_names:
        ts = np.asarray(table.column("timestamp").to_numpy(), np.float64)
    vectors = tuple(_vector(k, table.column(k), f) for k, f in info.features.items()
                    if k in table.column_names and k not in NOT_SIGNALS and f.dtype in SIGNAL_DTYPES)
    cameras = tuple(_camera(k, meta.video_path(k, row.episode_index)) for k in info.video_keys)
    return EpisodeEvidence(float(info.fps), table.num_rows, ts, vectors, cameras)


def v21_inputs(root: Path) -> Iterator[EpisodeInput]:
    meta = read_meta(root)
    for row in meta.episodes:
        yield EpisodeInput(row.episode_index, row, v21_evidence(meta, row))


# ---- checking -------------------------------------------------------------------------------
def stream_stats(ev: EpisodeEvidence) -> dict[str, dict[str, Any]]:
    """What the offline check measured per stream (beside capture's transport statistics)."""
    out: dict[str, dict[str, Any]] = {}
    for v in ev.vectors:
        finite = np.all(np.isfinite(v.values), axis=1) if v.values.size else np.ones(0, bool)
        out[v.name] = {"rows": int(v.values.shape[0]), "non_finite_rows": int((~finite).sum())}
    for c in ev.cameras:
        out[c.name] = {"video_frames": c.video_frames}
    if ev.timestamps is not None and ev.timestamps.size > 1:
        d = np.diff(ev.timestamps)
        out["timestamp"] = {"rows": int(ev.timestamps.size), "max_step_s": round(float(d.max()), 6),
                            "min_step_s": round(float(d.min()), 6)}
    return out


def check_inputs(root: Path, fps: float, inputs: Iterable[EpisodeInput],
                 th: Thresholds = OFFLINE_THRESHOLDS) -> DatasetCheck:
    episodes: list[EpisodeCheck] = []
    rows: dict[int, EpisodeRow] = {}
    for item in inputs:
        found = tuple(evaluate(item.evidence, th))
        episodes.append(EpisodeCheck(item.episode_index, found, stream_stats(item.evidence)))
        if item.row is not None:
            rows[item.episode_index] = item.row
    return DatasetCheck(root, fps, tuple(episodes), rows)


def check_dataset(root: Path, th: Thresholds = OFFLINE_THRESHOLDS) -> DatasetCheck:
    """Every episode of a v2.1 dataset through the shared rules."""
    meta = read_meta(root)
    return check_inputs(Path(root), float(meta.info.fps), v21_inputs(root), th)
