"""LeRobot v2.1 source (ours, or any writer's): validated by formats/lerobot_v21/validate.py as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..common.meta import read_meta
from ..common.records import CODEBASE_V21
from ..common.source import SourceCheck, SourceKind, codebase_version, locate_per_episode_files
from ..common.source_rules import SourceEpisode
from .validate import validate_source


class V21Source:
    """One Parquet and one MP4 per camera per episode; quality lives in episodes.jsonl."""

    kind = SourceKind.LEROBOT_V21
    owned = True

    @staticmethod
    def recognises(root: Path) -> bool:
        return codebase_version(root) == CODEBASE_V21

    def validate(self, root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
        return validate_source(root, allow_empty_dataset=allow_empty_dataset)

    def episode_indices(self, root: Path) -> list[int]:
        return [e.episode_index for e in read_meta(root).episodes]

    def locate(self, root: Path) -> Iterator[SourceEpisode]:
        return locate_per_episode_files(root)
