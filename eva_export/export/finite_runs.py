"""The default for NaN/inf in an operator-passed accepted episode: export its finite runs.

A frame is finite when every float feature (not cameras) holds only finite values there. Each
maximal run of finite frames at least ``min_frames`` long becomes a full episode of its own:
its rows exactly as recorded (only episode_index, index and frame_index renumbered, timestamps
shifted so the run starts at 0), its cameras cut to the same frames (stream copy when a
keyframe starts the run, else re-encoded and said so). Its row names the source episode and the
frame range (``finite_run``). Nothing is filled in or interpolated; shorter runs and the
non-finite frames are left out and counted in quality_split.json (``nonfinite_runs``) and the
card. The subset is rewritten into a new directory beside the split's (whose units a rerun
reuses); episodes without NaN/inf are hard-linked, renumbered where needed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ExportError
from ..formats.common import stats as stats_mod
from ..formats.common.cut import cut_episode
from ..formats.common.images import iter_table_images
from ..formats.common.meta import EPISODES, EPISODES_STATS, INFO, STATS, TASKS, DatasetMeta, read_meta
from ..formats.common.nonfinite import RUNS_KEY, NonFiniteEpisode, float_keys
from ..formats.common.records import DatasetInfo, EpisodeRow, QualitySplit
from ..formats.common.table import to_numpy
from ..formats.common.video import iter_frames
from ..formats.lerobot_v21.episode_stats import image_stats_of
from ..fsutil import dumps_json, jsonl_dumps
from .assemble import JsonlStream, StatsSum
from .merge import ORIGINS_KEY
from .units import REENCODED_FIELD, write_text

#: episode row field of a run: the source episode and its frame range [from, to).
RUN_FIELD = "finite_run"
#: runs shorter than this many frames are dropped (and counted) unless configured otherwise.
MIN_RUN_FRAMES = 10


@dataclass(frozen=True)
class CutEpisode:
    """One source episode exported as its finite runs (quality_split.json ``nonfinite_runs``)."""

    source_episode_index: int
    source_file: str
    features: tuple[tuple[str, int], ...]  # (feature, NaN/inf values) as scanned
    frames: int  # the episode's frames
    runs: tuple[tuple[int, int], ...]  # kept [from, to) frame ranges, each now an episode
    dropped_runs: int  # finite runs shorter than the minimum
    dropped_frames: int  # frames left out: non-finite ones and those of dropped runs
    min_frames: int  # the minimum run length of this export

    def to_dict(self) -> dict[str, Any]:
        return {"source_episode_index": self.source_episode_index, "source_file": self.source_file,
                "features": dict(self.features), "frames": self.frames, "runs": [list(r) for r in self.runs],
                "dropped_runs": self.dropped_runs, "dropped_frames": self.dropped_frames,
                "min_frames": self.min_frames}


@dataclass(frozen=True)
class RunsResult:
    """The rewritten subset: where it is, its totals, and each source episode that was cut."""

    dir: Path
    episodes: int
    frames: int
    cut: tuple[CutEpisode, ...]


def finite_runs(mask: np.ndarray[Any, Any], min_frames: int) -> tuple[list[tuple[int, int]], int]:
    """The maximal runs of True in ``mask`` at least ``min_frames`` long, and how many were shorter."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    runs = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    kept = [r for r in runs if r[1] - r[0] >= max(1, min_frames)]
    return kept, len(runs) - len(kept)


def finite_mask(table: pa.Table, keys: list[str]) -> np.ndarray[Any, Any]:
    """Per row: every value of every float feature in ``keys`` is finite."""
    ok = np.ones(table.num_rows, dtype=bool)
    for k in keys:
        if k not in table.column_names:
            continue
        v = to_numpy(table.column(k))
        if v.dtype.kind != "f":
            v = np.asarray(v.tolist(), dtype=np.float64)
        ok &= np.isfinite(v).reshape(len(v), -1).all(axis=1)
    return ok


def _set(table: pa.Table, name: str, values: np.ndarray[Any, Any]) -> pa.Table:
    if name not in table.column_names:
        return table
    i = table.schema.get_field_index(name)
    typ = table.schema.field(i).type
    return table.set_column(i, table.schema.field(i), pa.array(values.astype(typ.to_pandas_dtype()), type=typ))


def _table_stats(table: pa.Table, info: DatasetInfo, run: bool) -> dict[str, Any]:
    """A run's statistics of every table column (cameras carried in it from their frames); an
    episode kept whole only needs its renumbered index columns' again."""
    keys = [k for k in info.table_keys if k in table.column_names]
    if not run:
        keys = [k for k in ("episode_index", "index") if k in keys]
    out: dict[str, Any] = {}
    for k in keys:
        if not info.features[k].is_visual:
            out[k] = stats_mod.column_stats(to_numpy(table.column(k)))
            continue
        out[k] = image_stats_of(iter_table_images(table, k, k))
    return out


