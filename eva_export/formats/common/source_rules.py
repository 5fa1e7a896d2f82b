"""The rules every LeRobot-layout source's files are held to (v2.0, v2.1 and v3.0 sources):
info.json as stored and its declarations, and one episode's table columns. ``validate.py``
applies them to a v2.1 dataset, ``formats/lerobot_v3/source.py`` to a v3.0 one."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ... import confine
from ...errors import DatasetError
from ...fsutil import read_json
from . import reuse
from .meta import INFO, DatasetMeta
from .records import DatasetInfo, EpisodeRow, Feature
from .table import arrow_type, read_parquet

SMALL_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
#: How far a stored timestamp may be from frame_index / fps (LeRobot's own tolerance).
GRID_TOLERANCE_S = 1e-4


@dataclass(frozen=True)
class CameraSpan:
    """Where an episode's frames of one camera are: a whole file, or ``frames`` frames from
    ``first_frame`` of a file shared with other episodes."""

    path: Path
    first_frame: int = 0
    frames: int | None = None  # None: every frame of the file


@dataclass(frozen=True)
class PlacedVideo:
    bytes: int
    reencoded: bool  # the episode could not be cut exactly by stream copy


@dataclass
class SourceEpisode:
    """One validated source episode and the files that carry it.

    Its methods are what readers (the split, the quality rules, the report) need of an
    episode; these defaults serve an episode that owns its files (one Parquet, one MP4 per
    camera: v2.1, v2.0). A source whose episodes live elsewhere (v3.0's shared files, a
    plugin's own file type) overrides them in its episode class: readers never ask the kind.
    """

    row: EpisodeRow
    data_path: Path
    video_paths: dict[str, Path]
    rows: int
    task_indices: list[int]  # distinct task_index values of its table (or of its row's tasks)
    columns: list[str]
    bytes: int
    schema: pa.Schema | None = None

    @property
    def index(self) -> int:
        return self.row.episode_index

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        """The episode's rows (only ``columns`` when given); DatasetError names the file. The
        whole table is validation's read when it kept it and the file is unchanged (reuse.py)."""
        if columns is None and (kept := reuse.take_table(self.data_path)) is not None:
            return kept
        try:
            return read_parquet(self.data_path, columns)
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"episode {self.index}: cannot read {self.data_path}: {exc}") from exc

    def check_rows(self, table: pa.Table) -> None:
        """Refuse rows read from a shared file that are not this episode's (own file: nothing to do)."""

    def camera_span(self, key: str) -> CameraSpan:
        """Where the frames of camera ``key`` are."""
        return CameraSpan(self.video_paths[key])

    def place_video(self, key: str, dst: Path, fps: int) -> PlacedVideo:
        """Put camera ``key``'s file at ``dst``: a hard link (or a copy, never a re-encode)."""
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        src = self.video_paths[key]
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)  # another file system or no hard links
        return PlacedVideo(src.stat().st_size, False)

    def staged_video_ok(self, key: str, staged: Path, recorded: int | None) -> bool:
        """Whether ``staged`` (placed by an earlier run, ``recorded`` bytes) can be reused: the
        size of this episode's own file."""
        return staged.is_file() and staged.stat().st_size == self.video_paths[key].stat().st_size


def cut(values: list[int], n: int = 10) -> str:
    """A list for an error message: its first ``n`` values, then an ellipsis."""
    return str(values) if len(values) <= n else f"{values[:n]}..."


