"""Typed records of a LeRobot v2.1 dataset's meta/ files.

One dataclass per on-disk record, each with ``from_dict`` / ``to_dict``. Keys this code does
not know are kept in ``extra`` and written back, so nothing a producer stored is lost.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write_json, read_json
from ..jsonbound import as_dict, as_int, as_list

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
        return cls(dtype=str(d["dtype"]), shape=tuple(as_int(s, "a shape entry") for s in as_list(d["shape"], "shape")),
                   names=d.get("names"), info=d.get("info"))

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
            codebase_version=str(d["codebase_version"]),
            robot_type=str(d.get("robot_type") or ""),
            fps=as_int(d["fps"], "fps"),
            features={k: _feature(k, v) for k, v in as_dict(d["features"], "features").items()},
            total_episodes=as_int(d.get("total_episodes", 0), "total_episodes"),
            total_frames=as_int(d.get("total_frames", 0), "total_frames"),
            total_tasks=as_int(d.get("total_tasks", 0), "total_tasks"),
            total_videos=as_int(d.get("total_videos", 0), "total_videos"),
            total_chunks=as_int(d.get("total_chunks", 0), "total_chunks"),
            chunks_size=as_int(d.get("chunks_size", DEFAULT_CHUNKS_SIZE), "chunks_size"),
            data_path=str(d["data_path"]),
            video_path=d.get("video_path"),
            extra={k: copy.deepcopy(v) for k, v in d.items() if k not in known},
        )


class Quality(StrEnum):
    """An episode's automatic rating, written by capture (capture/checks.py)."""

    GREEN = "green"  # no issue of severity "error"
    RED = "red"


class Verdict(StrEnum):
    """An operator's review verdict (qc_verdict). An empty verdict means not reviewed."""

    PASS = "pass"
    FAIL = "fail"
    NONE = ""


#: What a review request may set: a verdict, "clear" (drop the verdict) or "" (note only).
REVIEW_VERDICTS = ("", Verdict.PASS.value, Verdict.FAIL.value, "clear")


