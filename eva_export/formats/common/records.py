"""Typed records of a LeRobot v2.1 dataset's meta/ files.

One dataclass per on-disk record, each with ``from_dict`` / ``to_dict``. Keys this code does
not know are kept in ``extra`` and written back, so nothing a producer stored is lost.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ...fsutil import atomic_write_json, read_json
from ...jsonbound import ITEMS_MAX, KEYS_MAX, as_dict, as_int, as_list, as_str, check_bounds
from .info_record import (
    CODEBASE_V21,
    DATA_PATH_V21,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_FEATURES,
    FORMAT_V21,
    IMAGE_DTYPES,
    VIDEO_PATH_V21,
    DatasetInfo,
    Feature,
)

__all__ = ["ACCEPTED", "CODEBASE_V21", "DATA_PATH_V21", "DEFAULT_CHUNKS_SIZE", "DEFAULT_FEATURES", "FORMAT_V21",
           "IMAGE_DTYPES", "QUALITY_SPLIT_FILE", "REJECTED", "REVIEW_VERDICTS", "SPLIT_RULE", "VIDEO_PATH_V21",
           "DatasetInfo", "EpisodeRow", "EpisodeStats", "Feature", "Quality", "QualityIssue", "QualitySplit",
           "Severity", "Subset", "TaskRow", "Verdict"]


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
        d = as_dict(d, "a quality issue")
        check_bounds(d, "a quality issue")
        return cls(as_str(d["code"], "a quality issue's code"),
                   as_str(d.get("severity", Severity.ERROR), "a quality issue's severity"),
                   as_str(d.get("detail", ""), "a quality issue's detail"),
                   {k: copy.deepcopy(v) for k, v in d.items() if k not in ("code", "severity", "detail")})


_PRESENT: dict[frozenset[str], frozenset[str]] = {}  # bounded: subsets of _EPISODE_FIELDS


def present_with(present: frozenset[str], *names: str) -> frozenset[str]:
    """``present`` with ``names`` added, as the one shared frozenset of those names."""
    s = present.union(names) if names else present
    return _PRESENT.setdefault(s, s)


# The typed episode fields besides the three LeRobot ones, in the order they are written.
_TEXT_FIELDS = ("quality", "qc_verdict", "note", "reviewed_at", "take_id")
_EPISODE_FIELDS = ("quality", "quality_issues", "stream_stats", "qc_verdict", "note", "reviewed_at", "take_id")


def _issues(value: Any) -> list[QualityIssue]:
    """quality_issues as typed records; any other shape is refused."""
    items = as_list(value, "quality_issues")
    if len(items) > ITEMS_MAX:
        raise ValueError(f"quality_issues has {len(items)} items; at most {ITEMS_MAX} are accepted")
    return [QualityIssue.from_dict(i) for i in items]


def _tasks(value: Any) -> list[str]:
    """A row's tasks: a list of task texts (a single text is one task), each bounded."""
    items = as_list([value] if isinstance(value, str) else value, "tasks")
    if len(items) > ITEMS_MAX:
        raise ValueError(f"tasks has {len(items)} items; at most {ITEMS_MAX} are accepted")
    return [sys.intern(as_str(t, "a task")) for t in items]