def raw_info(root: Path) -> dict[str, object]:
    """info.json as stored: typed parsing would turn fps 29.97 into 29 silently."""
    try:
        raw = read_json(confine.confined(root, INFO, "meta file"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{root / INFO}: unreadable ({exc})") from exc
    if not isinstance(raw, dict):
        raise DatasetError(f"{root / INFO}: expected a JSON object")
    return raw


def _positive_int(raw: dict[str, object], key: str, where: Path, why: str) -> None:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DatasetError(f"{where}: {key} is {value!r}; it must be a positive integer ({why})")


def check_info(root: Path, raw: dict[str, object], info: DatasetInfo) -> None:
    """info.json fields the export relies on: fps, chunks_size, templates, feature declarations."""
    where = root / INFO
    _positive_int(raw, "fps", where, "timestamps are frame_index / fps; a rate like 29.97 or 0 "
                                     "cannot be exported")
    if "chunks_size" in raw:
        _positive_int(raw, "chunks_size", where, "episode chunk = episode_index // chunks_size")
    confine.check_template(info.data_path, "data", str(where))
    if not info.data_path.endswith(".parquet"):
        raise DatasetError(f"{where}: data_path {info.data_path!r} must name .parquet files in a raw v2.1 dataset")
    if info.video_keys:
        confine.check_template(info.video_path, "video", str(where))
    for key, feat in info.features.items():
        if not key or any(s <= 0 for s in feat.shape) or not feat.shape:
            raise DatasetError(f"{where}: feature {key!r} has the shape {list(feat.shape)}")
        if feat.dtype == "video":
            confine.check_key(key, f"{where}: video key")
            if len(feat.shape) != 3:
                raise DatasetError(f"{where}: video feature {key!r} has the shape {list(feat.shape)}, "
                                   f"expected [height, width, channels]")
        elif not feat.is_visual:
            try:
                arrow_type(feat)
            except ValueError as exc:
                raise DatasetError(f"{where}: feature {key!r}: {exc}") from exc


def _type_ok(stored: pa.DataType, feat: Feature) -> bool:
    want = arrow_type(feat)
    if stored.equals(want):
        return True
    # LeRobot may store a shape-[1] feature as a one-element list.
    return feat.shape == (1,) and pa.types.is_fixed_size_list(stored) and stored.list_size == 1 \
        and stored.value_type.equals(want)


def check_columns(root: Path, meta: DatasetMeta, ep: SourceEpisode, offset: int, t: pa.Table) -> None:
    """Stored column types against info.json; timestamps finite and on the fps grid; indices."""
    info = meta.info
    e, data = ep.index, ep.data_path
    for key in info.table_keys:
        feat = info.features[key]
        if feat.is_visual:
            continue
        assert ep.schema is not None  # read with the table
        stored = ep.schema.field(key).type
        if not _type_ok(stored, feat):
            raise DatasetError(f"episode {e}: {data}: column {key!r} is stored as {stored}, but {root / INFO} "
                               f"declares dtype {feat.dtype} shape {list(feat.shape)}")
    wanted = t.column_names
    n = ep.rows
    epi = t.column("episode_index").to_numpy(zero_copy_only=False)
    if not (epi == e).all():
        others = sorted(set(np.unique(epi).tolist()) - {e})
        raise DatasetError(f"episode {e}: {data}: episode_index column holds {cut(others)}, expected {e} "
                           f"(a file of another episode?)")
    idx = t.column("index").to_numpy(zero_copy_only=False)
    if not np.array_equal(idx, np.arange(offset, offset + n)):
        raise DatasetError(f"episode {e}: {data}: index column is not {offset}..{offset + n - 1} "
                           f"(duplicate or missing frame indices)")
    if "frame_index" in wanted:
        fi = t.column("frame_index").to_numpy(zero_copy_only=False)
        if not np.array_equal(fi, np.arange(n)):
            raise DatasetError(f"episode {e}: {data}: frame_index column is not 0..{n - 1}")
    else:
        fi = np.arange(n)
    if "timestamp" in wanted:
        ts = t.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(ts))
        if bad.size:
            raise DatasetError(f"episode {e}: {data}: timestamp is not finite at frame {int(bad[0])} "
                               f"({ts[bad[0]]}); {bad.size} such frames")
        grid = fi / info.fps
        off = np.abs(ts - grid) > (GRID_TOLERANCE_S + np.abs(grid) * 2.5e-7)  # float32 rounding
        if off.any():
            k = int(np.flatnonzero(off)[0])
            raise DatasetError(f"episode {e}: {data}: timestamp {ts[k]:.6f} at frame {k} is off the "
                               f"{info.fps} fps grid (expected {grid[k]:.6f})")
