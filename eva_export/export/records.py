"""The quality marker written into every exported subset: meta/quality_split.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write_json, read_json

QUALITY_SPLIT_FILE = "meta/quality_split.json"
ACCEPTED = "accepted"
REJECTED = "rejected"

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
    subset: str  # "accepted" or "rejected"
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
