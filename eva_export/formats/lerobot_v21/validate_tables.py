"""What validating an episode's table proved, kept in the export's facts index (facts_index).

An episode table passes validation (footer, small columns, task indices, embedded images)
or not, given the file's bytes and a context: info.json, the task list, the episode's row
(index, length, tasks) and its global frame offset. A pass is stored under the file's
identity and a kind naming that context (a digest), so the rerun on an unchanged source, or a
file hard-linked into a subset at the same offset, is not read again. A context that
differs in anything is another kind: never found. A payload of the wrong shape is not trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from ..common import video_facts
from ..common.facts_index import FileKey
from ..common.meta import DatasetMeta
from ..common.records import EpisodeRow
from ..common.source_rules import SourceEpisode

#: Bumped when what a table check proves changes: older rows are then never found.
CHECKS_VERSION = 1


@dataclass(frozen=True)
class TableFacts:
    """A table that passed: its row count, column names and distinct task indices."""

    rows: int
    columns: list[str]
    tasks: list[int]

    def to_payload(self) -> str:
        return json.dumps([self.rows, self.columns, self.tasks])

    @staticmethod
    def from_payload(text: str) -> TableFacts | None:
        try:
            rows, columns, tasks = json.loads(text)
        except (ValueError, TypeError, RecursionError):
            return None
        if type(rows) is not int or not isinstance(columns, list) or not isinstance(tasks, list):
            return None
        if not all(isinstance(c, str) for c in columns) or not all(type(t) is int for t in tasks):
            return None
        return TableFacts(rows, columns, tasks)


def table_kind(raw_info: dict[str, object], meta: DatasetMeta, camera_stats_computed: bool) -> str:
    """The source-wide part of the context, or "" when no index is in use (nothing looked up)."""
    if not video_facts.index_active():
        return ""
    h = hashlib.sha256(json.dumps([CHECKS_VERSION, raw_info, sorted(meta.task_text.items()),
                                   camera_stats_computed], sort_keys=True, default=str).encode())
    return f"v21-table:{h.hexdigest()[:32]}"


def context_kind(base: str, row: EpisodeRow, offset: int) -> str:
    tasks = hashlib.sha256(json.dumps(list(row.tasks)).encode()).hexdigest()[:16]
    return f"{base}:{row.episode_index}:{row.length}:{offset}:{tasks}"


def table_key(st: os.stat_result, kind: str) -> FileKey | None:
    """The table's identity from its stat taken before it is read (None: no index, or too
    fresh to keep)."""
    return video_facts.key_of(st) if kind else None


def known_table(key: FileKey | None, row: EpisodeRow, offset: int, kind: str,
                meta: DatasetMeta) -> TableFacts | None:
    """The facts stored for this exact file and context, checked against what the row and
    info.json require (a payload claiming another length or lacking a column is not used)."""
    if key is None:
        return None
    payload = video_facts.index_get(key, context_kind(kind, row, offset))
    facts = TableFacts.from_payload(payload) if payload is not None else None
    if facts is None or facts.rows != row.length:
        return None
    required = ("episode_index", "index", *meta.info.table_keys)
    if not all(c in facts.columns for c in required) or not all(t in meta.task_text for t in facts.tasks):
        return None
    return facts


def remember_table(key: FileKey | None, ep: SourceEpisode, offset: int, kind: str) -> None:
    if key is not None:
        video_facts.index_put(key, context_kind(kind, ep.row, offset), TableFacts(ep.rows, ep.columns, ep.task_indices)
                              .to_payload())
