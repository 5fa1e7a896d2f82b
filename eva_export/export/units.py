"""One unit of the quality split: a source episode written as a native v2.1 episode.

A unit's files (its rewritten Parquet, its camera files: hard links of a v2.1/v2.0 source's
files, or cuts of a v3.0 source's shared MP4s) go straight to their templated v2.1 paths inside
``<staging>/native/<subset>``; then its record ``<staging>/units/<subset>/ep_NNNNNN.json``
(episode row, statistics, row count) is renamed into place: the commit point. How an episode
is read is the source's business (formats/common/source.py: ``read_table``, ``place_video``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import confine
from ..errors import DatasetError, ExportError
from ..formats.common import stats as stats_mod
from ..formats.common.commits import UnitRecord
from ..formats.common.images import iter_table_images
from ..formats.common.nonfinite import float_keys, table_facts
from ..formats.common.records import DatasetInfo
from ..formats.common.source import place_video, read_table, staged_video_ok
from ..formats.common.source_rules import SourceEpisode
from ..formats.common.table import to_numpy
from ..formats.common.video import iter_frames
from ..formats.lerobot_v21.episode_stats import image_stats_of
from ..fsutil import FILE_MODE, read_json, set_file_mode

#: Episode row field naming the cameras re-encoded because no exact stream-copy cut existed.
REENCODED_FIELD = "source_video_reencoded"
RECOMPUTED_COLUMNS = ("episode_index", "index", "task_index")


@dataclass
class PlannedEpisode:
    source: SourceEpisode
    subset: str
    new_index: int
    offset: int  # global index of its first frame within the subset
    task_map: dict[int, int]
    source_no: int = 0  # which source of the request (merge.py); 0 for a single source
    provenance: dict[str, Any] = field(default_factory=dict)  # row fields of a named export (merge.py)


def native_dir(staging: Path, subset: str) -> Path:
    """Where the native subset is laid out (its files at their final templated paths)."""
    return staging / "native" / subset


def units_dir(staging: Path, subset: str) -> Path:
    """Where a subset's unit records are (absent: none committed yet)."""
    return staging / "units" / subset


def unit_record(staging: Path, p: PlannedEpisode) -> Path:
    """The unit's commit record: it exists only once the unit's files are complete."""
    return unit_record_at(staging, p.subset, p.new_index)


def unit_record_at(staging: Path, subset: str, new_index: int) -> Path:
    """``unit_record`` of the subset's episode ``new_index`` (without rebuilding its plan)."""
    return units_dir(staging, subset) / f"ep_{new_index:06d}.json"


def unit_files(staging: Path, p: PlannedEpisode, info: DatasetInfo) -> tuple[Path, dict[str, Path]]:
    # The templates were checked by validation; confining again keeps a write inside staging
    # even if a caller skipped it.
    root = native_dir(staging, p.subset)
    return (confine.confined(root, info.data_file(p.new_index), "staged data file"),
            {k: confine.confined(root, info.video_file(k, p.new_index), "staged video file")
             for k in p.source.video_paths})


