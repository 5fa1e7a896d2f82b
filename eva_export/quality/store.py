"""Where offline verdicts live: merged into a v2.1 dataset's rows, or in a sidecar.

* **Rows** (a v2.1 dataset we own): ``write_rows`` merges each episode's offline findings into
  its row through the dataset's single writer (``DatasetWriter.set_quality``, under
  ``.writer.lock``). Flags live capture wrote are never dropped: their issues stay, the
  offline ones are added with ``"source": "offline"``, and a red live verdict stays red. A
  rerun replaces only the previous offline issues. ``quality_rules`` records the rule version
  and which drivers judged the row.
* **Sidecar** ``meta/eva_quality.jsonl`` (sources we do not own, v3.0 / v2.0; its one home is
  formats/common/sidecar.py): one ``QualityRecord`` per episode appended as a "check" line; the
  source's own files stay byte-identical. ``quality_for`` is what the split reads: the row's
  own rating first, else the sidecar's.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formats.common import sidecar
from ..formats.common.records import EpisodeRow, Quality, QualityIssue, Severity, present_with

if TYPE_CHECKING:  # the rules and their judge load only where verdicts are written (``check``),
    # not in every export job, which only reads them (quality_for, read_sidecar)
    from .offline import DatasetCheck, EpisodeCheck

SIDECAR = sidecar.SIDECAR
PROVENANCE_KEY = "quality_rules"  # extra key of an episode row


@dataclass(frozen=True)
class Provenance:
    """Which rule version and drivers produced a row's quality (row key ``quality_rules``)."""

    version: str
    sources: tuple[str, ...]  # "live", "offline"
    live_quality: str = ""  # the verdict capture wrote, kept so a rerun can recompute the merge

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "sources": list(self.sources), "live_quality": self.live_quality}

    @classmethod
    def from_dict(cls, d: object) -> Provenance | None:
        if not isinstance(d, dict) or "version" not in d:
            return None
        return cls(str(d["version"]), tuple(str(s) for s in d.get("sources") or ()), str(d.get("live_quality", "")))


@dataclass(frozen=True)
class QualityRecord:
    """An episode's offline verdict, as ``eva-export check --sidecar`` appends it to the sidecar
    (formats/common/sidecar.py, the one home of meta/eva_quality.jsonl: append-only lines merged field
    by field, so a re-check never erases an operator's verdict written there by a review)."""

    episode_index: int
    quality: str
    quality_issues: tuple[QualityIssue, ...]
    stream_stats: dict[str, dict[str, object]]
    rule_version: str
    checked_at: str

    def values(self) -> dict[str, object]:
        """The sidecar fields this record sets."""
        return {"quality": self.quality, "quality_issues": [i.to_dict() for i in self.quality_issues],
                "stream_stats": copy.deepcopy(self.stream_stats), "rule_version": self.rule_version,
                "checked_at": self.checked_at}

    @classmethod
    def of(cls, ep: EpisodeCheck, checked_at: str) -> QualityRecord:
        from .rules import RULE_VERSION

        return cls(ep.episode_index, ep.quality, tuple(ep.issues), ep.stream_stats, RULE_VERSION, checked_at)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ---- sidecar ----------------------------------------------------------------------------------
def write_sidecar(check: DatasetCheck) -> Path:
    """Append this check's verdicts (one batch, one write) to the source's sidecar."""
    stamp = _now()
    entries = [sidecar.QualityEntry(e.episode_index, QualityRecord.of(e, stamp).values(), "check")
               for e in check.episodes]
    sidecar.append_lines(check.root, [json.dumps(e.to_dict()) + "\n" for e in entries])
    return check.root / SIDECAR


def read_sidecar(root: Path) -> dict[int, dict[str, object]]:
    """The sidecar's merged fields by episode index ({} when there is none)."""
    return sidecar.merged(root)


def quality_for(row: EpisodeRow, values: dict[str, Any] | None) -> EpisodeRow:
    """The row the split rule judges: its own rating when it has one, else the sidecar's."""
    if not values or "quality" not in values or row.quality.strip() or "quality" in row.extra:
        return row
    rated = replace(row, extra=dict(row.extra))
    rated.quality = str(values["quality"])
    rated.quality_issues = [QualityIssue.from_dict(i) for i in values.get("quality_issues") or ()]
    rated.present = present_with(rated.present, "quality", "quality_issues")
    return rated


# ---- rows -----------------------------------------------------------------------------------
def merge(row: EpisodeRow, ep: EpisodeCheck) -> EpisodeRow:
    """``row`` with the offline findings merged in (live flags kept, previous offline ones replaced)."""
    prov = Provenance.from_dict(row.extra.get(PROVENANCE_KEY))
    kept = [i for i in row.quality_issues if i.extra.get("source") != "offline"]
    # a row without provenance: whatever it says came from capture (or another tool)
    live_quality = prov.live_quality if prov is not None else row.quality.strip().lower()
    issues = kept + ep.issues
    red = live_quality == Quality.RED or any(i.severity == Severity.ERROR for i in issues)
    sources = ("live", "offline") if live_quality or kept else ("offline",)
    out = replace(row, extra=dict(row.extra))
    out.quality = Quality.RED if red else Quality.GREEN
    out.quality_issues = issues
    stats = copy.deepcopy(row.stream_stats)
    for name, st in ep.stream_stats.items():
        stats.setdefault(name, {})["offline"] = st  # capture's transport statistics stay
    out.stream_stats = stats
    from .rules import RULE_VERSION

    out.extra[PROVENANCE_KEY] = Provenance(RULE_VERSION, sources, live_quality).to_dict()
    out.present = present_with(out.present, "quality", "quality_issues", "stream_stats")
    return out


def write_rows(check: DatasetCheck) -> int:
    """Merge every checked episode into its row through the dataset's single writer."""
    from ..formats.common.meta import read_info
    from ..formats.lerobot_v21.writer import DatasetWriter

    writer = DatasetWriter(check.root, read_info(check.root))  # takes .writer.lock or refuses
    current = {e.episode_index: e for e in writer.episodes}
    merged = {ep.episode_index: merge(current[ep.episode_index], ep)
              for ep in check.episodes if ep.episode_index in current}
    writer.set_quality(merged)
    return len(merged)
