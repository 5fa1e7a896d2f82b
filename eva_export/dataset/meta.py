"""Reading a v2.1 dataset's meta/ directory into typed records."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import confine
from ..errors import DatasetError
from ..fsutil import iter_jsonl, read_json
from .records import DatasetInfo, EpisodeRow, EpisodeStats, TaskRow

INFO = "meta/info.json"
EPISODES = "meta/episodes.jsonl"
EPISODES_STATS = "meta/episodes_stats.jsonl"
TASKS = "meta/tasks.jsonl"
STATS = "meta/stats.json"


@dataclass
class DatasetMeta:
    root: Path
    info: DatasetInfo
    episodes: list[EpisodeRow]
    tasks: list[TaskRow]
    episodes_stats: dict[int, EpisodeStats]

    @property
    def task_index(self) -> dict[str, int]:
        return {t.task: t.task_index for t in self.tasks}

    @property
    def task_text(self) -> dict[int, str]:
        return {t.task_index: t.task for t in self.tasks}

    def data_path(self, episode_index: int) -> Path:
        """The episode's data file; the template and the resolved file are confined to root."""
        confine.check_template(self.info.data_path, "data", str(self.root / INFO))
        return confine.confined(self.root, self.info.data_file(episode_index), "data file")

    def video_path(self, key: str, episode_index: int) -> Path:
        """The episode's camera file; template, key and resolved file are confined to root."""
        confine.check_template(self.info.video_path, "video", str(self.root / INFO))
        confine.check_key(key, "video key")
        return confine.confined(self.root, self.info.video_file(key, episode_index), "video file")


def read_info(root: Path) -> DatasetInfo:
    path = Path(root) / INFO
    if not path.is_file():
        raise DatasetError(f"{path} is missing: not a LeRobot dataset")
    confine.confined(Path(root), INFO, "meta file")  # a symlinked info.json pointing out
    try:
        return DatasetInfo.from_dict(read_json(path))
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: {exc}") from exc


def _rows(path: Path, required: bool) -> list[dict[str, Any]]:
    if not path.is_file():
        if required:
            raise DatasetError(f"{path} is missing")
        return []
    confine.confined(path.parent.parent, f"meta/{path.name}", "meta file")
    try:
        return list(iter_jsonl(path))
    except (OSError, ValueError) as exc:
        raise DatasetError(str(exc)) from exc


def read_meta(root: Path) -> DatasetMeta:
    """Load info, episodes, tasks and per-episode stats; each failure names its file."""
    root = Path(root)
    info = read_info(root)
    try:
        episodes = [EpisodeRow.from_dict(d) for d in _rows(root / EPISODES, required=True)]
        tasks = [TaskRow.from_dict(d) for d in _rows(root / TASKS, required=False)]
        ep_stats = {s.episode_index: s for s in
                    (EpisodeStats.from_dict(d) for d in _rows(root / EPISODES_STATS, required=False))}
    except (KeyError, ValueError, TypeError) as exc:
        raise DatasetError(f"{root / 'meta'}: malformed row ({exc})") from exc
    return DatasetMeta(root=root, info=info, episodes=episodes, tasks=tasks, episodes_stats=ep_stats)
