"""LeRobot v3.0: sharded Parquet tables and sharded camera MP4s, located by episode metadata.

Layout (as LeRobot 0.4.x reads it; compared field by field with a dataset LeRobot wrote)::

    data/chunk-XXX/file-XXX.parquet                 several episodes per file
    videos/<video_key>/chunk-XXX/file-XXX.mp4       that camera's frames, several episodes per file
    meta/episodes/chunk-000/file-000.parquet        one row per episode: locators, stats, source fields
    meta/tasks.parquet                              task_index column, task string as the pandas index
    meta/info.json, stats.json, quality_split.json, episodes.jsonl, tasks.jsonl (copies)

Data: episodes are appended one at a time to the open Parquet shard; the shard is closed
when the next episode would push its Arrow size estimate over ``data_files_size_in_mb`` or
its schema differs, and the next file-NNN starts (``chunks_size`` files per chunk folder).

Video: per camera, each episode MP4 is joined to the open shard by stream copy (packets are
demuxed and muxed with pts/dts shifted by the frames already in the shard); nothing is
decoded. An episode whose codec parameters (codec, extradata, width, height, pix_fmt) differ
from the shard's is re-encoded alone with ``reencode_settings``; if even that does not match,
the shard is closed and the episode starts a new one. A shard is also closed when the next
episode would push it over ``video_files_size_in_mb``. Offsets are integer frame counts:
from_timestamp = frames_before / fps, to_timestamp = (frames_before + length) / fps.

Episode metadata: LeRobot's columns, ``stats/<feature>/<stat>`` (min, max, mean, std, count;
no quantiles, the source does not have them), then every other field of the source episode
rows (quality, quality_issues, qc_verdict, note, stream_stats, ...), null where an episode
lacks it. Booleans, integers, floats and strings keep their Arrow type; lists, mappings and
columns mixing types are stored as JSON text (``json.loads`` gives back the original value).
"""

from __future__ import annotations

import json
import logging
import shutil
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import ExportError
from ...fsutil import atomic_write_json, read_json
from ..common import stats as stats_mod
from ..common.exporter import Progress, VerifyReport
from ..common.images import camera_frames
from ..common.meta import INFO, STATS, DatasetMeta
from ..common.provenance import RawNames
from ..common.records import DatasetInfo, EpisodeRow, EpisodeStats
from ..common.video import VideoSettings
from ..lerobot_v21.episode_stats import episode_stats, image_stats_of, missing_image_stats
from ..lerobot_v21.subset import copy_common_meta, load_source, read_episode_table, write_quality_split
from .layout import CODEBASE_V30, DATA_PATH_V30, EPISODES_PATH_V30, FORMAT, TASKS_PARQUET, VIDEO_PATH_V30
from .options import V3Options
from .probe import Probes
from .tables import DataShards, EpisodeStatsColumns, stats_column, v3_data_schema
from .video import VideoShards

_VideoShards = VideoShards  # the name bench/bench_formats.py uses
_DataShards = DataShards
__all__ = ["LeRobotV3Exporter", "extra_field_column", "stats_column", "tasks_table", "v3_data_schema"]

log = logging.getLogger(__name__)


MIB = 1024 * 1024
_LOCATOR_COLUMNS = ("episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                    "dataset_from_index", "dataset_to_index")
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


# ---- small pieces ---------------------------------------------------------------------------
def _mb(size_mb: float) -> int | float:
    return int(size_mb) if float(size_mb).is_integer() else float(size_mb)


def tasks_table(tasks: list[tuple[int, str]]) -> pa.Table:
    """meta/tasks.parquet as pandas writes ``DataFrame({"task_index": ...}, index=tasks)``.

    One int64 column task_index and the task strings as the pandas index (named "task"),
    rows ordered by task_index, with the pandas metadata that makes ``pd.read_parquet``
    restore the index. LeRobot's own writer leaves the index unnamed (``__index_level_0__``);
    both load identically (LeRobot looks tasks up through the index values).
    """
    rows = sorted(tasks)
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.3.3",
    }
    sch = pa.schema([pa.field("task_index", pa.int64()), pa.field("task", pa.string())],
                    metadata={"pandas": json.dumps(pandas_meta)})
    return pa.table([pa.array([i for i, _ in rows], pa.int64()), pa.array([t for _, t in rows], pa.string())],
                    schema=sch)


def _plain_kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    return "json"


def extra_field_column(values: list[Any]) -> pa.Array:
    """A per-episode source field as an Arrow column (nulls where an episode lacks it)."""
    kinds = {_plain_kind(v) for v in values if v is not None}
    if not kinds:
        return pa.array(values, pa.string())
    if kinds == {"bool"}:
        return pa.array(values, pa.bool_())
    if kinds == {"int"}:
        return pa.array(values, pa.int64())
    if kinds <= {"int", "float"}:
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if kinds == {"str"}:
        return pa.array(values, pa.string())
    return pa.array([None if v is None else json.dumps(v, ensure_ascii=False, sort_keys=False) for v in values],
                    pa.string())


