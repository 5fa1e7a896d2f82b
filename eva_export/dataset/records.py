"""Typed records of a LeRobot v2.1 dataset's meta/ files.

One dataclass per on-disk record, each with ``from_dict`` / ``to_dict``. Keys this code does
not know are kept in ``extra`` and written back, so nothing a producer stored is lost.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

CODEBASE_V21 = "v2.1"
FORMAT_V21 = "lerobot_v21"
DEFAULT_CHUNKS_SIZE = 1000
DATA_PATH_V21 = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH_V21 = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

# The five columns every LeRobot dataset has, in LeRobot's order.
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
IMAGE_DTYPES = ("video", "image")


@dataclass(frozen=True)
class Feature:
    dtype: str
    shape: tuple[int, ...]
    names: Any = None
    info: dict[str, Any] | None = None

    @property
    def is_visual(self) -> bool:
        return self.dtype in IMAGE_DTYPES

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        if self.info is not None:
            d["info"] = copy.deepcopy(self.info)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Feature:
        return cls(dtype=str(d["dtype"]), shape=tuple(int(s) for s in d["shape"]),
                   names=d.get("names"), info=d.get("info"))

    @classmethod
    def video(cls, height: int, width: int, fps: int, codec: str = "h264") -> Feature:
        return cls(dtype="video", shape=(height, width, 3), names=["height", "width", "channels"],
                   info={"video.height": height, "video.width": width, "video.codec": codec,
                         "video.pix_fmt": "yuv420p", "video.is_depth_map": False,
                         "video.fps": fps, "video.channels": 3, "has_audio": False})


@dataclass
class DatasetInfo:
    """meta/info.json. v2.1 fields are typed; v3 and export-specific keys live in ``extra``."""

    codebase_version: str
    robot_type: str
    fps: int
    features: dict[str, Feature]
    total_episodes: int = 0
    total_frames: int = 0
    total_tasks: int = 0
    total_videos: int = 0
    total_chunks: int = 0
    chunks_size: int = DEFAULT_CHUNKS_SIZE
    data_path: str = DATA_PATH_V21
    video_path: str | None = VIDEO_PATH_V21
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "video"]

    @property
    def visual_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_visual]

    @property
    def table_keys(self) -> list[str]:
        """Parquet columns: every feature that is not carried as video."""
        return [k for k, f in self.features.items() if f.dtype != "video"]

    @property
    def dataset_format(self) -> str:
        return str(self.extra.get("dataset_format", FORMAT_V21))

    def chunk_of(self, episode_index: int) -> int:
        return episode_index // self.chunks_size

    def data_file(self, episode_index: int) -> str:
        return self.data_path.format(episode_chunk=self.chunk_of(episode_index), episode_index=episode_index)

    def video_file(self, video_key: str, episode_index: int) -> str:
        if not self.video_path:
            raise ValueError("this dataset has no video_path (images are embedded)")
        return self.video_path.format(episode_chunk=self.chunk_of(episode_index), video_key=video_key,
                                      episode_index=episode_index)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "codebase_version": self.codebase_version,
            "robot_type": self.robot_type,
            "total_episodes": self.total_episodes,
            "total_frames": self.total_frames,
            "total_tasks": self.total_tasks,
            "total_videos": self.total_videos,
            "total_chunks": self.total_chunks,
            "chunks_size": self.chunks_size,
            "fps": self.fps,
            "splits": {"train": f"0:{self.total_episodes}"},
            "data_path": self.data_path,
            "video_path": self.video_path,
            "features": {k: f.to_dict() for k, f in self.features.items()},
        }
        d.update(copy.deepcopy(self.extra))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DatasetInfo:
        known = {"codebase_version", "robot_type", "fps", "features", "total_episodes", "total_frames",
                 "total_tasks", "total_videos", "total_chunks", "chunks_size", "data_path", "video_path",
                 "splits"}
        for key in ("codebase_version", "fps", "features", "data_path"):
            if key not in d:
                raise ValueError(f"info.json lacks {key!r}")
        return cls(
            codebase_version=str(d["codebase_version"]),
            robot_type=str(d.get("robot_type") or ""),
            fps=int(d["fps"]),
            features={k: Feature.from_dict(v) for k, v in d["features"].items()},
            total_episodes=int(d.get("total_episodes", 0)),
            total_frames=int(d.get("total_frames", 0)),
            total_tasks=int(d.get("total_tasks", 0)),
            total_videos=int(d.get("total_videos", 0)),
            total_chunks=int(d.get("total_chunks", 0)),
            chunks_size=int(d.get("chunks_size", DEFAULT_CHUNKS_SIZE)),
            data_path=str(d["data_path"]),
            video_path=d.get("video_path"),
            extra={k: copy.deepcopy(v) for k, v in d.items() if k not in known},
        )


@dataclass(frozen=True)
class QualityIssue:
    code: str
    severity: str  # "error" makes the episode red; "warning" is informative
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QualityIssue:
        return cls(str(d["code"]), str(d.get("severity", "error")), str(d.get("detail", "")))


@dataclass
class EpisodeRow:
    """One line of meta/episodes.jsonl.

    Capture writes quality, quality_issues and stream_stats; review writes qc_verdict and
    note. Every other key is kept verbatim in ``extra``.
    """

    episode_index: int
    tasks: list[str]
    length: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def quality(self) -> str:
        return str(self.extra.get("quality", ""))

    @property
    def qc_verdict(self) -> str:
        return str(self.extra.get("qc_verdict") or "")

    @property
    def note(self) -> str:
        return str(self.extra.get("note") or "")

    @property
    def quality_issues(self) -> list[QualityIssue]:
        return [QualityIssue.from_dict(i) for i in self.extra.get("quality_issues") or []]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"episode_index": self.episode_index, "tasks": list(self.tasks),
                             "length": self.length}
        d.update(copy.deepcopy(self.extra))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeRow:
        for key in ("episode_index", "length"):
            if key not in d:
                raise ValueError(f"episode row lacks {key!r}")
        tasks = d.get("tasks") or []
        if isinstance(tasks, str):
            tasks = [tasks]
        return cls(episode_index=int(d["episode_index"]), tasks=[str(t) for t in tasks],
                   length=int(d["length"]),
                   extra={k: copy.deepcopy(v) for k, v in d.items()
                          if k not in ("episode_index", "tasks", "length")})


@dataclass(frozen=True)
class TaskRow:
    task_index: int
    task: str

    def to_dict(self) -> dict[str, Any]:
        return {"task_index": self.task_index, "task": self.task}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskRow:
        return cls(int(d["task_index"]), str(d["task"]))


@dataclass
class EpisodeStats:
    """One line of meta/episodes_stats.jsonl: per-feature min/max/mean/std/count."""

    episode_index: int
    stats: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"episode_index": self.episode_index, "stats": self.stats}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeStats:
        return cls(int(d["episode_index"]), dict(d["stats"]))
