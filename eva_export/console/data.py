"""Read-only views of the raw datasets under log_dir, for the console and the health report.

Nothing here writes a dataset or decides a quality rule: verdicts go through the capture
node's review service, and quality comes from the episode rows as capture wrote them. This
module only resolves paths (confined to log_dir, symlinks followed), reads meta files and the
per-episode Parquet columns the plots need, and finds where the data says a red reason happened.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import check_name, inside
from ..errors import DatasetError, UnsafeNameError
from ..formats.common.meta import INFO, read_info, read_meta
from ..formats.common.records import DatasetInfo, EpisodeRow, Quality

#: Vector features the plots show, in this order, when the dataset has them.
PLOT_FEATURES = ("observation.state", "action", "observation.ee_pose")
#: Keys an issue or a stream_stats entry may use to say where something happened (frame indices).
FRAME_KEYS = ("frames", "frame_indices", "dropped_frames", "late_frames", "frozen_frames")
RANGE_KEYS = ("ranges", "frame_ranges", "frozen_runs", "drop_ranges")


class OutsideRoots(UnsafeNameError):
    """A requested path resolves outside the data roots (or is not a file the console serves)."""


@dataclass(frozen=True)
class DatasetSummary:
    name: str
    root: Path
    episodes: int
    frames: int
    fps: int
    red: int
    unreviewed: int
    error: str = ""


def dataset_root(log_dir: Path, name: str) -> Path:
    """``<log_dir>/<name>/raw``, refused unless it resolves inside log_dir."""
    check_name(name)
    root = Path(log_dir) / name / "raw"
    if not inside(log_dir, root):
        raise OutsideRoots(f"dataset {name!r} resolves outside the data root {log_dir}")
    return root


def dataset_exists(log_dir: Path, name: str) -> bool:
    """Whether ``name`` is a dataset the console can show (its meta/info.json is there)."""
    return (dataset_root(log_dir, name) / INFO).is_file()


def list_datasets(log_dir: Path) -> list[DatasetSummary]:
    """Every ``<log_dir>/<name>/raw`` that holds meta/info.json, sorted by name."""
    out: list[DatasetSummary] = []
    try:
        names = sorted(os.listdir(log_dir))
    except OSError:
        return out
    for name in names:
        try:
            root = dataset_root(log_dir, name)
        except UnsafeNameError:
            continue  # hidden dirs (.jobs) and anything escaping log_dir
        if not (root / INFO).is_file():
            continue
        try:
            meta = read_meta(root)
        except DatasetError as exc:
            out.append(DatasetSummary(name, root, 0, 0, 0, 0, 0, error=str(exc)))
            continue
        eps = meta.episodes
        out.append(DatasetSummary(
            name, root, len(eps), sum(e.length for e in eps), meta.info.fps,
            sum(1 for e in eps if e.quality == Quality.RED), sum(1 for e in eps if not e.qc_verdict)))
    return out


def confined_file(log_dir: Path, name: str, rel: str, suffixes: tuple[str, ...] = (".mp4",)) -> Path:
    """The file ``rel`` of dataset ``name``; refused unless it resolves (symlinks followed)
    inside both the dataset root and log_dir, is a regular file and has an allowed suffix."""
    root = dataset_root(log_dir, name)
    if "\x00" in rel or rel.startswith("/"):
        raise OutsideRoots(f"path {rel!r} is refused")
    path = Path(os.path.realpath(root / rel))
    if not (inside(root, path) and inside(log_dir, path)):
        raise OutsideRoots(f"path {rel!r} resolves outside the data root")
    if path.suffix.lower() not in suffixes or not path.is_file():
        raise OutsideRoots(f"path {rel!r} is not a served file")
    return path


def episode_rows(root: Path) -> tuple[DatasetInfo, list[EpisodeRow]]:
    meta = read_meta(root)
    return meta.info, meta.episodes


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _frames_from(d: dict[str, Any], length: int) -> list[list[int]]:
    """Frame ranges [first, last] named by an issue or stream entry, clipped to the episode."""
    spans: list[list[int]] = []
    for key in FRAME_KEYS:
        for f in d.get(key) or () if isinstance(d.get(key), list) else ():
            if isinstance(f, (int, float)) and 0 <= int(f) < max(length, 1):
                spans.append([int(f), int(f)])
    for key in RANGE_KEYS:
        for r in d.get(key) or () if isinstance(d.get(key), list) else ():
            if isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(v, (int, float)) for v in r):
                a, b = int(r[0]), int(r[1])
                if b >= a >= 0:
                    spans.append([a, min(b, max(length - 1, 0))])
    for a_key, b_key in (("start_frame", "end_frame"), ("first_frame", "last_frame")):
        if isinstance(d.get(a_key), (int, float)):
            a = int(d[a_key])
            b = int(d[b_key]) if isinstance(d.get(b_key), (int, float)) else a
            spans.append([a, max(a, b)])
    return spans


def episode_markers(row: EpisodeRow, nonfinite: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Timeline marks: every red reason or stream entry that says which frames, plus the frames
    with NaN/inf values found in the data. Reasons without a 'when' are not marked (listed only)."""
    marks: list[dict[str, Any]] = []
    fields = row.fields_dict()  # typed issues as dicts, or a foreign row's value as it is
    for issue in fields.get("quality_issues") or []:
        if isinstance(issue, dict):
            for a, b in _frames_from(issue, row.length):
                marks.append({"code": str(issue.get("code", "")), "from": a, "to": b,
                              "detail": str(issue.get("detail", ""))})
    stats = fields.get("stream_stats")
    if isinstance(stats, dict):
        for stream, st in stats.items():
            if isinstance(st, dict):
                for a, b in _frames_from(st, row.length):
                    marks.append({"code": f"{stream}", "from": a, "to": b, "detail": f"{stream} drop/late"})
    for feature, frames in nonfinite.items():
        for a, b in _runs(frames):
            marks.append({"code": "non_finite", "from": a, "to": b,
                          "detail": f"{feature}: NaN or inf in frames {a}..{b}"})
    return _merge(marks)


