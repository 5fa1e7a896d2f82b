"""Helpers shared by the format modules: reading the staged source, copying common metadata,
the quality marker, and the checks every verifier runs.

Private to ``eva_export.formats``; nothing here knows a particular output layout.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import queue
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..dataset import stats as stats_mod
from ..dataset.meta import EPISODES, EPISODES_STATS, INFO, STATS, TASKS, DatasetMeta, read_meta
from ..dataset.records import CODEBASE_V21, FORMAT_V21, DatasetInfo, EpisodeRow
from ..dataset.video import iter_frames
from ..errors import DatasetError, ExportError
from ..export.records import QUALITY_SPLIT_FILE, QualitySplit
from ..fsutil import atomic_write_json, fsync_dir, read_json
from .base import Progress, VerifyReport

COMMON_META = (EPISODES, TASKS, EPISODES_STATS, STATS)
EMBEDDED_IMAGE_FORMATS = ("hdf5", "mcap")  # images carried inside the episode files, no MP4s
EPISODE_CHUNK_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}"


def load_source(native_subset: Path) -> DatasetMeta:
    """Read a staged native subset, refusing anything that is not a v2.1 split subset."""
    root = Path(native_subset)
    try:
        meta = read_meta(root)
    except DatasetError as exc:
        raise ExportError(f"source {root}: {exc}") from exc
    info = meta.info
    if info.codebase_version != CODEBASE_V21 or info.dataset_format != FORMAT_V21:
        raise ExportError(f"source {root}: codebase_version {info.codebase_version!r} / dataset_format "
                          f"{info.dataset_format!r}; exporters read only LeRobot v2.1 (lerobot_v21) subsets")
    if not (root / QUALITY_SPLIT_FILE).is_file():
        raise ExportError(f"source {root}: {QUALITY_SPLIT_FILE} is missing; export a quality-split subset, "
                          "not a raw directory")
    seen: set[int] = set()
    for ep in meta.episodes:
        if ep.episode_index in seen:
            raise ExportError(f"source {root}: episode {ep.episode_index} is listed twice")
        seen.add(ep.episode_index)
        if ep.length <= 0:
            raise ExportError(f"source {root}: episode {ep.episode_index} is empty (length {ep.length})")
    return meta


def copy_common_meta(src: Path, out: Path) -> None:
    """Copy episodes.jsonl, tasks.jsonl, episodes_stats.jsonl and stats.json when present."""
    for rel in COMMON_META:
        if (src / rel).is_file():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, out / rel)


def write_quality_split(src: Path, out: Path, dataset_format: str) -> QualitySplit:
    """Copy meta/quality_split.json with dataset_format set to this exporter's name."""
    try:
        qs = QualitySplit.read(src)
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"{src / QUALITY_SPLIT_FILE}: unreadable ({exc})") from exc
    qs = dataclasses.replace(qs, dataset_format=dataset_format)
    qs.write(out)
    return qs


def write_info(out: Path, info: dict[str, Any]) -> None:
    atomic_write_json(out / INFO, info)


