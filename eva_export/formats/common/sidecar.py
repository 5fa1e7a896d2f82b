"""Quality and verdicts of a source we do not own (v3.0, v2.0): meta/eva_quality.jsonl.

The dataset's own files stay byte-identical; automatic checks (``eva-export check``) and
operator reviews (``eva-export review``) append one JSON line per episode judgment to this
sidecar. Lines are merged in file order: a later line's fields replace an earlier one's, field
by field, so a review does not erase the check's flags and a re-check does not erase a verdict.
The split and the health report read the merged rows; a missing sidecar means "unrated".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import confine
from ...errors import DatasetError
from ...fsutil import iter_jsonl_lines
from ...jsonbound import as_dict, as_int, as_str
from .records import EpisodeRow, Verdict

SIDECAR = "meta/eva_quality.jsonl"  # covered by the v2.1 source hash (lerobot_v21/validate.py)
#: The row fields a sidecar line may set (EpisodeRow's quality and review fields).
FIELDS = ("quality", "quality_issues", "stream_stats", "qc_verdict", "note", "reviewed_at", "rule_version",
          "checked_at")


@dataclass(frozen=True)
class QualityEntry:
    """One sidecar line: the fields it sets for one source episode."""

    episode_index: int
    values: dict[str, Any] = field(default_factory=dict)  # a subset of FIELDS
    written_by: str = ""  # "check" or "review": who appended it

    def to_dict(self) -> dict[str, Any]:
        return {"episode_index": self.episode_index, **self.values, "written_by": self.written_by}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QualityEntry:
        """The line, typed and bounded as an episode row's same fields are (ValueError naming the field)."""
        d = as_dict(d, "a sidecar line")
        if "episode_index" not in d:
            raise ValueError("a sidecar line needs an integer episode_index")
        index = as_int(d["episode_index"], "episode_index", 0)
        values = {k: d[k] for k in FIELDS if k in d}
        # the fields as a row would carry them: the same exact types and bounds, one parse
        EpisodeRow.from_dict({"episode_index": index, "length": 0, **values})
        return cls(index, values, as_str(d.get("written_by", ""), "written_by"))


def read_entries(root: Path) -> list[QualityEntry]:
    """The sidecar's lines in order ([] when there is none)."""
    path = Path(root) / SIDECAR
    if not path.is_file():
        return []
    confine.confined(Path(root), SIDECAR, "meta file")  # a symlink pointing out is refused
    out: list[QualityEntry] = []
    lineno = 0
    try:
        for line in iter_jsonl_lines(path):
            lineno = line[0]  # named by a refusal of the line's entry
            out.append(QualityEntry.from_dict(line[1]))
    except OSError as exc:
        raise DatasetError(f"{path}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        if str(exc).startswith(str(path)):  # the line reader named the line already
            raise DatasetError(str(exc)) from None
        raise DatasetError(f"{path}:{lineno}: {exc}") from None
    return out


def merged(root: Path) -> dict[int, dict[str, Any]]:
    """episode_index -> the fields its lines set, later lines winning field by field."""
    out: dict[int, dict[str, Any]] = {}
    for e in read_entries(root):
        out.setdefault(e.episode_index, {}).update(e.values)
    return out


def apply(rows: Iterable[EpisodeRow], verdicts: dict[int, dict[str, Any]]) -> list[EpisodeRow]:
    """The rows with their sidecar fields (a new row each; the source rows are not changed)."""
    out = []
    for row in rows:
        extra = verdicts.get(row.episode_index)
        out.append(EpisodeRow.from_dict({**row.to_dict(), **extra}) if extra else row)
    return out


def sidecar_bytes(root: Path) -> bytes:
    """The sidecar's content for the source hash: a new verdict makes staging stale."""
    path = Path(root) / SIDECAR
    return path.read_bytes() if path.is_file() else b""


def append_review(root: Path, indices: list[int], verdict: str, note: str | None) -> None:
    """Append one review line per episode ("clear" writes an empty verdict: none)."""
    if verdict not in ("", Verdict.PASS, Verdict.FAIL, "clear"):
        raise ValueError(f"verdict {verdict!r}: use pass, fail, clear or '' (note only)")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    lines = []
    for i in indices:
        values: dict[str, Any] = {"reviewed_at": stamp}
        if verdict:
            values["qc_verdict"] = "" if verdict == "clear" else verdict
        if note is not None:
            values["note"] = confine.check_note(note)
        lines.append(json.dumps(QualityEntry(i, values, "review").to_dict()) + "\n")
    append_lines(root, lines)


def append_lines(root: Path, lines: list[str]) -> None:
    """One O_APPEND write: concurrent appenders interleave whole batches, never half lines."""
    path = confine.confined(Path(root), SIDECAR, "meta file")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, "".join(lines).encode("utf-8"))
    finally:
        os.close(fd)
