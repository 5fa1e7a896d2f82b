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
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ..dataset.meta import INFO, STATS, DatasetMeta
from ..dataset.records import DatasetInfo, EpisodeRow
from ..dataset.video import VideoEncoder, VideoSettings, count_frames, iter_frames
from ..errors import ExportError, VideoError
from ..fsutil import atomic_write_json, read_json
from .base import Progress, VerifyReport
from .checks import check_sample, check_totals, start_report
from .episode_stats import dataset_stats, episode_stats, image_stats_of, missing_image_stats
from .images import camera_frames, decode_png
from .source import (
    column_numpy,
    copy_common_meta,
    load_source,
    read_episode_table,
    state_action_keys,
    write_quality_split,
)

log = logging.getLogger(__name__)

FORMAT = "lerobot_v3"
CODEBASE_V30 = "v3.0"
DATA_PATH_V30 = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH_V30 = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH_V30 = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
TASKS_PARQUET = "meta/tasks.parquet"
MIB = 1024 * 1024
_LOCATOR_COLUMNS = ("episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                    "dataset_from_index", "dataset_to_index")
_HF_DTYPES = {"float": "float32", "double": "float64", "int64": "int64", "int32": "int32", "bool": "bool",
              "string": "string", "large_string": "large_string", "halffloat": "float16"}


# ---- small pieces ---------------------------------------------------------------------------
def _mb(size_mb: float) -> int | float:
    return int(size_mb) if float(size_mb).is_integer() else float(size_mb)


def _hf_value(typ: pa.DataType) -> dict[str, Any]:
    return {"dtype": _HF_DTYPES.get(str(typ), str(typ)), "_type": "Value"}


def _is_image_struct(typ: pa.DataType) -> bool:
    return pa.types.is_struct(typ) and {typ.field(i).name for i in range(typ.num_fields)} == {"bytes", "path"}


def v3_data_schema(src: pa.Schema) -> pa.Schema:
    """The source schema with the 'huggingface' metadata LeRobot 0.4 writes (``_type: List``)."""
    feats: dict[str, Any] = {}
    for f in src:
        if _is_image_struct(f.type):  # LeRobot's image feature: PNG bytes + path, HF type "Image"
            feats[f.name] = {"_type": "Image"}
        elif pa.types.is_fixed_size_list(f.type):
            feats[f.name] = {"feature": _hf_value(f.type.value_type), "length": f.type.list_size, "_type": "List"}
        elif pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            feats[f.name] = {"feature": _hf_value(f.type.value_type), "_type": "List"}
        else:
            feats[f.name] = _hf_value(f.type)
    return pa.schema(list(src), metadata={"huggingface": json.dumps({"info": {"features": feats}})})


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


def stats_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        floats = [None if v is None else np.asarray(v, dtype=np.float64).tolist() for v in values]
        return pa.array(floats)


@dataclass
class _Locator:
    chunk_index: int
    file_index: int


class _Numbering:
    """file-NNN inside chunk-NNN, ``chunks_size`` files per chunk folder."""

    def __init__(self, chunks_size: int) -> None:
        self.chunks_size = chunks_size
        self.chunk = 0
        self.file = -1

    def next(self) -> _Locator:
        self.file += 1
        if self.file >= self.chunks_size:
            self.chunk, self.file = self.chunk + 1, 0
        return _Locator(self.chunk, self.file)


class _DataShards:
    """Parquet shards written one episode at a time."""

    def __init__(self, out: Path, limit_bytes: int, chunks_size: int) -> None:
        self.out = out
        self.limit = limit_bytes
        self.numbering = _Numbering(chunks_size)
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.loc = _Locator(0, 0)
        self.size = 0
        self.files: list[Path] = []

    def add(self, table: pa.Table) -> _Locator:
        table = table.replace_schema_metadata(None)
        sch = v3_data_schema(table.schema)
        if self.writer is not None and (not sch.equals(self.schema, check_metadata=True)
                                        or self.size + table.nbytes > self.limit):
            self.close()
        if self.writer is None:
            self.loc = self.numbering.next()
            path = self.out / DATA_PATH_V30.format(chunk_index=self.loc.chunk_index, file_index=self.loc.file_index)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, sch)
            self.schema, self.size = sch, 0
            self.files.append(path)
        self.writer.write_table(table.cast(sch))
        self.size += table.nbytes
        return _Locator(self.loc.chunk_index, self.loc.file_index)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass(frozen=True)
