"""A subset's episodes as the native split states them, made straight from the source.

The direct v3 writer needs what the native split's subset would have said of each episode
(its renumbered rows, its episodes.jsonl row, its statistics) without the subset's files:
the rows are renumbered in memory exactly as a split unit writes them (units.py), the
statistics computed by the same function, and the subset's meta files (info, tasks, episode
rows, marker; statistics once known) are written to ``<staging>/v3/<subset>/native``: the
exporter's meta copies (episodes.jsonl, tasks.jsonl, episodes_stats.jsonl, stats.json, the
marker and card) come from there, byte for byte what the split's assembly writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import DatasetError
from ..formats.common.meta import EPISODES, EPISODES_STATS, INFO, TASKS, DatasetMeta
from ..formats.common.nonfinite import count_table
from ..formats.common.provenance import RawNames
from ..formats.common.records import FORMAT_V21, QUALITY_SPLIT_FILE, DatasetInfo, EpisodeRow, QualitySplit, TaskRow
from ..formats.common.source import read_table
from ..formats.common.video import iter_frames
from ..formats.lerobot_v21.episode_stats import image_stats_of
from ..fsutil import dumps_json, jsonl_dumps
from .assemble import JsonlStream, StatsSum
from .plan_list import PlanList
from .units import PlannedEpisode, _unit_stats, renumbered, unit_name, write_text
from .v3_records import EpisodeEntry


@dataclass
class NativeSubset:
    """The native meta of one subset (no data files) and what the v3 writer reads of it."""

    dir: Path  # <staging>/v3/<subset>/native: meta/ as the split's assembly writes it
    info: DatasetInfo  # as info.json reads back
    rows: list[EpisodeRow]  # as episodes.jsonl reads back
    tasks: list[TaskRow]
    names: RawNames  # the raw dataset's file and episode behind each subset episode

    @property
    def meta(self) -> DatasetMeta:
        """The subset as the exporter's helpers read one (no episode statistics: in the writer)."""
        return DatasetMeta(self.dir, self.info, self.rows, self.tasks, {})


def write_native_meta(out: Path, items: PlanList, info: DatasetInfo, tasks: list[tuple[int, str]],
                      marker: QualitySplit) -> NativeSubset:
    """info.json, tasks.jsonl, episodes.jsonl and the marker of the subset, as assemble_subset
    writes them (statistics follow once the episodes are converted: ``write_stats``)."""
    (out / "meta").mkdir(parents=True, exist_ok=True)
    rows: list[EpisodeRow] = []
    episodes = JsonlStream(out / EPISODES)
    try:
        for p in items:
            # the split's unit record round trip (JSON) is what its episodes.jsonl row is made of;
            # the line is its text (a second encoding of what it decodes to gives the same text)
            text = json.dumps(native_row(p), ensure_ascii=False)
            d = json.loads(text)
            episodes.write_line(text)
            rows.append(EpisodeRow.from_dict(d))
    except BaseException:
        episodes.discard()
        raise
    episodes.commit()
    native = DatasetInfo.from_dict(info.to_dict())
    native.set_totals(len(items), items.frames, len(tasks))
    native.extra["dataset_format"] = FORMAT_V21
    write_text(out / TASKS, jsonl_dumps({"task_index": i, "task": t} for i, t in tasks))
    write_text(out / INFO, dumps_json(native.to_dict()))
    write_text(out / QUALITY_SPLIT_FILE, dumps_json(marker.to_dict()))
    task_rows = [TaskRow(i, t) for i, t in tasks]
    read_back = DatasetInfo.from_dict(json.loads(dumps_json(native.to_dict())))
    return NativeSubset(out, read_back, rows, task_rows, RawNames.of(DatasetMeta(out, read_back, rows, task_rows, {})))


class NativeStats:
    """episodes_stats.jsonl of the subset, streamed as the episodes go by. Its stats.json (the
    split's aggregate) is only read by the exporter for a feature the v3 statistics could not
    aggregate: made from these lines then (``aggregate``), not merged episode by episode."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lines = JsonlStream(root / EPISODES_STATS)

    def add(self, episode_index: int, stats_json: str) -> None:
        """The line ``{"episode_index": i, "stats": stats}`` as JsonlStream.write encodes it,
        from the statistics' text (EpisodeEntry.stats_json)."""
        self.lines.write_line(f'{{"episode_index": {int(episode_index)}, "stats": {stats_json}}}')

    def commit(self) -> None:
        self.lines.commit()

    def aggregate(self) -> dict[str, Any]:
        """stats.json as the split's assembly writes it, read back."""
        total = StatsSum()
        for line in (self.root / EPISODES_STATS).read_text(encoding="utf-8").splitlines():
            total.add(json.loads(line)["stats"])
        result: dict[str, Any] = json.loads(dumps_json(total.result()))
        return result

    def discard(self) -> None:
        self.lines.discard()


def native_row(p: PlannedEpisode) -> dict[str, Any]:
    """The episode's row in the native subset (build_unit's)."""
    row = p.source.row.to_dict()
    row["episode_index"] = p.new_index
    row["source_episode_index"] = p.source.index
    row.update(p.provenance)
    return row


def episode_rows(p: PlannedEpisode, info: DatasetInfo, source_stats: dict[str, Any],
                 float_keys: list[str]) -> tuple[pa.Table, EpisodeEntry]:
    """One episode read from its source: its renumbered rows and what it adds to the metadata
    (statistics as a split unit records them, NaN/inf counts)."""
    src = p.source
    table = read_table(src)
    if table.num_rows != src.rows:
        raise DatasetError(f"episode {src.index}: {src.data_path} changed during the export "
                           f"({table.num_rows} rows, validated {src.rows})")
    table = renumbered(p, table)
    counts = count_table(table, float_keys)
    st = _unit_stats(table, info, source_stats, {k for k, _ in counts}, unit_name(p))
    for key in src.video_paths:
        if key not in st:  # a source without camera statistics: computed from its frames
            st[key] = image_stats_of(iter_frames(src.camera_span(key).path))
    return table, EpisodeEntry.of(st, counts)
