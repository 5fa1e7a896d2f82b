"""The capture's open dataset writers: one ``DatasetWriter`` per dataset name, shared by live
capture, bag ingest, listing and review (the single writer of each dataset's meta files)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..config import CollectionConfig
from ..errors import DatasetError, EvaError
from ..formats.common.meta import INFO, read_info, read_meta
from ..formats.common.records import EpisodeRow, Feature
from ..formats.common.video import VideoSettings
from ..formats.lerobot_v21.writer import DatasetWriter

log = logging.getLogger(__name__)


class DatasetWriters:
    """Writers opened on first use (or at start-up, to recover what a crash left)."""

    def __init__(self, col: CollectionConfig, features: dict[str, Feature], video: VideoSettings) -> None:
        self.col = col
        self.features = features
        self.video = video
        self._writers: dict[str, DatasetWriter] = {}
        self._writers_lock = threading.Lock()

    def writer_for(self, name: str, create: bool) -> DatasetWriter | None:
        root = self.col.dataset_dir(name)
        with self._writers_lock:
            dw = self._writers.get(name)
            if dw is not None:
                if create:  # it may have been opened at start-up with the features on disk
                    dw.check_matches(self.col.fps, self.features)
                return dw
            if create:
                dw = DatasetWriter.open(root, fps=self.col.fps, features=self.features,
                                        robot_type=self.col.robot_type, settings=self.video)
            elif (root / INFO).is_file():
                dw = DatasetWriter(root, read_info(root), self.video)
                dw.recovered = dw.recover()
            else:
                return None
            self._writers[name] = dw
            return dw

    def recover_all(self) -> dict[str, list[str]]:
        """Recover every configured dataset that exists, before any request is served, so
        readers (list_episodes, exports, LeRobot) never see the state a crash left."""
        out: dict[str, list[str]] = {}
        for name in dict.fromkeys(t.dataset_name for t in self.col.tasks):
            try:
                dw = self.writer_for(name, create=False)
            except (EvaError, OSError, ValueError) as exc:
                log.error("cannot recover dataset %s: %s", self.col.dataset_dir(name), exc)
                continue
            if dw is not None and dw.recovered:
                out[name] = dw.recovered
                log.warning("dataset %s recovered at start-up: %s", dw.root, "; ".join(dw.recovered))
        return out

    def default_name(self, name: str) -> str:
        return name or self.col.tasks[0].dataset_name

    def list_episodes(self, dataset_name: str = "") -> tuple[Path, list[EpisodeRow]]:
        name = self.default_name(dataset_name)
        root = self.col.dataset_dir(name)
        with self._writers_lock:
            dw = self._writers.get(name)
        if dw is not None:
            with dw.lock:
                return root, [EpisodeRow.from_dict(e.to_dict()) for e in dw.episodes]
        if not (root / INFO).is_file():
            return root, []
        return root, read_meta(root).episodes

    def review(self, dataset_name: str, episode_index: int, verdict: str, note: str | None,
               take_id: str = "") -> EpisodeRow:
        name = self.default_name(dataset_name)
        dw = self.writer_for(name, create=False)
        if dw is None:
            raise DatasetError(f"dataset {name!r} has no episodes yet ({self.col.dataset_dir(name)})")
        row = dw.review(episode_index, verdict, note, take_id)
        return EpisodeRow.from_dict(row.to_dict())