class _CodecParams:
    codec: str
    width: int
    height: int
    pix_fmt: str
    extradata: bytes


def _params(stream: av.video.stream.VideoStream) -> _CodecParams:
    """The stream's codec parameters, named by codec id (AV1, H.264...), never by the decoder.

    PyAV opens AV1 with the decoder ``libdav1d``; its name is not a codec anything can mux.
    Two streams are joinable when the codec id and these parameters agree, whichever decoder
    PyAV picked for them.
    """
    cc = stream.codec_context
    codec = cc.codec
    return _CodecParams(f"id{codec.id}:{codec.type}", cc.width, cc.height, str(cc.pix_fmt),
                        bytes(cc.extradata or b""))


class _VideoShards:
    """One camera's MP4 shards, built by stream copy."""

    def __init__(self, out: Path, key: str, fps: int, shape: tuple[int, ...], limit_bytes: int,
                 chunks_size: int, reencode: VideoSettings, tmp_dir: Path) -> None:
        self.out, self.key, self.fps = out, key, fps
        self.height, self.width = int(shape[0]), int(shape[1])
        self.limit = limit_bytes
        self.numbering = _Numbering(chunks_size)
        self.reencode = reencode
        self.tmp_dir = tmp_dir
        self.container: Any = None
        self.stream: Any = None
        self.params: _CodecParams | None = None
        self.loc = _Locator(0, 0)
        self.frames = 0
        self.size = 0
        self.reencoded: list[int] = []
        self.files: list[Path] = []

    def _open(self, template: Any, params: _CodecParams) -> None:
        self.loc = self.numbering.next()
        path = self.out / VIDEO_PATH_V30.format(video_key=self.key, chunk_index=self.loc.chunk_index,
                                                file_index=self.loc.file_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), mode="w", format="mp4", options={"movflags": "faststart"})
        # opaque=True copies the input's codec parameters (codec id, extradata, size, pix_fmt)
        # without opening an encoder; the default looks a codec up by the DECODER's name, which
        # fails for AV1 (libdav1d) and any other codec PyAV decodes with a named library.
        self.stream = self.container.add_stream_from_template(template, opaque=True)
        self.params, self.frames, self.size = params, 0, 0
        self.files.append(path)

    def close(self) -> None:
        if self.container is not None:
            try:
                self.container.close()
            except av.FFmpegError as exc:
                raise ExportError(f"{self.key}: cannot finish video shard {self.files[-1]} ({exc})") from exc
            self.container = self.stream = None

    def add(self, episode_index: int, path: Path, rows: int) -> tuple[_Locator, int]:
        """Append one episode MP4; returns the shard locator and the frames before it in the shard."""
        if not path.is_file():
            raise ExportError(f"episode {episode_index}: {self.key} video {path} is missing")
        est = path.stat().st_size
        if self.container is not None and self.size + est > self.limit:
            self.close()
        try:
            with av.open(str(path)) as src:
                s = src.streams.video[0]
                params = _params(s)
                if (params.width, params.height) != (self.width, self.height):
                    raise ExportError(f"episode {episode_index}: {self.key} video is {params.width}x{params.height}, "
                                      f"the feature is {self.width}x{self.height}")
                if self.container is None:
                    self._open(s, params)
                if params == self.params:
                    return self._copy(episode_index, src, s, rows, path)
        except av.FFmpegError as exc:
            raise ExportError(f"episode {episode_index}: cannot read {self.key} video {path} ({exc})") from exc
        return self._add_reencoded(episode_index, path, rows)

    def _add_reencoded(self, episode_index: int, path: Path, rows: int) -> tuple[_Locator, int]:
        """Codec parameters differ from the open shard: re-encode only this episode."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_dir / f"{self.key}-{episode_index:06d}.mp4"
        enc = VideoEncoder(tmp, self.width, self.height, self.fps, self.reencode)
        try:
            for frame in iter_frames(path):
                enc.add(frame)
            n = enc.close()
        except VideoError as exc:
            enc.abort()
            raise ExportError(f"episode {episode_index}: re-encoding {self.key} failed ({exc})") from exc
        if n != rows:
            raise ExportError(f"episode {episode_index}: {self.key} video decodes to {n} frames, "
                              f"the table has {rows} rows")
        self.reencoded.append(episode_index)
        try:
            with av.open(str(tmp)) as src:
                s = src.streams.video[0]
                params = _params(s)
                if params != self.params:
                    # Still not joinable (the shard came from other encoder settings): new shard.
                    log.warning("%s episode %d: codec parameters differ from shard %s; starting a new shard",
                                self.key, episode_index, self.files[-1].name)
                    self.close()
                    self._open(s, params)
                return self._copy(episode_index, src, s, rows, tmp)
        finally:
            tmp.unlink(missing_ok=True)

    def _copy(self, episode_index: int, src: Any, s: Any, rows: int, path: Path) -> tuple[_Locator, int]:
        before = self.frames
        offset_s = Fraction(before, self.fps)
        shift: int | None = None  # one integer per episode: Fraction arithmetic per packet was 1/4 of the export
        n = 0
        for pkt in src.demux(s):
            if pkt.size == 0:
                continue
            if pkt.pts is None or pkt.dts is None:
                raise ExportError(f"episode {episode_index}: {self.key} packet {n} of {path.name} has no timestamp")
            if shift is None:
                if not pkt.is_keyframe:
                    raise ExportError(f"episode {episode_index}: {self.key} video {path.name} does not start "
                                      "with a keyframe; cannot join it by stream copy")
                base = s.start_time if s.start_time is not None else pkt.pts
                shift = round(offset_s / pkt.time_base) - base  # the stream's time base, the same for every packet
            pkt.pts += shift
            pkt.dts += shift
            pkt.stream = self.stream
            self.container.mux(pkt)
            self.size += pkt.size
            n += 1
        if n != rows:
            raise ExportError(f"episode {episode_index}: {self.key} video has {n} frames, the table has {rows} rows")
        self.frames += n
        return _Locator(self.loc.chunk_index, self.loc.file_index), before


# ---- the exporter -----------------------------------------------------------------------------
class LeRobotV3Exporter:
    """Write a native v2.1 subset as LeRobot v3.0."""

    name = FORMAT

    def __init__(self, data_files_size_in_mb: float = 100, video_files_size_in_mb: float = 200,
                 chunks_size: int = 1000, reencode_settings: VideoSettings = VideoSettings()) -> None:
        self.data_mb = data_files_size_in_mb
        self.video_mb = video_files_size_in_mb
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
        data = _DataShards(out, int(self.data_mb * MIB), self.chunks_size)
        videos = {k: _VideoShards(out, k, info.fps, info.features[k].shape, int(self.video_mb * MIB),
                                  self.chunks_size, self.reencode_settings, tmp) for k in info.video_keys}
        rows: list[dict[str, Any]] = []
        ep_stats: list[dict[str, Any]] = []
        computed: dict[int, dict[str, Any]] = {}
        offset = 0
        try:
            for ep in meta.episodes:
                table = read_episode(meta, ep, offset)
                loc = data.add(table)
                row: dict[str, Any] = {
                    "episode_index": ep.episode_index, "tasks": list(ep.tasks), "length": ep.length,
                    "data/chunk_index": loc.chunk_index, "data/file_index": loc.file_index,
                    "dataset_from_index": offset, "dataset_to_index": offset + ep.length,
                }
                written = table.nbytes
                for key, shards in videos.items():
                    vloc, frames_before = shards.add(ep.episode_index, meta.video_path(key, ep.episode_index),
                                                     ep.length)
                    row[f"videos/{key}/chunk_index"] = vloc.chunk_index
                    row[f"videos/{key}/file_index"] = vloc.file_index
                    row[f"videos/{key}/from_timestamp"] = frames_before / info.fps
                    row[f"videos/{key}/to_timestamp"] = (frames_before + ep.length) / info.fps
                    written += meta.video_path(key, ep.episode_index).stat().st_size
                st = episode_stats(meta, ep, table)
                for key in missing_image_stats(meta, ep):
                    st[key] = image_stats_of(camera_frames(meta, ep.episode_index, table, key))
                    computed.setdefault(ep.episode_index, {})[key] = st[key]
                for key in info.table_keys:
                    if key not in st:
                        raise ExportError(f"episode {ep.episode_index}: no statistics for {key!r}")
                rows.append(row)
                ep_stats.append(st)
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

        self._write_episodes(out, meta, rows, ep_stats)
        pq.write_table(tasks_table([(t.task_index, t.task) for t in meta.tasks]), out / TASKS_PARQUET)
        copy_common_meta(src, out)
        stats = dataset_stats(meta, {ep.episode_index: s for ep, s in zip(meta.episodes, ep_stats, strict=False)})
        missing = [k for k in info.features if k not in stats]
        if missing and meta.episodes:  # an empty subset has no values to describe: stats {}
            raise ExportError(f"no statistics for features {missing}")
        atomic_write_json(out / STATS, stats)
        atomic_write_json(out / INFO, self._info(info, len(meta.episodes), offset, len(meta.tasks)))
        write_quality_split(src, out, self.name)

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

    def _write_episodes(self, out: Path, meta: DatasetMeta, rows: list[dict[str, Any]],
                        ep_stats: list[dict[str, Any]]) -> None:
        cols: dict[str, pa.Array] = {}
        n = len(rows)
        names = list(rows[0]) if rows else list(_LOCATOR_COLUMNS) + [
            f"videos/{k}/{c}" for k in meta.info.video_keys
            for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        for name in names:
            values = [r.get(name) for r in rows]
            if name == "tasks":
                cols[name] = pa.array(values, pa.list_(pa.string()))
            elif name.endswith("_timestamp"):
                cols[name] = pa.array(values, pa.float64())
            else:
                cols[name] = pa.array(values, pa.int64())
        for feat in meta.info.features:
            stat_names: list[str] = []
            for st in ep_stats:
                for s in st.get(feat, {}):
                    if s not in stat_names:
                        stat_names.append(s)
            for s in stat_names:
                cols[f"stats/{feat}/{s}"] = stats_column([st.get(feat, {}).get(s) for st in ep_stats])
        extra_keys: list[str] = []
        episode_fields = [ep.fields_dict() for ep in meta.episodes]
        for fields in episode_fields:
            for k in fields:
                if k not in extra_keys:
                    extra_keys.append(k)
        for k in extra_keys:
            if k in cols or k.startswith(("meta/episodes/", "videos/", "stats/", "data/")):
                raise ExportError(f"episode field {k!r} collides with a LeRobot v3 episode metadata column")
            cols[k] = extra_field_column([fields.get(k) for fields in episode_fields])
        cols["meta/episodes/chunk_index"] = pa.array([0] * n, pa.int64())
        cols["meta/episodes/file_index"] = pa.array([0] * n, pa.int64())
        path = out / EPISODES_PATH_V30.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), path)

    def verify(self, out_dir: Path) -> VerifyReport:
        return verify_v3(Path(out_dir))


def read_episode(meta: DatasetMeta, ep: EpisodeRow, offset: int) -> pa.Table:
    return read_episode_table(meta, ep, first_index=offset)


# ---- reading back (verifier, tests) ---------------------------------------------------------
def read_episodes_meta(root: Path) -> pa.Table:
    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise ValueError(f"{root}: no meta/episodes/chunk-*/file-*.parquet")
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")


def decode_frame_at(path: Path, frame_number: int, fps: int) -> NDArray[Any]:
    """Decode the frame shown at ``frame_number / fps`` seconds of an MP4 (seek, then decode)."""
    target = Fraction(frame_number, fps)
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        tb = s.time_base or Fraction(1, fps)
        c.seek(int(target / tb), stream=s, backward=True, any_frame=False)
        for frame in c.decode(s):
            if frame.pts is None:
                continue
            t = Fraction(frame.pts) * tb
            if abs(t - target) < Fraction(1, 10000):
                return frame.to_ndarray(format="rgb24")
            if t > target:
                break
    raise VideoError(f"{path}: no frame at {float(target):.4f} s (frame {frame_number})")


def verify_v3(root: Path) -> VerifyReport:
    report, info = start_report(root, FORMAT)
    if info is None:
        return report
    if info.get("codebase_version") != CODEBASE_V30:
        report.errors.append(f"info.json codebase_version {info.get('codebase_version')!r}, expected v3.0")
    for key in ("total_videos", "total_chunks"):
        if key in info:
            report.errors.append(f"info.json has {key}, which LeRobot v3.0 dropped")
    fps = int(info["fps"])
    video_keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    try:
        eps = read_episodes_meta(root).to_pylist()
    except (ValueError, OSError, pa.ArrowException) as exc:
        report.errors.append(str(exc))
        return report
    n_err = len(report.errors)
    # episode order and global ranges
    expect_from = 0
    data_files: dict[tuple[int, int], list[dict[str, Any]]] = {}
    video_files: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for pos, e in enumerate(eps):
        if e["episode_index"] != pos:
            report.errors.append(f"episode metadata row {pos} has episode_index {e['episode_index']}")
        if e["dataset_from_index"] != expect_from or e["dataset_to_index"] - e["dataset_from_index"] != e["length"]:
            report.errors.append(f"episode {pos}: range [{e['dataset_from_index']}, {e['dataset_to_index']}) is not "
                                 f"contiguous from {expect_from} with length {e['length']}")
        expect_from = e["dataset_to_index"]
        data_files.setdefault((e["data/chunk_index"], e["data/file_index"]), []).append(e)
        for key in video_keys:
            video_files.setdefault((key, e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"]), []).append(e)
    check_totals(report, info, len(eps), expect_from, "the episode metadata")
    # data shards: row counts, global index, episode_index
    data_rows = 0
    for (chunk, file), members in sorted(data_files.items()):
        path = root / str(info["data_path"]).format(chunk_index=chunk, file_index=file)
        try:
            t = pq.read_table(path, columns=["index", "episode_index"])
        except (OSError, pa.ArrowException) as exc:
            report.errors.append(f"{path}: unreadable ({exc})")
            continue
        data_rows += t.num_rows
        lo, hi = members[0]["dataset_from_index"], members[-1]["dataset_to_index"]
        idx = t.column("index").to_numpy()
        if t.num_rows != hi - lo or not np.array_equal(idx, np.arange(lo, hi)):
            report.errors.append(f"{path.name} (chunk {chunk}): {t.num_rows} rows, index does not run {lo}..{hi - 1}")
            continue
        epi = t.column("episode_index").to_numpy()
        for e in members:
            part = epi[e["dataset_from_index"] - lo:e["dataset_to_index"] - lo]
            if not np.all(part == e["episode_index"]):
                report.errors.append(f"{path.name}: rows of episode {e['episode_index']} carry other episode_index")
    if data_rows != info.get("total_frames"):
        report.errors.append(f"data shards hold {data_rows} rows, info.json total_frames {info.get('total_frames')}")
    # video shards: timestamps from frame counts, physical frame counts
    for (key, chunk, file), members in sorted(video_files.items()):
        path = root / str(info["video_path"]).format(video_key=key, chunk_index=chunk, file_index=file)
        frames = 0
        for e in members:
            f0, f1 = e[f"videos/{key}/from_timestamp"], e[f"videos/{key}/to_timestamp"]
            if abs(f0 - frames / fps) > 1e-6 or abs(f1 - (frames + e["length"]) / fps) > 1e-6:
                report.errors.append(f"episode {e['episode_index']} {key}: timestamps [{f0}, {f1}] but the shard holds "
                                     f"{frames} frames before it and the episode has {e['length']}")
            frames += e["length"]
        try:
            n = count_frames(path)
        except (VideoError, OSError) as exc:
            report.errors.append(f"{path}: {exc}")
            continue
        if n != frames:
            report.errors.append(f"{path.relative_to(root)}: {n} frames, its episodes need {frames}")
    if len(report.errors) == n_err:
        report.checks.append(f"locators: {len(eps)} episodes contiguous, {len(data_files)} data shard(s) with "
                             f"matching index, {len(video_files)} video shard(s) whose frame counts match the "
                             "from/to timestamps")
    # tasks and stats
    try:
        tt = pq.read_table(root / TASKS_PARQUET)
        if tt.num_rows != info.get("total_tasks") or "task_index" not in tt.column_names:
            report.errors.append(f"{TASKS_PARQUET}: {tt.num_rows} rows / columns {tt.column_names}, "
                                 f"total_tasks {info.get('total_tasks')}")
        else:
            report.checks.append(f"{TASKS_PARQUET}: {tt.num_rows} task(s)")
    except (OSError, pa.ArrowException) as exc:
        report.errors.append(f"{TASKS_PARQUET}: unreadable ({exc})")
    try:
        stats = read_json(root / STATS)
        missing = [k for k in info["features"] if k not in stats]
        if not eps and not stats:
            report.checks.append("stats.json is empty, as an empty subset's must be")
        elif missing:
            report.errors.append(f"stats.json lacks {missing}")
        else:
            report.checks.append("stats.json covers every feature (cameras included)")
    except (OSError, ValueError) as exc:
        report.errors.append(f"stats.json unreadable ({exc})")
    # real read through the locator
    if eps:
        e = eps[0]
        feats = DatasetInfo.from_dict(info)
        state_key, action_key = state_action_keys(feats)
        path = root / str(info["data_path"]).format(chunk_index=e["data/chunk_index"], file_index=e["data/file_index"])
        state = action = frame = None
        try:
            t = pq.read_table(path, columns=[k for k in (state_key, action_key) if k])
            first = data_files[(e["data/chunk_index"], e["data/file_index"])][0]["dataset_from_index"]
            r = e["dataset_from_index"] - first
            state = column_numpy(t, state_key)[r] if state_key else None
            action = column_numpy(t, action_key)[r] if action_key else None
            image_keys = [k for k, f in info["features"].items() if f["dtype"] == "image"]
            if not video_keys and image_keys:
                col = pq.read_table(path, columns=[image_keys[0]]).column(image_keys[0])[r].as_py()
                frame = decode_png(col["bytes"], f"{path.name} row {r}")
            elif video_keys:
                k = video_keys[0]
                vpath = root / str(info["video_path"]).format(video_key=k, chunk_index=e[f"videos/{k}/chunk_index"],
                                                              file_index=e[f"videos/{k}/file_index"])
                frame = decode_frame_at(vpath, round(e[f"videos/{k}/from_timestamp"] * fps), fps)
        except (OSError, pa.ArrowException, VideoError, KeyError, TypeError, ExportError) as exc:
            report.errors.append(f"real read failed: {exc}")
        check_sample(report, state, action, frame, "episode 0 via the locator (pyarrow + PyAV)")
    else:
        check_sample(report, None, None, None, "the episode metadata", empty=True)
    return report
