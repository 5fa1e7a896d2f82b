"""LeRobot v2.0 source: the v2.1 layout without per-episode statistics.

What LeRobot 0.3.x's v2.0 -> v2.1 converter changes is exactly what this source supplies: the
per-episode statistics (meta/episodes_stats.jsonl; v2.0 has only the dataset-wide
meta/stats.json) and the codebase_version. The files are validated by the v2.1 rules; the
split computes each episode's statistics while it reads the episode (table columns from the
rows, cameras from the decoded frames) and writes real v2.1 subsets. We do not own the
dataset: its quality comes from the sidecar (formats/common/sidecar.py), else it is unrated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from ..common import sidecar
from ..common.meta import read_meta
from ..common.records import CODEBASE_V21
from ..common.source import SourceCheck, SourceKind, codebase_version, locate_per_episode_files
from ..common.source_rules import SourceEpisode
from ..lerobot_v21.validate import validate_source

CODEBASE_V20 = "v2.0"


class V20Source:
    kind = SourceKind.LEROBOT_V20
    owned = False

    @staticmethod
    def recognises(root: Path) -> bool:
        return codebase_version(root) == CODEBASE_V20

    def validate(self, root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
        check = validate_source(root, allow_empty_dataset=allow_empty_dataset, codebase=CODEBASE_V20,
                                camera_stats_computed=True)
        return relabel(check, root)

    def episode_indices(self, root: Path) -> list[int]:
        return [e.episode_index for e in read_meta(root).episodes]

    def locate(self, root: Path) -> Iterator[SourceEpisode]:
        return locate_per_episode_files(root)


def relabel(check: SourceCheck, root: Path) -> SourceCheck:
    """The checked v2.0 source described as the v2.1 dataset the split writes, with the
    sidecar's quality in its rows (validate_source's hash already covers the sidecar)."""
    meta = check.meta
    verdicts = sidecar.merged(root)
    rows = sidecar.apply(meta.episodes, verdicts)
    by_index = {r.episode_index: r for r in rows}
    info = dataclasses.replace(meta.info, codebase_version=CODEBASE_V21, extra=dict(meta.info.extra))
    # Statistics are recomputed for every feature (v2.0 has none per episode); stats.json
    # is the old dataset-wide summary, left out so it cannot mask a missing camera.
    new_meta = dataclasses.replace(meta, info=info, episodes=rows, episodes_stats={})
    episodes = [dataclasses.replace(e, row=by_index[e.index]) for e in check.episodes]
    return dataclasses.replace(check, meta=new_meta, episodes=episodes)