class Subset(StrEnum):
    """The two halves of a quality split (directory names and quality_split.json's subset)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"


class Severity(StrEnum):
    ERROR = "error"  # makes the episode red
    WARNING = "warning"  # informative


@dataclass(frozen=True)
class QualityIssue:
    code: str
    severity: str  # Severity: "error" makes the episode red; "warning" is informative
    detail: str
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. frames / ranges (console)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "severity": self.severity, "detail": self.detail}
        d.update(copy.deepcopy(self.extra))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QualityIssue:
        return cls(str(d["code"]), str(d.get("severity", Severity.ERROR)), str(d.get("detail", "")),
                   {k: copy.deepcopy(v) for k, v in d.items() if k not in ("code", "severity", "detail")})


# The typed episode fields besides the three LeRobot ones, in the order they are written.
_TEXT_FIELDS = ("quality", "qc_verdict", "note", "reviewed_at")
_EPISODE_FIELDS = ("quality", "quality_issues", "stream_stats", "qc_verdict", "note", "reviewed_at")


def _issues(value: Any) -> list[QualityIssue] | None:
    """quality_issues as typed records, or None when the value has another shape (kept verbatim)."""
    if not isinstance(value, list) or not all(isinstance(i, dict) and "code" in i for i in value):
        return None
    return [QualityIssue.from_dict(i) for i in value]


@dataclass
class EpisodeRow:
    """One line of meta/episodes.jsonl.

    Capture writes quality, quality_issues and stream_stats; review writes qc_verdict, note and
    reviewed_at. Those are typed fields ("" / empty when absent); ``present`` remembers which
    of them the row carries on disk, so an empty value written on purpose ("note": "",
    "quality_issues": []) is written back. A known key whose value has another type (a foreign
    dataset's "quality": null) and every unknown key stay verbatim in ``extra``.
    """

    episode_index: int
    tasks: list[str]
    length: int
    _: KW_ONLY
    quality: str = ""  # Quality for rows capture wrote; foreign datasets may say anything
    quality_issues: list[QualityIssue] = field(default_factory=list)
    stream_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    qc_verdict: str = ""  # Verdict
    note: str = ""
    reviewed_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    present: set[str] = field(default_factory=set, compare=False, repr=False)

    def review(self, verdict: str, note: str | None, reviewed_at: str) -> None:
        """Set (or with "clear" drop) the verdict, replace the note when given, stamp the time."""
        if verdict == "clear":
            self.qc_verdict = ""
            self.present.discard("qc_verdict")
            self.extra.pop("qc_verdict", None)
        elif verdict:
            self._set("qc_verdict", verdict)
        if note is not None:
            self._set("note", note)
        self._set("reviewed_at", reviewed_at)

    def _set(self, name: str, value: str) -> None:
        setattr(self, name, value)
        self.present.add(name)
        self.extra.pop(name, None)

    def _is_written(self, name: str) -> bool:
        return name in self.present or bool(getattr(self, name))

    def fields_dict(self) -> dict[str, Any]:
        """Every key of the row but the three LeRobot ones (exporters carry these as columns)."""
        d: dict[str, Any] = {}
        for name in _EPISODE_FIELDS:
            if name in self.extra or not self._is_written(name):
                continue
            if name == "quality_issues":
                d[name] = [i.to_dict() for i in self.quality_issues]
            elif name == "stream_stats":
                d[name] = copy.deepcopy(self.stream_stats)
            else:
                d[name] = getattr(self, name)
        d.update(copy.deepcopy(self.extra))
        return d

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"episode_index": self.episode_index, "tasks": list(self.tasks),
                             "length": self.length}
        d.update(self.fields_dict())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeRow:
        d = as_dict(d, "an episode row")
        for key in ("episode_index", "length"):
            if key not in d:
                raise ValueError(f"episode row lacks {key!r}")
        tasks = d.get("tasks") or []
        if isinstance(tasks, str):
            tasks = [tasks]
        row = cls(episode_index=as_int(d["episode_index"], "episode_index"),
                  tasks=[str(t) for t in as_list(tasks, "tasks")], length=as_int(d["length"], "length"))
        for key, value in d.items():
            if key in ("episode_index", "tasks", "length"):
                continue
            if key in _TEXT_FIELDS and isinstance(value, str):
                setattr(row, key, value)
            elif key == "quality_issues" and (issues := _issues(value)) is not None:
                row.quality_issues = issues
            elif key == "stream_stats" and isinstance(value, dict):
                row.stream_stats = copy.deepcopy(value)
            else:
                row.extra[key] = copy.deepcopy(value)
                continue
            row.present.add(key)
        return row


@dataclass(frozen=True)
class TaskRow:
    task_index: int
    task: str

    def to_dict(self) -> dict[str, Any]:
        return {"task_index": self.task_index, "task": self.task}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskRow:
        return cls(as_int(as_dict(d, "a task row")["task_index"], "task_index"), str(d["task"]))


@dataclass
class EpisodeStats:
    """One line of meta/episodes_stats.jsonl: per-feature min/max/mean/std/count."""

    episode_index: int
    stats: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"episode_index": self.episode_index, "stats": self.stats}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeStats:
        d = as_dict(d, "an episode stats row")
        return cls(as_int(d["episode_index"], "episode_index"), as_dict(d["stats"], "stats"))


# ---- meta/quality_split.json: the marker written into every exported subset ---------------------
# Here (not in export/) because formats/ and upload/ read it too: one home below all of them.

QUALITY_SPLIT_FILE = "meta/quality_split.json"
ACCEPTED = Subset.ACCEPTED
REJECTED = Subset.REJECTED

# The split rule, stated once. quality_split.json carries this text so a reader of the
# export knows how an episode ended up where it is.
SPLIT_RULE = (
    "operator verdict first: qc_verdict 'pass' -> accepted (even if quality is red), "
    "'fail' -> rejected (even if green); without a verdict (including note-only reviews) "
    "quality 'green' -> accepted, anything else -> rejected"
)


@dataclass(frozen=True)
class QualitySplit:
    """Provenance and upload-gating marker of one exported subset."""

    source_dir: str
    subset: str  # Subset: "accepted" or "rejected"
    dataset_format: str
    source_episode_indices: list[int]
    rule: str = SPLIT_RULE
    episode_count: int = 0
    frame_count: int = 0
    accepted_count: int = 0
    rejected_count: int = 0
    created_at: str = ""
    job_id: str = ""
    unrated_count: int = 0  # source episodes with no quality field and no verdict (all rejected)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QualitySplit:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        for key in ("source_dir", "subset", "dataset_format", "source_episode_indices"):
            if key not in known:
                raise ValueError(f"quality_split.json lacks {key!r}")
        known["source_episode_indices"] = [int(i) for i in known["source_episode_indices"]]
        return cls(**known, extra=extra)

    def write(self, dataset_root: Path) -> None:
        atomic_write_json(Path(dataset_root) / QUALITY_SPLIT_FILE, self.to_dict())

    @classmethod
    def read(cls, dataset_root: Path) -> QualitySplit:
        return cls.from_dict(read_json(Path(dataset_root) / QUALITY_SPLIT_FILE))
