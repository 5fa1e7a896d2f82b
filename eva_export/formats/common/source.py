"""The export's input: a source dataset of one kind, validated into a ``SourceCheck``.

One module per source kind (lerobot_v21, lerobot_v30, lerobot_v20; registered in
registry.py), each recognising its datasets on disk (the LeRobot kinds by the
``codebase_version`` of meta/info.json). Every kind validates into the same ``SourceCheck``
(formats/lerobot_v21/validate.py) whose ``meta`` describes the source as a v2.1 dataset: the quality split
then writes real v2.1 subsets from it, and every format, staging, verify, the manifests and
publication work on those subsets unchanged.

Episodes of a v2.1 or v2.0 source own their files (one Parquet, one MP4 per camera). An episode
of a v3.0 source is a ``SlicedEpisode``: rows and frames inside files shared with other
episodes: it overrides the episode methods (``read_table``, ``place_video``...) that readers
call whatever the kind; they run in export worker processes too (the episode is pickled).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ... import confine
from ...errors import DatasetError
from ...fsutil import read_json
from .episode_list import EpisodeList
from .meta import INFO, DatasetMeta
from .source_rules import CameraSpan as CameraSpan  # re-exported: readers of episodes
from .source_rules import PlacedVideo as PlacedVideo
from .source_rules import SourceEpisode


@dataclass
class SourceCheck:
    """What validation learned about a source: enough to plan the split without rereading."""

    root: Path
    meta: DatasetMeta
    source_hash: str
    # validate_source's: an EpisodeList (compact arrays); other kinds may keep a list
    episodes: Sequence[SourceEpisode] = field(default_factory=list)

    @property
    def files_total(self) -> int:
        if isinstance(self.episodes, EpisodeList):
            return self.episodes.files_total()
        return sum(1 + len(e.video_paths) for e in self.episodes)

    @property
    def bytes_total(self) -> int:
        if isinstance(self.episodes, EpisodeList):
            return self.episodes.bytes_total()
        return sum(e.bytes for e in self.episodes)



class SourceKind(StrEnum):
    LEROBOT_V21 = "lerobot_v21"  # ours or any writer's; the only kind we write quality into
    LEROBOT_V30 = "lerobot_v30"  # LeRobot 0.4.x-0.6.x: shared files located by episode metadata
    LEROBOT_V20 = "lerobot_v20"  # older LeRobot: meta/stats.json, no per-episode statistics


def codebase_version(root: Path) -> str | None:
    """meta/info.json's codebase_version (None when there is no info.json): what the LeRobot
    kinds recognise a directory by. An unreadable info.json is refused naming it."""
    path = Path(root) / INFO
    if not path.is_file():
        return None
    try:
        raw = read_json(confine.confined(Path(root), INFO, "meta file"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc})") from exc
    version = raw.get("codebase_version", "") if isinstance(raw, dict) else ""
    return str(version)


class Source(Protocol):
    """One source kind: recognition and validation of a dataset directory into a plan-ready
    SourceCheck (registered in registry.py)."""

    kind: str
    owned: bool  # quality and verdicts live in the dataset's own rows (else: the sidecar)

    @staticmethod
    def recognises(root: Path) -> bool:
        """Whether ``root`` is a dataset of this kind, from what is on disk (cheap: metadata only)."""
        ...

    def validate(self, root: Path, *, allow_empty_dataset: bool = True) -> SourceCheck:
        """Check everything the export needs; raise DatasetError naming file and episode."""
        ...

    def episode_indices(self, root: Path) -> list[int]:
        """The source's episode indices, from its metadata only (what a review may name)."""
        ...

    def locate(self, root: Path) -> Iterator[SourceEpisode]:
        """Every episode's files and rows, in order, from the metadata alone: none of the
        validation rules (``eva-export check`` names the damage validation would refuse).
        ``columns``, ``task_indices`` and ``bytes`` are left empty."""
        ...


def locate_per_episode_files(root: Path) -> Iterator[SourceEpisode]:
    """The episodes of a v2.1 / v2.0 layout (one Parquet, one MP4 per camera each), from
    meta/episodes.jsonl and info.json's path templates (confined to ``root``)."""
    from .meta import read_meta

    meta = read_meta(Path(root))
    for row in meta.episodes:
        i = row.episode_index
        yield SourceEpisode(row=row, data_path=meta.data_path(i),
                            video_paths={k: meta.video_path(k, i) for k in meta.info.video_keys},
                            rows=row.length, task_indices=[], columns=[], bytes=0)


# ---- reading one episode (the split's seam) ----------------------------------------------------
#: Rows per record batch when slicing an episode out of a shared Parquet file.
BATCH_ROWS = 4096


@dataclass(frozen=True)
class VideoSlice:
    """An episode's frames inside a camera file shared with other episodes."""

    path: Path
    first_frame: int  # frame number of the episode's frame 0 in the file
    frames: int


