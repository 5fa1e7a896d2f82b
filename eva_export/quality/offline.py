"""The offline driver of the quality rules: evidence read from a dataset's own files.

``check_dataset`` reads a LeRobot v2.1, v3.0 or v2.0 dataset through the source seam
(formats/common/source.py: ``open_source(root).locate(root)``) episode by episode: its rows (its own
Parquet file, or its slice of a shared v3.0 file) and every camera's frames decoded one by one
(its MP4, or its frame range of a shared one). ``locate`` applies none of the export's source
validation, which refuses exactly the damage this check exists to name (off-grid or repeated
timestamps, a short video). One ``EpisodeEvidence`` per episode goes through
``judge.evaluate``, the code live capture runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ..formats.common.cut import seek_to_frame
from ..formats.common.meta import read_info
from ..formats.common.records import DatasetInfo, EpisodeRow, Feature, QualityIssue, Severity
from ..formats.common.source import Source, SourceKind
from ..formats.common.source_rules import SourceEpisode
from ..formats.sources import open_source
from .judge import evaluate
from .rules import (
    F64,
    OFFLINE_THRESHOLDS,
    CameraSeries,
    EpisodeEvidence,
    Finding,
    Thresholds,
    VectorSeries,
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
    kind: str = SourceKind.LEROBOT_V21  # a registered source kind (formats/sources.py)
    owned: bool = True  # verdicts may go into the rows (else only into the sidecar)


# ---- reading an episode of any source kind ---------------------------------------------------------------------
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


def _luma(frame: Any) -> NDArray[np.uint8]:
    """A decoded frame's luma plane, without a colour conversion (most of the cost)."""
    if frame.format.name not in ("yuv420p", "yuvj420p", "yuv422p", "yuv444p", "gray"):
        return np.asarray(frame.to_ndarray(format="gray"), np.uint8)
    plane = frame.planes[0]
    rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)
    return rows[:, : plane.width]


def luma_frames(path: Path, first: int = 0, count: int | None = None, fps: float = 0.0) -> Iterator[NDArray[np.uint8]]:
    """The luma plane of every decoded frame, or (``count``) of frames [first, first + count) of
    a file shared by episodes: frame k is the one shown at k / fps, as the v3.0 cut counts."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if count is None:
            for frame in container.decode(stream):
                yield _luma(frame)
            return
        tb = stream.time_base
        ratio = float(Fraction(tb) * Fraction(fps)) if tb is not None else 0.0
        if ratio:
            seek_to_frame(container, stream, first, int(fps))
        for pos, frame in enumerate(container.decode(stream)):
            pts = frame.pts
            if ratio and pts is None:
                continue  # an unstamped frame cannot be placed: the frame-count rule sees it missing
            k = round(pts * ratio) if ratio and pts is not None else pos  # no time base: counted (no seek)
            if k >= first + count:
                return
            if k >= first:
                yield _luma(frame)


def _camera(name: str, frames: Iterator[NDArray[np.uint8]]) -> CameraSeries:
    """Every decoded frame's change against the previous one (the live rule's signature)."""
    changes: list[float] = []
    prev = None
    try:
        for img in frames:
            sig = signature(img)
            changes.append(frame_change(prev, sig))
            prev = sig
    except (av.FFmpegError, OSError):
        pass  # a missing or unreadable file counts the frames it gave: the mismatch rule says so
    return CameraSeries(name, np.asarray(changes, np.float64), len(changes))


def _episode_table(ep: SourceEpisode) -> pa.Table:
    """The episode's rows; a slice of a shared file must hold exactly this episode's rows."""
    table = ep.read_table()
    ep.check_rows(table)
    return table


def episode_evidence(info: DatasetInfo, ep: SourceEpisode) -> EpisodeEvidence:
    """The evidence of one episode of any source kind: its rows (its own Parquet file or its
    slice of a shared one) and every camera's decoded frames (its file or its frame range)."""
    table = _episode_table(ep)
    ts: F64 | None = None
    if "timestamp" in table.column_names:
        ts = np.asarray(table.column("timestamp").to_numpy(), np.float64)
    vectors = tuple(_vector(k, table.column(k), f) for k, f in info.features.items()
                    if k in table.column_names and k not in NOT_SIGNALS and f.dtype in SIGNAL_DTYPES)
    cameras = []
    for key in info.video_keys:
        span = ep.camera_span(key)
        frames = luma_frames(span.path, span.first_frame, span.frames, info.fps)
        cameras.append(_camera(key, frames))
    return EpisodeEvidence(float(info.fps), table.num_rows, ts, vectors, tuple(cameras))


def source_inputs(root: Path) -> tuple[Source, DatasetInfo, Iterator[EpisodeInput]]:
    """The source at ``root`` (any kind), its info and its episodes as rule inputs, streamed.
    Only a source we own (v2.1) hands over its rows: the others keep no eva row."""
    source = open_source(root)
    info = read_info(root)

    def items() -> Iterator[EpisodeInput]:
        for ep in source.locate(root):
            yield EpisodeInput(ep.index, ep.row if source.owned else None, episode_evidence(info, ep))

    return source, info, items()


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
    """Every episode of a LeRobot v2.1, v3.0 or v2.0 dataset through the shared rules."""
    source, info, inputs = source_inputs(Path(root))
    return replace(check_inputs(Path(root), float(info.fps), inputs, th), kind=source.kind, owned=source.owned)
