"""One export from several sources: the facts the sources must share, and their provenance.

A named request (export/request.py: several sources, or one with a name) puts its pair under
``<data root>/<name>/export/<format>``; every episode row records where it came from. The
split itself has one code path for one and for N sources (split.py): episodes in source order
then episode order, tasks merged by text.
Sources must agree on what every format relies on (features: names, dtypes, shapes; fps; each
camera's size, codec and pixel format); the first disagreement refuses the request, naming the
source dataset and the feature, before anything is written.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DatasetError
from ..formats.common.meta import INFO, read_info
from ..formats.common.records import DatasetInfo, Feature
from ..formats.common.source import SourceCheck

#: Episode row fields a named (merged) export adds: the source dataset and its robot type.
SOURCE_DATASET_FIELD = "source_dataset"
SOURCE_ROBOT_FIELD = "source_robot_type"
#: quality_split.json keys of a named export: every source, and every subset episode's origin.
SOURCES_KEY = "sources"
ORIGINS_KEY = "source_episodes"
#: The camera facts the formats rely on (LeRobot readers, the v3 stream-copy join, the card).
VIDEO_FACTS = ("video.height", "video.width", "video.codec", "video.pix_fmt", "video.fps", "video.channels",
               "video.is_depth_map")


@dataclass(frozen=True)
class SourceRef:
    """One source of a named export, as quality_split.json records it."""

    source_dir: str
    kind: str  # a registered source kind: lerobot_v21, lerobot_v30, lerobot_v20
    robot_type: str
    episodes: int
    source_hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"source_dir": self.source_dir, "kind": self.kind,
                "robot_type": self.robot_type, "episodes": self.episodes, "source_hash": self.source_hash}

    @classmethod
    def of(cls, check: SourceCheck) -> SourceRef:
        from ..formats.sources import detect_kind

        info = check.meta.info  # every kind's, presented as v2.1 (formats/common/source.py)
        return cls(real(check.root), str(detect_kind(check.root)), info.robot_type, len(check.episodes),
                   check.source_hash)


@dataclass(frozen=True)
class EpisodeOrigin:
    """Where one subset episode came from (quality_split.json ``source_episodes``, in order)."""

    source_dataset: str
    source_episode_index: int

    def to_dict(self) -> dict[str, Any]:
        return {SOURCE_DATASET_FIELD: self.source_dataset, "source_episode_index": self.source_episode_index}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeOrigin:
        return cls(str(d[SOURCE_DATASET_FIELD]), int(d["source_episode_index"]))


def real(path: Path) -> str:
    return os.path.realpath(path)


def provenance(check: SourceCheck) -> dict[str, Any]:
    """The row fields a named export adds to each episode of ``check``."""
    out: dict[str, Any] = {SOURCE_DATASET_FIELD: real(check.root)}
    if check.meta.info.robot_type:
        out[SOURCE_ROBOT_FIELD] = check.meta.info.robot_type
    return out


def combined_hash(checks: tuple[SourceCheck, ...]) -> str:
    """The source state a staging root was built from: every source's path and hash, in order
    (a changed review in any source, or another source list, starts the staging afresh)."""
    if len(checks) == 1:
        return checks[0].source_hash  # the single-source staging of earlier runs stays reusable
    h = hashlib.sha256()
    for c in checks:
        h.update(f"{real(c.root)}\0{c.source_hash}\0".encode())
    return h.hexdigest()


def _feature_facts(f: Feature) -> dict[str, Any]:
    facts: dict[str, Any] = {"dtype": f.dtype, "shape": list(f.shape), "names": f.names}
    if f.dtype == "video":
        info = f.info or {}
        facts.update({k: info.get(k) for k in VIDEO_FACTS})
    return facts


def disagreement(first: DatasetInfo, other: DatasetInfo) -> str | None:
    """The first fact ``other`` does not share with ``first`` (None: they agree)."""
    if other.fps != first.fps:
        return f"fps {other.fps}, the first source has {first.fps}"
    missing = [k for k in first.features if k not in other.features]
    if missing:
        return f"feature {missing[0]!r} is missing (the first source has it)"
    extra = [k for k in other.features if k not in first.features]
    if extra:
        return f"feature {extra[0]!r} is not in the first source"
    for key, feat in first.features.items():
        a, b = _feature_facts(feat), _feature_facts(other.features[key])
        for fact, want in a.items():
            if b[fact] != want:
                return f"feature {key!r} has {fact} {b[fact]!r}, the first source has {want!r}"
    return None


def _refuse_disagreement(named: list[tuple[Path, DatasetInfo]]) -> None:
    """Raise on the first source whose info disagrees with the first one's, naming both files."""
    (first_root, first), *rest = named
    for root, info in rest:
        why = disagreement(first, info)
        if why is not None:
            raise DatasetError(f"cannot merge {root / INFO} with {first_root / INFO}: {why}")


def check_agree(checks: tuple[SourceCheck, ...]) -> None:
    """Refuse sources that cannot form one dataset, naming the first disagreement and its source."""
    _refuse_disagreement([(c.root, c.meta.info) for c in checks])


def check_infos(sources: tuple[Path, ...]) -> None:
    """The same check on the sources' info.json alone: a request is refused before it is queued
    (the job checks again after validation, the sources may change meanwhile)."""
    _refuse_disagreement([(s, read_info(s)) for s in sources])


def merged_robot_type(checks: tuple[SourceCheck, ...]) -> str:
    """One robot type when the sources share it, else each distinct one in source order."""
    types = list(dict.fromkeys(c.meta.info.robot_type for c in checks if c.meta.info.robot_type))
    return ",".join(types)