# ---- the exporter -----------------------------------------------------------------------------
def _arrow(col: array[Any]) -> pa.Array:
    """int64 / float64 from the flat array's buffer (no Python object per value)."""
    return pa.array(np.frombuffer(col, dtype=np.int64 if col.typecode == "q" else np.float64))


class Locators:
    """The locator columns of meta/episodes, one flat array each, filled episode by episode."""

    def __init__(self, video_keys: list[str]) -> None:
        names = [c for c in _LOCATOR_COLUMNS if c != "tasks"]
        names += [f"videos/{k}/{c}" for k in video_keys for c in _VIDEO_COLUMNS]
        self.cols: dict[str, array[Any]] = {n: array("d" if n.endswith("_timestamp") else "q") for n in names}

    def put(self, name: str, value: float) -> None:
        self.cols[name].append(value)

    def arrow(self, tasks: list[list[str]]) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        for name in _LOCATOR_COLUMNS:
            out[name] = pa.array(tasks, pa.list_(pa.string())) if name == "tasks" else _arrow(self.cols[name])
        for name, col in self.cols.items():
            if name.startswith("videos/"):
                out[name] = _arrow(col)
        return out


class LeRobotV3Exporter:
    """Write a native v2.1 subset as LeRobot v3.0."""

    name = FORMAT

    def __init__(self, options: V3Options = V3Options(), *, chunks_size: int = 1000,
                 reencode_settings: VideoSettings = VideoSettings()) -> None:
        self.data_mb = options.data_file_mb
        self.video_mb = options.video_file_mb
        self.chunks_size = chunks_size
        self.reencode_settings = reencode_settings
        self.last_reencoded: dict[str, list[int]] = {}  # camera -> episodes re-encoded in the last export

    def export(self, native_subset: Path, out_dir: Path, progress: Progress | None = None) -> None:
        progress = progress or Progress()
        src, out = Path(native_subset), Path(out_dir)
        meta = load_source(src)
        info = meta.info
        for sub in ("data", "videos", "meta", ".v3tmp"):  # a staging dir from an interrupted run
            if (out / sub).exists():
                log.warning("%s: removing %s left by an earlier run", out, sub)
                shutil.rmtree(out / sub)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".v3tmp"
        names = RawNames.of(meta)
        data = DataShards(out, int(self.data_mb * MIB), self.chunks_size)
        videos, probes = self._video_shards(meta, out, tmp, names)
        locs, ep_stats = Locators(list(info.video_keys)), EpisodeStatsColumns()
        offset = 0
        try:
            for ep in meta.episodes:
                written = self._episode(meta, ep, offset, data, videos, probes, locs, ep_stats, names)
                offset += ep.length
                progress.on_episode(ep.episode_index, written)
            data.close()
            for shards in videos.values():
                shards.close()
        except BaseException:
            data.close()
            for shards in videos.values():
                try:
                    shards.close()
                except Exception:  # noqa: BLE001 - the export is failing anyway
                    pass
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.last_reencoded = {k: list(v.reencoded) for k, v in videos.items() if v.reencoded}
        self._write_episodes(out, meta, locs, ep_stats)
        pq.write_table(tasks_table([(t.task_index, t.task) for t in meta.tasks]), out / TASKS_PARQUET)
        copy_common_meta(src, out)
        stats = ep_stats.aggregate()
        if (meta.root / STATS).is_file():  # keep anything the source knew that we could not recompute
            for key, value in read_json(meta.root / STATS).items():
                if stats_mod.usable_entry(value):  # never a non-finite number (dataset.stats)
                    stats.setdefault(key, value)
        missing = [k for k in info.features if k not in stats]
        if missing and meta.episodes:  # an empty subset has no values to describe: stats {}
            raise ExportError(f"no statistics for features {missing}")
        atomic_write_json(out / STATS, stats)
        atomic_write_json(out / INFO, self._info(info, len(meta.episodes), offset, len(meta.tasks)))
        # the user learns which raw episodes were not stream-copied (in the marker and the card)
        reenc = {k: [names.index(i) for i in v] for k, v in self.last_reencoded.items()}
        write_quality_split(src, out, self.name, {"reencoded_source_episodes": reenc} if reenc else None)

    def _video_shards(self, meta: DatasetMeta, out: Path, tmp: Path,
                      names: RawNames) -> tuple[dict[str, VideoShards], dict[str, Probes]]:
        """One shard writer per camera, and its files probed a window ahead of the copy (each
        episode MP4 is read once there; small ones keep their packets for the copy)."""
        info = meta.info
        videos, probes = {}, {}
        for k in info.video_keys:
            p = Probes(info.fps)
            p.stream(_video_files(meta, k))
            probes[k] = p
            videos[k] = VideoShards(out, k, info.fps, info.features[k].shape, int(self.video_mb * MIB),
                                    self.chunks_size, self.reencode_settings, tmp, 0, names)
        return videos, probes

    def _episode(self, meta: DatasetMeta, ep: EpisodeRow, offset: int, data: DataShards,
                 videos: dict[str, VideoShards], probes: dict[str, Probes],
                 locs: Locators, ep_stats: EpisodeStatsColumns, names: RawNames) -> int:
        """Append one episode's rows, videos, locators and statistics; the bytes written."""
        info = meta.info
        src_stats: EpisodeStats | None = meta.episodes_stats.get(ep.episode_index)  # parsed once
        table = read_episode(meta, ep, offset)
        loc = data.add(table)
        for name, value in (("episode_index", ep.episode_index), ("length", ep.length),
                            ("data/chunk_index", loc.chunk_index), ("data/file_index", loc.file_index),
                            ("dataset_from_index", offset), ("dataset_to_index", offset + ep.length)):
            locs.put(name, value)
        written = int(table.nbytes)
        for key, shards in videos.items():
            episode_index, path, probed, lead = probes[key].next()
            assert episode_index == ep.episode_index, (episode_index, ep.episode_index)
            shards.ahead = lead * shards.tick
            vloc, frames_before = shards.add(ep.episode_index, path, ep.length, probed)
            locs.put(f"videos/{key}/chunk_index", vloc.chunk_index)
            locs.put(f"videos/{key}/file_index", vloc.file_index)
            locs.put(f"videos/{key}/from_timestamp", frames_before / info.fps)
            locs.put(f"videos/{key}/to_timestamp", (frames_before + ep.length) / info.fps)
            written += probed.size if probed is not None else path.stat().st_size
        st = episode_stats(meta, ep, table, src_stats)
        for key in missing_image_stats(meta, ep, src_stats):
            st[key] = image_stats_of(camera_frames(meta, ep.episode_index, table, key))
        for key in info.table_keys:
            if key not in st:
                raise ExportError(f"{names.episode(ep.episode_index)}: no statistics for {key!r}")
        ep_stats.add(st)
        return written

    def _info(self, info: DatasetInfo, episodes: int, total_frames: int, tasks: int) -> dict[str, Any]:
        src = info.to_dict()
        d: dict[str, Any] = {
            "codebase_version": CODEBASE_V30,
            "robot_type": info.robot_type,
            "total_episodes": episodes,
            "total_frames": total_frames,
            "total_tasks": tasks,
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": _mb(self.data_mb),
            "video_files_size_in_mb": _mb(self.video_mb),
            "fps": info.fps,
            "splits": {"train": f"0:{episodes}"},
            "data_path": DATA_PATH_V30,
            "video_path": VIDEO_PATH_V30 if info.video_keys else None,
            "features": src["features"],
        }
        for key, value in info.extra.items():
            d.setdefault(key, value)
        d["dataset_format"] = FORMAT
        return d

    def _write_episodes(self, out: Path, meta: DatasetMeta, locs: Locators, ep_stats: EpisodeStatsColumns) -> None:
        n = len(meta.episodes)
        cols = locs.arrow([list(ep.tasks) for ep in meta.episodes])
        cols.update(ep_stats.arrow_columns(list(meta.info.features)))
        extra: dict[str, list[Any]] = {}  # field -> its value in every episode (None where absent)
        for pos, ep in enumerate(meta.episodes):
            for k, v in ep.fields_dict().items():
                extra.setdefault(k, [None] * pos).append(v)
            for values in extra.values():
                values.extend([None] * (pos + 1 - len(values)))
        for k, values in extra.items():
            if k in cols or k.startswith(("meta/episodes/", "videos/", "stats/", "data/")):
                raise ExportError(f"episode field {k!r} collides with a LeRobot v3 episode metadata column")
            cols[k] = extra_field_column(values)
        cols["meta/episodes/chunk_index"] = pa.array([0] * n, pa.int64())
        cols["meta/episodes/file_index"] = pa.array([0] * n, pa.int64())
        path = out / EPISODES_PATH_V30.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), path)

    def verify(self, out_dir: Path) -> VerifyReport:
        from .verify import verify_v3
        return verify_v3(Path(out_dir))


def _video_files(meta: DatasetMeta, key: str) -> Iterator[tuple[int, Path]]:
    """(episode, MP4) of one camera in episode order, each path made when it is reached (a
    list of them was a Path object per episode, held through the job)."""
    for ep in meta.episodes:
        yield ep.episode_index, meta.video_path(key, ep.episode_index)


def read_episode(meta: DatasetMeta, ep: EpisodeRow, offset: int) -> pa.Table:
    return read_episode_table(meta, ep, first_index=offset)
