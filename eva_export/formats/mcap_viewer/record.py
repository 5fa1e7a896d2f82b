"""Why an episode is in its subset, as the viewer profile carries it: the MCAP metadata record
``eva_export.episode`` (string values) and the same as text on the ``/eva_export/episode``
channel, which Rerun shows as a text document and Foxglove in its Raw Messages panel."""

from __future__ import annotations

import json
from typing import Any

from ..common.meta import DatasetMeta
from ..common.records import EpisodeRow, QualitySplit
from ..lerobot_v21.episode_files import to_plain
from .layout import FORMAT


def episode_record(meta: DatasetMeta, ep: EpisodeRow) -> dict[str, Any]:
    """The episode row with its subset, its raw episode index, fps and robot type."""
    qs = QualitySplit.read(meta.root)
    pos = ep.episode_index  # a renumbered subset: the row's position (a scan per episode is quadratic)
    if not (0 <= pos < len(meta.episodes) and meta.episodes[pos].episode_index == pos):
        pos = next((i for i, e in enumerate(meta.episodes) if e.episode_index == ep.episode_index), -1)
    source = qs.source_episode_indices[pos] if 0 <= pos < len(qs.source_episode_indices) else None
    return {**to_plain(ep.to_dict()), "subset": qs.subset, "source_episode_index": source,
            "fps": meta.info.fps, "dataset_format": FORMAT, "robot_type": meta.info.robot_type}


def metadata_strings(record: dict[str, Any]) -> dict[str, str]:
    """The MCAP metadata record's map: strings as they are, everything else as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}


def episode_text(record: dict[str, Any]) -> str:
    """A few lines a person reads in a viewer, then the whole record as JSON."""
    issues = record.get("quality_issues") or []
    found = "; ".join(f"{i.get('code')}: {i.get('detail')}" for i in issues if isinstance(i, dict))
    note = record.get("note") or ""
    lines = [
        f"{record['subset']} episode {record['episode_index']} (raw episode {record['source_episode_index']}), "
        f"{record['length']} frames at {record['fps']} fps",
        "task: " + "; ".join(str(t) for t in record.get("tasks") or []),
        f"quality: {record.get('quality') or 'unrated'}" + (f" ({found})" if found else ""),
        f"operator: {record.get('qc_verdict') or 'no verdict'}" + (f", note: {note}" if note else ""),
    ]
    return "\n".join(lines) + "\n\n" + json.dumps(record, indent=1, sort_keys=True)


def record_of_text(text: str) -> dict[str, Any]:
    """The JSON record at the end of ``episode_text``."""
    record: dict[str, Any] = json.loads(text.split("\n\n", 1)[1])
    return record