@dataclass
class SlicedEpisode(SourceEpisode):
    """A v3.0 episode: rows ``row_start .. row_start + rows`` of ``data_path``, and per camera
    a frame range of a shared MP4 (``video_paths`` name the shared files)."""

    row_start: int = 0
    video_slices: dict[str, VideoSlice] = field(default_factory=dict)

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        """Its rows of the shared file (only the row groups that hold them)."""
        try:
            with pq.ParquetFile(self.data_path) as pf:  # not read_table: its dataset layer costs ms per small file
                table = _read_rows(pf, self.row_start, self.rows)
                table = table.replace_schema_metadata(v21_schema_metadata(table.schema.metadata))
            return table if columns is None else table.select(columns)
        except (OSError, KeyError, pa.ArrowException) as exc:  # KeyError: a column the file lacks
            raise DatasetError(f"episode {self.index}: cannot read {self.data_path}: {exc}") from exc

    def check_rows(self, table: pa.Table) -> None:
        """The slice must hold exactly this episode's rows (else the metadata mislocates it)."""
        where = f"episode {self.index}: {self.data_path} rows {self.row_start}..{self.row_start + self.rows - 1}"
        if table.num_rows != self.rows:
            raise DatasetError(f"{where}: the file holds only {table.num_rows} of the episode's {self.rows} rows")
        if "episode_index" in table.column_names:
            found = np.unique(np.asarray(table.column("episode_index").to_numpy()))
            if found.tolist() != [self.index]:
                raise DatasetError(f"{where}: episode_index values {found[:5].tolist()}, expected {self.index} "
                                   "(the episode metadata does not locate this episode)")

    def camera_span(self, key: str) -> CameraSpan:
        sl = self.video_slices[key]
        return CameraSpan(sl.path, sl.first_frame, sl.frames)

    def place_video(self, key: str, dst: Path, fps: int) -> PlacedVideo:
        """Cut its frames out of the shared file by stream copy (re-encoded when no exact cut exists)."""
        from .cut import cut_episode

        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        sl = self.video_slices[key]
        cut = cut_episode(sl.path, sl.first_frame, sl.frames, fps, dst, f"episode {self.index} ({key})")
        return PlacedVideo(dst.stat().st_size, cut.reencoded)

    def staged_video_ok(self, key: str, staged: Path, recorded: int | None) -> bool:
        """A cut is reused when it has the size its unit record wrote down."""
        return staged.is_file() and recorded is not None and staged.stat().st_size == recorded


def read_table(ep: SourceEpisode) -> pa.Table:
    """The episode's rows as a table (its own file, its slice of a shared one, or whatever its
    source reads them from)."""
    return ep.read_table()


def _read_rows(pf: pq.ParquetFile, start: int, count: int) -> pa.Table:
    """Rows [start, start + count): only the row groups that hold them are read, in record
    batches, and only the episode's rows are kept (not the shard)."""
    groups: list[int] = []
    first_row = pos = 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if pos + n > start and pos < start + count:
            if not groups:
                first_row = pos
            groups.append(g)
        pos += n
    kept, pos = [], first_row
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups):
        lo, hi = max(start, pos), min(start + count, pos + batch.num_rows)
        if hi > lo:
            kept.append(batch.slice(lo - pos, hi - lo))
        pos += batch.num_rows
    return pa.Table.from_batches(kept, schema=pf.schema_arrow)


def v21_schema_metadata(metadata: dict[bytes, bytes] | None) -> dict[bytes, bytes]:
    """A v3.0 shard's schema metadata as a v2.1 reader's ``datasets`` (3.x) parses it.

    LeRobot 0.4's writer (datasets 4) types vectors ``"_type": "List"``; datasets 3.6, which
    LeRobot 0.3.3 reads v2.1 with, knows only ``Sequence`` and fails to load the episode.
    The fingerprint of the whole shard does not describe one episode: dropped.
    """
    out = dict(metadata or {})
    raw = out.get(b"huggingface")
    if raw is None:
        return out
    try:
        hf = json.loads(raw)
    except ValueError:
        del out[b"huggingface"]  # unreadable: a reader rebuilds it from the Arrow schema
        return out
    if isinstance(hf, dict):
        hf.pop("fingerprint", None)
    out[b"huggingface"] = json.dumps(_sequence_types(hf)).encode()
    return out


def _sequence_types(value: Any) -> Any:
    if isinstance(value, dict):
        d = {k: _sequence_types(v) for k, v in value.items()}
        if d.get("_type") == "List":
            d["_type"] = "Sequence"
        return d
    if isinstance(value, list):
        return [_sequence_types(v) for v in value]
    return value


def place_video(ep: SourceEpisode, key: str, dst: Path, fps: int) -> PlacedVideo:
    """Put the episode's ``key`` camera file at ``dst`` (see ``SourceEpisode.place_video``)."""
    return ep.place_video(key, dst, fps)


def staged_video_ok(ep: SourceEpisode, key: str, staged: Path, recorded: int | None) -> bool:
    """Whether a staged camera file of an earlier run can be reused (``SourceEpisode.staged_video_ok``)."""
    return ep.staged_video_ok(key, staged, recorded)