def write_text(path: Path, text: str) -> None:
    """Write then rename: a killed process leaves the old file or the new one (no fsync)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb") as fh:
        set_file_mode(fh.fileno())  # meta files get the data files' mode (whatever the umask)
        fh.write(text.encode("utf-8"))
    os.replace(tmp, path)


def _make_dir(path: Path, made: set[Path] | None) -> None:
    """``path`` and its parents created, once per batch (``made``): the directories are the
    staging's own, and a batch's units share their chunk and camera directories."""
    if made is None or path not in made:
        path.mkdir(parents=True, exist_ok=True)
        if made is not None:
            made.add(path)


def _camera_stats(path: Path) -> dict[str, Any]:
    return image_stats_of(iter_frames(path))


def unit_is_complete(staging: Path, p: PlannedEpisode, info: DatasetInfo) -> bool:
    """A committed unit is trusted only after checking its record, row count and files."""
    try:
        u = UnitRecord.from_dict(read_json(unit_record(staging, p)))
        if (u.source_episode_index, u.episode_index, u.rows, u.offset) != (
                p.source.index, p.new_index, p.source.rows, p.offset):
            return False
        if any(u.row.get(k) != v for k, v in p.provenance.items()):  # another source's unit
            return False
        data, videos = unit_files(staging, p, info)
        with pq.ParquetFile(data) as pf:
            if pf.metadata.num_rows != p.source.rows:
                return False
        return all(staged_video_ok(p.source, key, videos[key], u.video_sizes.get(key)) for key in p.source.video_paths)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return False


def _replace(table: pa.Table, name: str, values: np.ndarray[Any, Any]) -> pa.Table:
    i = table.schema.get_field_index(name)
    typ = table.schema.field(i).type
    return table.set_column(i, table.schema.field(i), pa.array(values.astype(typ.to_pandas_dtype()), type=typ))


def renumbered(p: PlannedEpisode, table: pa.Table) -> pa.Table:
    """The episode's rows in its subset: episode_index, index and task_index renumbered (the
    native unit writes them; the direct v3 job shards them)."""
    n, src = table.num_rows, p.source
    table = _replace(table, "episode_index", np.full(n, p.new_index, dtype=np.int64))
    table = _replace(table, "index", np.arange(p.offset, p.offset + n, dtype=np.int64))
    if "task_index" in table.column_names:
        old = to_numpy(table.column("task_index")).astype(np.int64)
        unknown = sorted(set(np.unique(old).tolist()) - set(p.task_map))
        if unknown:
            raise DatasetError(f"episode {src.index}: task_index {unknown} changed during the export")
        lut = np.zeros(max(p.task_map) + 1 if p.task_map else 1, dtype=np.int64)
        for o, nw in p.task_map.items():
            lut[o] = nw
        table = _replace(table, "task_index", lut[old])
    return table


def build_unit(staging: Path, p: PlannedEpisode, info: DatasetInfo, source_stats: dict[str, Any],
               made: set[Path] | None = None) -> int:
    """Write one episode's files at their final paths in the native subset, then its record.

    The record (renamed into place last) is the commit point; files without a record are
    rewritten by the next run. Returns the bytes the unit holds.
    """
    src = p.source
    data, videos = unit_files(staging, p, info)
    table = read_table(src)  # its own file, or its rows of a shared v3.0 file
    n = table.num_rows
    if n != src.rows:
        raise DatasetError(f"episode {src.index}: {src.data_path} changed during the export "
                           f"({n} rows, validated {src.rows})")
    table = renumbered(p, table)
    _make_dir(data.parent, made)
    tmp = data.with_name(f".{data.name}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink:  # not a path: pyarrow resolves its filesystem per open
        pq.write_table(table, sink)
    os.replace(tmp, data)
    # counted from the table as written: the accepted subset's NaN/inf scan need not read it back
    nonfinite = table_facts(table, float_keys(info), os.stat(data))
    st = _unit_stats(table, info, source_stats, {k for k, _ in nonfinite.counts}, unit_name(p))
    del table
    sizes = {}
    reencoded = []
    for key in src.video_paths:
        placed = place_video(src, key, videos[key], info.fps)
        sizes[key] = placed.bytes
        if placed.reencoded:
            reencoded.append(key)
        if key not in st:  # a v3.0 / v2.0 source without camera statistics: computed here
            st[key] = _camera_stats(videos[key])
    row = src.row.to_dict()
    row["episode_index"] = p.new_index
    row["source_episode_index"] = src.index
    row.update(p.provenance)  # a named export: the source dataset (and robot type) of this episode
    if reencoded:  # provenance: these cameras are not the source's bytes (no exact cut existed)
        row[REENCODED_FIELD] = reencoded
    rec = unit_record(staging, p)
    _make_dir(rec.parent, made)
    write_text(rec, json.dumps(UnitRecord(src.index, p.new_index, n, p.offset, row, st, sizes, nonfinite).to_dict()))
    return nonfinite.file[2] + sum(sizes.values())


def _unit_stats(table: pa.Table, info: DatasetInfo, source_stats: dict[str, Any], flagged: set[str],
                where: str) -> dict[str, Any]:
    """The unit's statistics: the source's kept, recomputed for the columns whose values changed,
    or whose statistics are missing, lack a quantile, hold a non-finite number or may have taken
    a non-finite value in (``flagged``; dataset.stats: only finite rows go in)."""
    st: dict[str, Any] = {k: v for k, v in source_stats.items() if trusted_stats(v)}
    names = set(table.column_names)  # a new list per access
    st.update(_recomputed_stats(table, [k for k in info.table_keys if (k in RECOMPUTED_COLUMNS or k not in st
                                                                       or k in flagged)
                                        and k in names and not info.features[k].is_visual]))
    for k in info.table_keys:  # a camera carried in the table without complete statistics: its frames'
        if info.features[k].is_visual and k not in st and k in names:
            st[k] = image_stats_of(iter_table_images(table, k, f"{where}: {k}"))
    return st


def trusted_stats(entry: Any) -> bool:
    """A source's statistics kept as they are: every stat and quantile there, all finite."""
    return stats_mod.usable_entry(entry) and entry.keys() >= stats_mod.QUANTILE_SET


def _recomputed_stats(table: pa.Table, keys: list[str]) -> dict[str, Any]:
    """``column_stats`` of each column; the scalar integer ones (episode_index, index,
    task_index) in one call over their stacked values: each element's statistics are its own,
    and three numpy passes per short episode were most of its statistics' cost."""
    values = {k: to_numpy(table.column(k)) for k in keys}
    ints = [k for k, v in values.items() if v.ndim == 1 and v.dtype == np.int64]
    out = {k: stats_mod.column_stats(v) for k, v in values.items() if k not in ints}
    if len(ints) == 1:
        out[ints[0]] = stats_mod.column_stats(values[ints[0]])
    elif ints:
        # column-major: each column summed contiguously (pairwise), as a column of its own is
        both = stats_mod.column_stats(np.asfortranarray(np.stack([values[k] for k in ints], axis=1)))
        for i, k in enumerate(ints):
            out[k] = {name: (v if name == "count" else [v[i]]) for name, v in both.items()}
    return out


def split_unit(staging: Path, p: PlannedEpisode, info: DatasetInfo, source_stats: dict[str, Any],
                fail: bool, made: set[Path] | None = None) -> int:
    """One native unit, run by eva_export.pool (in this process or in a worker process)."""
    if fail:  # fault injection (Faults "unit:N"), raised where the unit runs
        raise ExportError(f"{unit_name(p)}: injected failure at 'unit:{p.source.index}'")
    return build_unit(staging, p, info, source_stats, made)


@dataclass(frozen=True)
class UnitWork:
    """One episode of a batch: its plan, its source statistics, and whether a fault is injected."""

    planned: PlannedEpisode
    source_stats: dict[str, Any]
    fail: bool = False


def split_units(staging: Path, batch: list[UnitWork], info: DatasetInfo) -> int:
    """A batch of units in order, each committed by its own record (a failure keeps the ones
    before it). One pool task per batch: sending ``info`` and a worker round trip per short
    episode cost more than the episode itself."""
    made: set[Path] = set()
    return sum(split_unit(staging, w.planned, info, w.source_stats, w.fail, made) for w in batch)


def unit_name(p: PlannedEpisode) -> str:
    return f"{p.subset} episode {p.new_index} (source episode {p.source.index})"


