"""The record of a LeRobot v2.1 dataset's meta/info.json: its features and totals.

Split from records.py (one module per meta file); records.py re-exports these names.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ...jsonbound import KEYS_MAX, as_dict, as_int, as_list, as_str, check_bounds

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
        d = as_dict(d, "a feature")
        check_bounds(d, "a feature")
        info = d.get("info")
        return cls(dtype=as_str(d["dtype"], "dtype"),
                   shape=tuple(as_int(s, "a shape entry") for s in as_list(d["shape"], "shape")),
                   names=d.get("names"), info=None if info is None else as_dict(info, "info"))

    @classmethod
    def video(cls, height: int, width: int, fps: int, codec: str = "h264") -> Feature:
        return cls(dtype="video", shape=(height, width, 3), names=["height", "width", "channels"],
                   info={"video.height": height, "video.width": width, "video.codec": codec,
                         "video.pix_fmt": "yuv420p", "video.is_depth_map": False,
                         "video.fps": fps, "video.channels": 3, "has_audio": False})


def _feature(key: str, d: Any) -> Feature:
    try:
        return Feature.from_dict(d)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"feature {key!r}: {exc}") from None


def _features(value: Any) -> dict[str, Any]:
    features = as_dict(value, "features")
    if len(features) > KEYS_MAX:
        raise ValueError(f"features has {len(features)} entries; at most {KEYS_MAX} are accepted")
    return features


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

    def set_totals(self, episodes: int, frames: int, tasks: int, index_end: int | None = None) -> None:
        """The v2.1 totals, computed here only: one video file per episode and video key;
        chunks cover the episode indices [0, index_end) (default: ``episodes``)."""
        end = episodes if index_end is None else index_end
        self.total_episodes = episodes
        self.total_frames = frames
        self.total_tasks = tasks
        self.total_videos = episodes * len(self.video_keys)
        self.total_chunks = (end + self.chunks_size - 1) // self.chunks_size

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
        d = as_dict(d, "info.json")
        known = {"codebase_version", "robot_type", "fps", "features", "total_episodes", "total_frames",
                 "total_tasks", "total_videos", "total_chunks", "chunks_size", "data_path", "video_path",
                 "splits"}
        for key in ("codebase_version", "fps", "features", "data_path"):
            if key not in d:
                raise ValueError(f"info.json lacks {key!r}")
        return cls(
            codebase_version=as_str(d["codebase_version"], "codebase_version"),
            robot_type=as_str(d.get("robot_type") or "", "robot_type"),
            fps=as_int(d["fps"], "fps", 0),
            features={k: _feature(k, v) for k, v in _features(d["features"]).items()},
            total_episodes=as_int(d.get("total_episodes", 0), "total_episodes", 0),
            total_frames=as_int(d.get("total_frames", 0), "total_frames", 0),
            total_tasks=as_int(d.get("total_tasks", 0), "total_tasks", 0),
            total_videos=as_int(d.get("total_videos", 0), "total_videos", 0),
            total_chunks=as_int(d.get("total_chunks", 0), "total_chunks", 0),
            chunks_size=as_int(d.get("chunks_size", DEFAULT_CHUNKS_SIZE), "chunks_size"),
            data_path=as_str(d["data_path"], "data_path"),
            video_path=None if d.get("video_path") is None else as_str(d["video_path"], "video_path"),
            extra={k: copy.deepcopy(v) for k, v in d.items() if k not in known},
        )