@dataclass(slots=True)  # no per-row __dict__: a source holds one row per episode
class EpisodeRow:
    """One line of meta/episodes.jsonl.

    Capture writes quality, quality_issues, stream_stats and take_id (the id STOP returned, which
    a review may name beside the index); review writes qc_verdict, note and reviewed_at. Those
    are typed fields ("" / empty when absent); ``present`` remembers which of them the row
    carries on disk, so an empty value written on purpose ("note": "",
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
    take_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # shared (interned) sets of at most seven names: a set per row was 216 bytes
    present: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def review(self, verdict: str, note: str | None, reviewed_at: str) -> None:
        """Set (or with "clear" drop) the verdict, replace the note when given, stamp the time."""
        if verdict == "clear":
            self.qc_verdict = ""
            self.present = present_with(self.present - {"qc_verdict"})
            self.extra.pop("qc_verdict", None)
        elif verdict:
            self._set("qc_verdict", verdict)
        if note is not None:
            self._set("note", note)
        self._set("reviewed_at", reviewed_at)

    def _set(self, name: str, value: str) -> None:
        setattr(self, name, value)
        self.present = present_with(self.present, name)
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
        """The row, every field of its exact type and bounded (ValueError naming the field): an
        index or a length that is a boolean, a float or a string is refused, not converted; a
        text over TEXT_MAX_BYTES (a review note's bound) is refused, not carried into exports.
        A known field that is null (a foreign dataset's "quality": null) is kept verbatim."""
        d = as_dict(d, "an episode row")
        if len(d) > KEYS_MAX:
            raise ValueError(f"an episode row has {len(d)} keys; at most {KEYS_MAX} are accepted")
        for key in ("episode_index", "length"):
            if key not in d:
                raise ValueError(f"episode row lacks {key!r}")
        row = cls(episode_index=as_int(d["episode_index"], "episode_index", 0), tasks=_tasks(d.get("tasks", [])),
                  length=as_int(d["length"], "length", 0))
        present: list[str] = []
        for key, value in d.items():
            if key in ("episode_index", "tasks", "length"):
                continue
            if value is None or key not in _EPISODE_FIELDS:
                check_bounds(value, key)
                row.extra[key] = copy.deepcopy(value)
                continue
            if key in _TEXT_FIELDS:
                value = as_str(value, key)
                setattr(row, key, sys.intern(value) if key == "quality" and type(value) is str else value)  # "green" once, not per row (an enum member is already one object)
            elif key == "quality_issues":
                row.quality_issues = _issues(value)
            else:  # stream_stats
                check_bounds(as_dict(value, key), key)
                row.stream_stats = copy.deepcopy(value)
            present.append(key)
        row.present = present_with(frozenset(present))
        return row


@dataclass(frozen=True)
class TaskRow:
    task_index: int
    task: str

    def to_dict(self) -> dict[str, Any]:
        return {"task_index": self.task_index, "task": self.task}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskRow:
        d = as_dict(d, "a task row")
        return cls(as_int(d["task_index"], "task_index", 0), as_str(d["task"], "task"))


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
        return cls(as_int(d["episode_index"], "episode_index", 0), as_dict(d["stats"], "stats"))


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
        """The marker with every field of its exact type (ValueError naming the field)."""
        d = as_dict(d, "quality_split.json")
        names = {f.name: f.type for f in dataclasses.fields(cls)}
        for key in ("source_dir", "subset", "dataset_format", "source_episode_indices"):
            if key not in d:
                raise ValueError(f"quality_split.json lacks {key!r}")
        known: dict[str, Any] = {}
        for key, value in d.items():
            kind = names.get(key) if key != "extra" else None
            if kind == "str":
                known[key] = as_str(value, key)
            elif kind == "int":
                known[key] = as_int(value, key, 0)
            elif kind is not None:  # source_episode_indices
                known[key] = [as_int(i, "a source episode index", 0) for i in as_list(value, key)]
        extra = {k: v for k, v in d.items() if k not in known}
        check_bounds(extra, "quality_split.json", max_items=1 << 24)  # one origin per episode when merged
        return cls(**known, extra=extra)

    def write(self, dataset_root: Path) -> None:
        atomic_write_json(Path(dataset_root) / QUALITY_SPLIT_FILE, self.to_dict())

    @classmethod
    def read(cls, dataset_root: Path) -> QualitySplit:
        """The marker of a subset; ValueError naming the file when it is malformed."""
        path = Path(dataset_root) / QUALITY_SPLIT_FILE
        try:
            return cls.from_dict(read_json(path))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