def dataset_stats(meta: DatasetMeta, extra: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Dataset statistics for every feature, aggregated from the per-episode statistics.

    ``extra`` holds statistics computed during export for episodes whose source lacked them.
    """
    per = []
    for ep in meta.episodes:
        st = dict(meta.episodes_stats[ep.episode_index].stats) if ep.episode_index in meta.episodes_stats else {}
        st.update((extra or {}).get(ep.episode_index, {}))
        per.append(st)
    out = stats_mod.aggregate(per)
    if (meta.root / STATS).is_file():  # keep anything the source knew that we could not recompute
        for key, value in read_json(meta.root / STATS).items():
            out.setdefault(key, value)
    return out


def episode_stats(meta: DatasetMeta, ep: EpisodeRow, table: pa.Table) -> dict[str, Any]:
    """The episode's statistics: from episodes_stats.jsonl, table columns filled in when missing."""
    st = copy.deepcopy(meta.episodes_stats[ep.episode_index].stats) if ep.episode_index in meta.episodes_stats else {}
    for name in table.column_names:
        if name not in st and name in meta.info.features and not meta.info.features[name].is_visual:
            st[name] = stats_mod.column_stats(column_numpy(table, name))
    return st


def missing_image_stats(meta: DatasetMeta, ep: EpisodeRow) -> list[str]:
    """Cameras (video or image-in-Parquet) whose statistics the source did not record."""
    have = meta.episodes_stats.get(ep.episode_index)
    return [k for k in meta.info.visual_keys if have is None or k not in have.stats]


def parquet_image_keys(info: DatasetInfo) -> list[str]:
    """Features stored as images inside the Parquet table (LeRobot's ``use_videos=False``)."""
    return [k for k, f in info.features.items() if f.dtype == "image"]


def decode_png(data: bytes, where: str) -> np.ndarray:
    """One encoded image (PNG, as LeRobot embeds it; any still format FFmpeg knows) as RGB uint8."""
    import av  # PyAV decodes the image; no Pillow needed

    for name in ("png", "mjpeg"):
        if name == "mjpeg" and not data.startswith(b"\xff\xd8"):
            continue
        if name == "png" and not data.startswith(b"\x89PNG"):
            continue
        try:
            cc = av.CodecContext.create(name, "r")
            frames = cc.decode(av.Packet(data))
            if frames:
                return np.asarray(frames[0].to_ndarray(format="rgb24"))
        except av.FFmpegError as exc:
            raise ExportError(f"{where}: undecodable image ({exc})") from exc
    raise ExportError(f"{where}: not a PNG or JPEG image ({len(data)} bytes)")


def iter_table_images(table: pa.Table, key: str, where: str) -> Iterator[np.ndarray]:
    """The frames of an image column (``struct<bytes, path>`` per row), decoded one at a time."""
    col = table.column(key)
    for i in range(table.num_rows):
        value = col[i].as_py()
        data = value.get("bytes") if isinstance(value, dict) else value
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise ExportError(f"{where}: {key} row {i} holds no embedded image bytes")
        yield decode_png(bytes(data), f"{where}: {key} row {i}")


def camera_frames(meta: DatasetMeta, episode_index: int, table: pa.Table, key: str) -> Iterator[np.ndarray]:
    """One camera's frames of one episode, from its MP4 or from its Parquet image column."""
    if meta.info.features[key].dtype == "image":
        return iter_table_images(table, key, f"episode {episode_index}")
    return iter_frames(meta.video_path(key, episode_index))


def image_stats_of(frames: Iterator[np.ndarray]) -> dict[str, Any]:
    st = stats_mod.ImageStats()
    for f in frames:
        st.add(f)
    return st.to_dict()


def read_episode_table(meta: DatasetMeta, ep: EpisodeRow, first_index: int | None = None) -> pa.Table:
    """Read one source episode table and check it against its episode row (rows, indices)."""
    path = meta.data_path(ep.episode_index)
    if not path.is_file():
        raise ExportError(f"episode {ep.episode_index}: {path} is missing")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ExportError(f"episode {ep.episode_index}: cannot read {path} ({exc})") from exc
    if table.num_rows != ep.length:
        raise ExportError(f"episode {ep.episode_index}: {path.name} has {table.num_rows} rows, "
                          f"episodes.jsonl says length {ep.length}")
    for col in ("episode_index", "index"):
        if col not in table.column_names:
            raise ExportError(f"episode {ep.episode_index}: {path.name} lacks the {col!r} column")
    epi = column_numpy(table, "episode_index")
    if not np.all(epi == ep.episode_index):
        raise ExportError(f"episode {ep.episode_index}: {path.name} has episode_index values "
                          f"{sorted(set(epi.tolist()))[:5]}, expected {ep.episode_index} (renumbered subset)")
    if first_index is not None:
        idx = column_numpy(table, "index")
        if not np.array_equal(idx, np.arange(first_index, first_index + table.num_rows)):
            raise ExportError(f"episode {ep.episode_index}: global index column is not contiguous from "
                              f"{first_index} (the subset must be renumbered)")
    return table


def column_numpy(table: pa.Table, name: str) -> np.ndarray:
    from ..dataset.table import to_numpy
    return to_numpy(table.column(name))


def state_action_keys(info: DatasetInfo) -> tuple[str | None, str | None]:
    """The feature names a consumer would call state and action."""
    keys = [k for k, f in info.features.items() if not f.is_visual]
    state = "observation.state" if "observation.state" in keys else next((k for k in keys if "state" in k), None)
    action = "action" if "action" in keys else next((k for k in keys if "action" in k), None)
    return state, action


def embedded_info(info: DatasetInfo, dataset_format: str, extension: str) -> dict[str, Any]:
    """info.json of a format that carries images inside its episode files (HDF5, MCAP)."""
    d = info.to_dict()
    for key, feat in d["features"].items():
        if feat["dtype"] == "video":
            feat["dtype"] = "image"
            feat.pop("info", None)
    d["total_videos"] = 0
    d.pop("video_path", None)
    d["data_path"] = EPISODE_CHUNK_PATH + "." + extension
    d["embedded_images"] = True
    d["dataset_format"] = dataset_format
    return d


def episode_file(info: dict[str, Any], episode_index: int) -> str:
    chunks = int(info.get("chunks_size") or 1000)
    return str(info["data_path"]).format(episode_chunk=episode_index // chunks, episode_index=episode_index)


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def to_plain(value: Any) -> Any:
    """numpy scalars/arrays to Python values, recursively (for MessagePack and JSON)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


# ---- shared verification steps ---------------------------------------------------------------
def start_report(out_dir: Path, dataset_format: str) -> tuple[VerifyReport, dict[str, Any] | None]:
    """Open a report; check info.json and quality_split.json exist and name ``dataset_format``."""
    out_dir = Path(out_dir)
    report = VerifyReport(path=str(out_dir), dataset_format=dataset_format)
    info: dict[str, Any] | None = None
    try:
        info = read_json(out_dir / INFO)
    except (OSError, ValueError) as exc:
        report.errors.append(f"{INFO}: unreadable ({exc})")
    try:
        qs = QualitySplit.read(out_dir)
        if qs.dataset_format != dataset_format:
            report.errors.append(f"{QUALITY_SPLIT_FILE}: dataset_format {qs.dataset_format!r}, "
                                 f"expected {dataset_format!r}")
        else:
            report.checks.append(f"quality_split.json: subset {qs.subset}, dataset_format {qs.dataset_format}, "
                                 f"{len(qs.source_episode_indices)} source episodes")
        if info is not None and qs.episode_count and qs.episode_count != info.get("total_episodes"):
            report.errors.append(f"{QUALITY_SPLIT_FILE}: episode_count {qs.episode_count} but info.json "
                                 f"total_episodes {info.get('total_episodes')}")
    except (OSError, ValueError, KeyError) as exc:
        report.errors.append(f"{QUALITY_SPLIT_FILE}: missing or unreadable ({exc})")
    if info is not None:
        fmt = str(info.get("dataset_format", FORMAT_V21))
        if fmt != dataset_format:
            report.errors.append(f"{INFO}: dataset_format {fmt!r}, expected {dataset_format!r}")
        report.episodes = int(info.get("total_episodes", 0))
        report.frames = int(info.get("total_frames", 0))
        if dataset_format in EMBEDDED_IMAGE_FORMATS and (
                not info.get("embedded_images") or info.get("total_videos") != 0 or "video_path" in info):
            report.errors.append("info.json must have embedded_images true, total_videos 0 and no video_path")
    return report, info


def read_episode_rows(out_dir: Path, report: VerifyReport) -> list[EpisodeRow]:
    from ..fsutil import iter_jsonl
    try:
        return [EpisodeRow.from_dict(d) for d in iter_jsonl(Path(out_dir) / EPISODES)]
    except (OSError, ValueError, KeyError) as exc:
        report.errors.append(f"{EPISODES}: unreadable ({exc})")
        return []


def check_totals(report: VerifyReport, info: dict[str, Any], episodes: int, frames: int, what: str) -> None:
    if info.get("total_episodes") != episodes or info.get("total_frames") != frames:
        report.errors.append(f"info.json claims {info.get('total_episodes')} episodes / {info.get('total_frames')} "
                             f"frames, {what} holds {episodes} / {frames}")
    else:
        report.checks.append(f"info.json totals match {what}: {episodes} episodes, {frames} frames")


def check_sample(report: VerifyReport, state: Any, action: Any, frame: Any, where: str,
                 empty: bool = False) -> None:
    """Record the real read of one state value, one action value and one image frame.

    ``empty``: the subset physically holds no episode (every episode landed on the other side
    of the split). That is a valid output when info.json says 0 episodes and 0 frames; there
    is nothing to read, and check_totals has already compared the claim with the files.
    """
    if empty:
        if report.episodes == 0 and report.frames == 0:
            report.checks.append(f"empty subset: 0 episodes, 0 frames; nothing to read in {where}")
        else:
            report.errors.append(f"real read: no episode to read in {where}, but info.json claims "
                                 f"{report.episodes} episodes / {report.frames} frames")
        return
    parts = []
    errors_before = len(report.errors)
    if state is None:
        report.errors.append(f"real read: no state value in {where}")
    else:
        parts.append(f"state[0]={np.asarray(state).reshape(-1)[:1].tolist()}")
    if action is None:
        report.errors.append(f"real read: no action value in {where}")
    else:
        parts.append(f"action[0]={np.asarray(action).reshape(-1)[:1].tolist()}")
    if frame is None:
        report.errors.append(f"real read: no image frame in {where}")
    else:
        arr = np.asarray(frame)
        if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
            report.errors.append(f"real read: image frame in {where} has shape {arr.shape} {arr.dtype}")
        else:
            parts.append(f"frame {arr.shape[1]}x{arr.shape[0]} rgb mean={float(arr.mean()):.1f}")
    if len(report.errors) == errors_before:
        report.checks.append(f"real read from {where}: " + ", ".join(parts))


class Prefetch:
    """Run a frame iterator in a background thread, at most ``depth`` frames ahead.

    Decoding (PyAV releases the GIL) then overlaps with writing in the caller's thread while
    memory stays bounded to ``depth`` frames. Errors of the iterator are re-raised by
    ``next``; ``close`` stops the thread and drops what it had queued.
    """

    _END = object()

    def __init__(self, it: Iterator[np.ndarray], depth: int = 4, name: str = "prefetch") -> None:
        self._it = it
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._it:
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._error = exc
        finally:
            close = getattr(self._it, "close", None)
            if close is not None:
                close()
            while not self._stop.is_set():
                try:
                    self._q.put(self._END, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def __iter__(self) -> Prefetch:
        return self

    def __next__(self) -> np.ndarray:
        item = self._q.get()
        if item is self._END:
            self._q.put(self._END)  # stay exhausted
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_META_CACHE: dict[tuple[str, int, int], DatasetMeta] = {}


def _unit_meta(src: Path) -> DatasetMeta:
    """The source's metadata in a worker process, read once per subset (not once per episode)."""
    st = (src / EPISODES).stat()
    key = (str(src), st.st_mtime_ns, st.st_size)
    if key not in _META_CACHE:
        _META_CACHE.clear()  # one subset at a time: keep memory flat
        _META_CACHE[key] = load_source(src)
    return _META_CACHE[key]


def episode_file_unit(src: Path, path: Path, episode_index: int, first_index: int,
                      write_episode: Callable[[Path, DatasetMeta, EpisodeRow, pa.Table], None],
                      meta: DatasetMeta | None = None) -> int:
    """One episode file (a unit of export.pool): written as ``.partial``, renamed into place.

    Runs in the exporting process (``meta`` given) or in a worker process (``meta`` None:
    read from ``src``); returns the file's size.
    """
    meta = meta if meta is not None else _unit_meta(src)
    ep = next((e for e in meta.episodes if e.episode_index == episode_index), None)
    if ep is None:
        raise ExportError(f"episode {episode_index}: not in {src / EPISODES}")
    table = read_episode_table(meta, ep, first_index=first_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.unlink(missing_ok=True)
    try:
        write_episode(tmp, meta, ep, table)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def export_episode_files(
    src: Path,
    out: Path,
    progress: Progress,
    dataset_format: str,
    extension: str,
    write_episode: Callable[[Path, DatasetMeta, EpisodeRow, pa.Table], None],
    is_complete: Callable[[Path, DatasetMeta, EpisodeRow], bool],
) -> list[int]:
    """The loop of the one-file-per-episode formats (hdf5, mcap); returns the resumed episodes.

    Each episode is written under a hidden ``.partial`` name and renamed into place once
    closed, so a file that exists is a finished episode: a rerun after a kill checks it with
    ``is_complete`` and keeps it. The episodes left run as export.pool units (worker
    processes when a pool is active: ``write_episode`` must then be picklable, e.g. a bound
    method of the exporter). The common meta files and the marker are written last.
    """
    from ..export import pool

    meta = load_source(src)
    out.mkdir(parents=True, exist_ok=True)
    info = embedded_info(meta.info, dataset_format, extension)
    resumed: list[int] = []
    units: list[pool.Unit] = []
    in_process = pool.active() is None  # serial: hand the metadata over instead of rereading it
    offset = 0
    for ep in meta.episodes:
        first = offset
        offset += ep.length
        path = out / episode_file(info, ep.episode_index)
        if path.is_file() and is_complete(path, meta, ep):
            resumed.append(ep.episode_index)
            progress.on_episode(ep.episode_index, 0)
            continue
        units.append(pool.Unit(f"episode {ep.episode_index}", episode_file_unit,
                               (src, path, ep.episode_index, first, write_episode, meta if in_process else None)))
    pool.run_units(units, lambda u, size: progress.on_episode(u.args[2], size))
    copy_common_meta(src, out)
    atomic_write_json(out / INFO, info)
    write_quality_split(src, out, dataset_format)
    return resumed