def _merge(marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent or overlapping marks of the same code and detail become one span."""
    out: list[dict[str, Any]] = []
    for m in sorted(marks, key=lambda m: (m["code"], m["detail"], m["from"])):
        last = out[-1] if out else None
        if last and last["code"] == m["code"] and last["detail"] == m["detail"] and m["from"] <= last["to"] + 1:
            last["to"] = max(last["to"], m["to"])
        else:
            out.append(dict(m))
    return sorted(out, key=lambda m: m["from"])


def _runs(frames: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for f in frames:
        if runs and f == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], f)
        else:
            runs.append((f, f))
    return runs


def feature_arrays(root: Path, info: DatasetInfo, episode_index: int) -> dict[str, Any]:
    """The plotted vector features of one episode as float64 arrays (frames x elements), read
    from its Parquet file (only those columns)."""
    import numpy as np
    import pyarrow.parquet as pq

    path = root / info.data_file(episode_index)
    if not inside(root, path) or not path.is_file():
        raise DatasetError(f"{path}: missing")
    wanted = [k for k in PLOT_FEATURES if k in info.features]
    try:
        table = pq.read_table(path, columns=wanted)
        out: dict[str, Any] = {}
        for key in wanted:
            col = table.column(key).combine_chunks()
            arr = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
            out[key] = arr.reshape(-1, int(np.prod(info.features[key].shape)) or 1)
    except Exception as exc:  # noqa: BLE001 - pyarrow and numpy raise several types for a damaged file
        raise DatasetError(f"{path}: cannot read ({exc})") from exc
    return out


def element_names(info: DatasetInfo, key: str, width: int) -> list[str]:
    """The joint names info.json gives a feature ("names"), else ``key[j]``."""
    names: Any = info.features[key].names
    if isinstance(names, dict):  # LeRobot sometimes nests {"motors": [...]}
        names = next(iter(names.values()), None)
    if not isinstance(names, list) or len(names) != width:
        return [f"{key}[{j}]" for j in range(width)]
    return [str(n) for n in names]


def episode_series(root: Path, info: DatasetInfo, episode_index: int) -> dict[str, Any]:
    """The plotted vectors of one episode.

    Returns ``{"series": {feature: {"names": [...], "values": [[...] per frame]}},
    "nonfinite": {feature: [frames]}}``; NaN/inf become null so the JSON stays valid.
    """
    import numpy as np

    series: dict[str, Any] = {}
    nonfinite: dict[str, list[int]] = {}
    for key, arr in feature_arrays(root, info, episode_index).items():
        bad = ~np.isfinite(arr)
        if bad.any():
            nonfinite[key] = [int(i) for i in np.nonzero(bad.any(axis=1))[0]]
        values = [[_finite_or_none(float(f"{v:.7g}")) for v in frame] for frame in arr]
        series[key] = {"names": element_names(info, key, arr.shape[1]), "values": values}
    return {"series": series, "nonfinite": nonfinite}


def camera_files(root: Path, info: DatasetInfo, episode_index: int) -> list[dict[str, Any]]:
    """Per camera: key, path relative to the dataset root, codec, and whether the file exists."""
    out = []
    for key in info.video_keys:
        rel = info.video_file(key, episode_index)
        feat_info = info.features[key].info or {}
        out.append({"key": key, "rel": rel, "codec": str(feat_info.get("video.codec", "")),
                    "exists": (root / rel).is_file()})
    return out


def read_info_of(log_dir: Path, name: str) -> tuple[Path, DatasetInfo]:
    root = dataset_root(log_dir, name)
    return root, read_info(root)
