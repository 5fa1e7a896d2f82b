"""A source kind that lives in the tests only: a tiny CSV dataset, one file per episode.

It proves what adding a source costs: this module (a source class that recognises its
directories, validates them into a ``SourceCheck`` and locates its episodes, and an episode
class that reads its own rows) plus one ``SourceSpec`` in the registry; the split, every
export format, their verifiers and the publication take it from there.

On disk::

    csv_dataset.json   {"fps": 10, "robot_type": "...", "joints": ["j0", ...],
                        "camera": {"width": 32, "height": 24},
                        "episodes": [{"file": "episode_000000.csv", "video": "episode_000000.mp4",
                                      "task": "...", "quality": "green"}]}
    episode_000000.csv header state.<joint>..., action.<joint>...; one row per frame
    episode_000000.mp4 the camera (when "camera": {"width": w, "height": h}): one frame per row
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from eva_export import confine
from eva_export.errors import DatasetError
from eva_export.formats.common.meta import DatasetMeta
from eva_export.formats.common.records import DatasetInfo, EpisodeRow, Feature, TaskRow
from eva_export.formats.common.source import SourceCheck
from eva_export.formats.common.source_rules import SourceEpisode
from eva_export.formats.common.table import column, schema
from eva_export.formats.lerobot_v21.writer import make_features

KIND = "tiny_csv"
MARKER = "csv_dataset.json"
CAMERA = "observation.images.cam"


@dataclass(frozen=True)
class CsvMeta:
    fps: int
    robot_type: str
    joints: tuple[str, ...]
    episodes: tuple[dict[str, Any], ...]
    camera: tuple[int, int] | None = None  # (height, width)

    @property
    def header(self) -> list[str]:
        return [f"state.{j}" for j in self.joints] + [f"action.{j}" for j in self.joints]

    def features(self) -> dict[str, Feature]:
        n = len(self.joints)
        feats = {"observation.state": Feature("float32", (n,), list(self.joints)),
                 "action": Feature("float32", (n,), list(self.joints))}
        if self.camera is not None:
            feats[CAMERA] = Feature.video(*self.camera, self.fps)
        return make_features(feats)


def read_csv_meta(root: Path) -> CsvMeta:
    path = root / MARKER
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        cam = d.get("camera")
        meta = CsvMeta(int(d["fps"]), str(d.get("robot_type", "csv")), tuple(str(j) for j in d["joints"]),
                       tuple(dict(e) for e in d["episodes"]),
                       None if cam is None else (int(cam["height"]), int(cam["width"])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc})") from exc
    if meta.fps <= 0 or not meta.joints:
        raise DatasetError(f"{path}: fps must be positive and joints must name at least one joint")
    return meta


def _values(path: Path, index: int, header: list[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The episode's rows as float32 (frames x columns); errors name the file and the episode."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        if not rows or rows[0] != header:
            raise ValueError(f"header {rows[0] if rows else []}, expected {header}")
        values = np.array([[float(v) for v in r] for r in rows[1:]], dtype=np.float32).reshape(-1, len(header))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"episode {index}: {path}: {exc}") from exc
    if not len(values):
        raise DatasetError(f"episode {index}: {path} has no rows")
    return values


@dataclass
class CsvEpisode(SourceEpisode):
    """An episode whose rows are a CSV file: it builds the v2.1 table from them."""

    fps: int = 1
    joints: int = 1
    task_index: int = 0

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        meta = read_csv_meta(self.data_path.parent)
        values = _values(self.data_path, self.index, meta.header)
        n, sch = len(values), schema(meta.features())
        cols = {"observation.state": values[:, :self.joints], "action": values[:, self.joints:],
                "timestamp": np.arange(n, dtype=np.float32) / self.fps, "frame_index": np.arange(n),
                "episode_index": np.full(n, self.index), "index": np.arange(n),
                "task_index": np.full(n, self.task_index)}
        table = pa.Table.from_arrays([column(cols[f.name], f.type) for f in sch], schema=sch)
        return table if columns is None else table.select(columns)


class CsvSource:
    kind = KIND
    owned = False  # review verdicts go to the sidecar; the rows' quality comes from csv_dataset.json

    @staticmethod
    def recognises(root: Path) -> bool:
        return (Path(root) / MARKER).is_file()

    def episode_indices(self, root: Path) -> list[int]:
        return list(range(len(read_csv_meta(root).episodes)))

    def locate(self, root: Path) -> Iterator[SourceEpisode]:
        meta = read_csv_meta(root)
        tasks = {t: i for i, t in enumerate(dict.fromkeys(str(e.get("task", "")) for e in meta.episodes))}
        for i, e in enumerate(meta.episodes):
            name = str(e.get("file", ""))
            path = confine.confined(root, confine.check_name(name, "episode file"), "episode file")
            row = EpisodeRow(i, [str(e.get("task", ""))], 0, quality=str(e.get("quality", "")))
            videos = {} if meta.camera is None else {CAMERA: confine.confined(
                root, confine.check_name(str(e.get("video", "")), "episode video"), "episode video")}
            yield CsvEpisode(row=row, data_path=path, video_paths=videos, rows=0, task_indices=[],
                             columns=[], bytes=0, fps=meta.fps, joints=len(meta.joints),
                             task_index=tasks[row.tasks[0]])

    def validate(self, root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
        root = Path(root)
        meta = read_csv_meta(root)
        episodes: list[SourceEpisode] = []
        digest = hashlib.sha256((root / MARKER).read_bytes())
        for ep in self.locate(root):
            values = _values(ep.data_path, ep.index, meta.header)
            ep.rows = ep.row.length = len(values)
            ep.task_indices = [ep.task_index] if isinstance(ep, CsvEpisode) else []
            ep.columns = list(meta.features())
            for key, video in ep.video_paths.items():
                if not video.is_file():
                    raise DatasetError(f"episode {ep.index}: camera file {video} ({key}) is missing")
            ep.columns = [c for c in ep.columns if c not in ep.video_paths]
            ep.bytes = ep.data_path.stat().st_size + sum(v.stat().st_size for v in ep.video_paths.values())
            digest.update(ep.data_path.read_bytes())
            episodes.append(ep)
        if not episodes and not allow_empty_dataset:
            raise DatasetError(f"{root / MARKER} lists no episodes: nothing to export")
        tasks = [TaskRow(i, t) for i, t in enumerate(dict.fromkeys(e.row.tasks[0] for e in episodes))]
        info = DatasetInfo("v2.1", meta.robot_type, meta.fps, meta.features(), total_episodes=len(episodes),
                           total_frames=sum(e.rows for e in episodes), total_tasks=len(tasks), total_chunks=1,
                           total_videos=sum(len(e.video_paths) for e in episodes))
        if meta.camera is None:
            info.video_path = None
        dm = DatasetMeta(root, info, [e.row for e in episodes], tasks, {})
        return SourceCheck(root, dm, digest.hexdigest(), episodes)