class _Writer:
    """Writes the new subset one episode at a time (rows, stats and totals streamed)."""

    def __init__(self, meta: DatasetMeta, out: Path) -> None:
        self.meta, self.out = meta, out
        (out / "meta").mkdir(parents=True)
        self.rows, self.ep_stats = JsonlStream(out / EPISODES), JsonlStream(out / EPISODES_STATS)
        self.total = StatsSum()
        self.episodes = self.frames = 0
        self.sources: list[int] = []
        self.old: list[int] = []  # each new episode's position in the split's subset

    def add(self, table: pa.Table, row: dict[str, Any], stats: dict[str, Any], raw_index: int,
            videos: dict[str, Path], run: tuple[int, int] | None) -> None:
        """One episode: ``table`` its rows, ``videos`` each camera's file (linked, or cut to ``run``)."""
        info, new, n = self.meta.info, self.episodes, table.num_rows
        table = _set(table, "episode_index", np.full(n, new, dtype=np.int64))
        table = _set(table, "index", np.arange(self.frames, self.frames + n, dtype=np.int64))
        if run is not None:
            table = _set(table, "frame_index", np.arange(n, dtype=np.int64))
            if "timestamp" in table.column_names:  # the run starts at 0, spacing exactly as recorded
                ts = to_numpy(table.column("timestamp")).astype(np.float64)
                table = _set(table, "timestamp", ts - ts[0])
        data = self.out / info.data_file(new)
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, data)
        st = {**stats, **_table_stats(table, info, run is not None)}
        reencoded = []
        for key, src in videos.items():
            dst = self.out / info.video_file(key, new)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if run is None:
                os.link(src, dst)
                continue
            what = f"source episode {raw_index} frames {run[0]}..{run[1] - 1}, camera {key}"
            if cut_episode(src, run[0], n, info.fps, dst, what).reencoded:
                reencoded.append(key)
            st[key] = image_stats_of(iter_frames(dst))
        self.old.append(int(row["episode_index"]))
        row = {**row, "episode_index": new, "length": n}
        if run is not None:
            row[RUN_FIELD] = {"source_episode_index": raw_index, "from_frame": run[0], "to_frame": run[1]}
        if reencoded:
            row[REENCODED_FIELD] = sorted(set(row.get(REENCODED_FIELD, [])) | set(reencoded))
        self.rows.write(row)
        self.ep_stats.write({"episode_index": new, "stats": st})
        self.total.add(st)
        self.sources.append(raw_index)
        self.episodes += 1
        self.frames += n

    def finish(self, cut: list[CutEpisode]) -> RunsResult:
        self.rows.commit()
        self.ep_stats.commit()
        src, out = self.meta.root, self.out
        info = self.meta.info
        info.set_totals(self.episodes, self.frames, len(self.meta.tasks))
        write_text(out / TASKS, jsonl_dumps(t.to_dict() for t in self.meta.tasks))
        write_text(out / STATS, dumps_json(self.total.result()))
        write_text(out / INFO, dumps_json(info.to_dict()))
        marker = QualitySplit.read(src)
        extra = {**marker.extra, RUNS_KEY: [c.to_dict() for c in cut]}
        origins = marker.extra.get(ORIGINS_KEY)  # a named export: each episode's source dataset
        if isinstance(origins, list) and len(origins) == len(self.meta.episodes):
            extra[ORIGINS_KEY] = [origins[i] for i in self.old]
        dataclasses.replace(marker, source_episode_indices=self.sources, episode_count=self.episodes,
                            frame_count=self.frames, extra=extra).write(out)
        return RunsResult(out, self.episodes, self.frames, tuple(cut))

    def discard(self) -> None:
        self.rows.discard()
        self.ep_stats.discard()


def _stats_of(meta: DatasetMeta, ep: EpisodeRow) -> dict[str, Any]:
    row = meta.episodes_stats.get(ep.episode_index)
    return dict(row.stats) if row is not None else {}


def write_runs(src: Path, out: Path, found: list[NonFiniteEpisode], min_frames: int = MIN_RUN_FRAMES) -> RunsResult:
    """The native subset at ``src`` rewritten into ``out`` (replaced), each episode of ``found``
    as its finite runs."""
    if out.exists():
        shutil.rmtree(out)
    meta = read_meta(src)
    keys = float_keys(meta.info)
    flagged = {e.episode_index: e for e in found}
    w = _Writer(meta, out)
    cut: list[CutEpisode] = []
    try:
        for ep in meta.episodes:
            i = ep.episode_index
            recorded = ep.extra.get("source_episode_index")
            raw = int(recorded) if isinstance(recorded, int) else i
            videos = {k: meta.video_path(k, i) for k in meta.info.video_keys}
            try:
                table = pq.read_table(meta.data_path(i))
            except (OSError, pa.ArrowException) as exc:
                raise ExportError(f"{meta.data_path(i)}: source episode {raw}: unreadable ({exc})") from exc
            if i not in flagged:
                w.add(table, ep.to_dict(), _stats_of(meta, ep), raw, videos, None)
                continue
            runs, short = finite_runs(finite_mask(table, keys), min_frames)
            for a, b in runs:
                w.add(table.slice(a, b - a), ep.to_dict(), {}, raw, videos, (a, b))
            e = flagged[i]
            cut.append(CutEpisode(e.source_episode_index, e.source_file, e.features, table.num_rows,
                                  tuple(runs), short, table.num_rows - sum(b - a for a, b in runs), min_frames))
        return w.finish(cut)
    except BaseException:
        w.discard()
        raise
