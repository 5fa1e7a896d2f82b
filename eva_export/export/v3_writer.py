"""One subset written as LeRobot v3.0 straight from the source, resumable by completed shard.

The shards are the exporter's (formats/lerobot_v3*.py: ``DataShards``, ``VideoShards``,
``Probes``) fed with the episodes the native split would have staged (v3_episodes.py), in the
same order, so every file is what converting the staged subset writes. Each stream (the data
shards, each camera's shards) commits a record when one of its shards is complete
(v3_records.py); a rerun keeps each stream's unbroken run of complete shards, removes the
rest, and continues every stream from the end of its run (numbering after its last shard).
Episodes of complete data shards are not read again: their statistics come from the records.

A shard boundary depends only on the episodes since the shard opened (sizes, codec
parameters, the reorder lead of the episodes probed ahead), so a resumed stream starts its
next shard where the uninterrupted run did.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ExportError
from ..formats.common import stats as stats_mod
from ..formats.common.meta import INFO, STATS
from ..formats.common.nonfinite import float_keys
from ..formats.common.table import to_numpy
from ..formats.lerobot_v3.exporter import MIB, LeRobotV3Exporter, Locators, tasks_table
from ..formats.lerobot_v3.layout import DATA_PATH_V30, TASKS_PARQUET, VIDEO_PATH_V30
from ..formats.lerobot_v3.probe import Probes
from ..formats.lerobot_v3.tables import DataShards, EpisodeStatsColumns
from ..formats.lerobot_v3.video import Locator, VideoShards
from ..formats.lerobot_v21.episode_stats import image_stats_of
from ..formats.lerobot_v21.subset import copy_common_meta, write_quality_split
from ..fsutil import atomic_write_json
from .plan_list import PlanList
from .units import PlannedEpisode
from .v3_episodes import NativeStats, NativeSubset
from .v3_feed import Feed
from .v3_records import DATA, EntryLog, EpisodeEntry, ShardRecord, commit, complete_run, read_entries, records_dir

SourceStats = Callable[[PlannedEpisode], dict[str, Any]]


@dataclass
class _Stream:
    """One stream's complete shards (kept from an earlier run) and the shard it is filling."""

    name: str
    records: list[ShardRecord]
    folder: Path  # its records (v3_records.records_dir)
    loc: Locator | None = None  # the open shard's
    first: int = 0
    count: int = 0  # episodes in the open shard
    log: EntryLog | None = None  # the data stream's entries of the open shard
    before: list[int] = field(default_factory=list)
    reencoded: list[int] = field(default_factory=list)
    _at: int = -1  # the record holding the episode asked for last (positions only grow)
    _entries: Iterator[EpisodeEntry] = field(default_factory=lambda: iter(()))

    def __post_init__(self) -> None:
        self.first = self.end

    @property
    def end(self) -> int:
        """Episodes [0, end) are in complete shards of an earlier run."""
        return self.records[-1].end if self.records else 0

    def recorded(self, i: int) -> tuple[ShardRecord, int]:
        """The record of episode ``i`` (asked once each, in order) and its place in the shard."""
        while self._at < 0 or self.records[self._at].end <= i:
            self._at += 1
            rec = self.records[self._at]
            if self.name == DATA:  # its entries, read as its episodes are asked for
                self._entries = read_entries(self.folder / f"{rec.chunk_index:03d}-{rec.file_index:03d}.json")
        rec = self.records[self._at]
        return rec, i - rec.first

    def entry(self, i: int) -> tuple[EpisodeEntry, ShardRecord]:
        rec, _ = self.recorded(i)
        return next(self._entries), rec


@dataclass
class Converted:
    """A subset's episodes written; its metadata follows (``SubsetWriter.finish``)."""

    episodes: int
    frames: int
    nonfinite: list[tuple[int, tuple[tuple[str, int], ...]]]  # (subset episode, counts) holding NaN/inf
    reused: int  # episodes of data shards an earlier run completed


class SubsetWriter:
    """Writes one subset's v3 shards into ``<staging>/out/<subset>`` from the plan's episodes."""

    def __init__(self, staging: Path, name: str, items: PlanList, native: NativeSubset,
                 exporter: LeRobotV3Exporter, source_stats: SourceStats,
                 on_episode: Callable[[int, int, bool], None], hold: Callable[[str], None]) -> None:
        self.staging, self.name, self.items, self.native = staging, name, items, native
        self.exporter, self.source_stats, self.on_episode, self.hold = exporter, source_stats, on_episode, hold
        self.out = staging / "out" / name
        self.info = native.info
        self.keys = list(self.info.video_keys)
        self.float_keys = float_keys(self.info)
        self.locs, self.ep_stats = Locators(self.keys), EpisodeStatsColumns()
        self.stats = NativeStats(native.dir)
        self.streams: dict[str, _Stream] = {}
        self.reencoded: dict[str, list[int]] = {}
        self._near: dict[int, PlannedEpisode] = {}  # episodes the probes read and the loop has not passed

    # ---- paths and resume -------------------------------------------------------------------
    def shard_path(self, stream: str, chunk: int, file: int) -> Path:
        if stream == DATA:
            return self.out / DATA_PATH_V30.format(chunk_index=chunk, file_index=file)
        return self.out / VIDEO_PATH_V30.format(video_key=stream, chunk_index=chunk, file_index=file)

    def _resume(self) -> None:
        """Each stream's complete shards; every other file under out/ removed (a killed run's)."""
        for stream in (DATA, *self.keys):
            recs = complete_run(self.staging, self.name, stream,
                                lambda r, s=stream: self.shard_path(s, r.chunk_index, r.file_index))
            self.streams[stream] = _Stream(stream, recs, records_dir(self.staging, self.name, stream))
            for r in recs:
                self.reencoded.setdefault(stream, []).extend(r.reencoded)
        kept = {self.shard_path(s.name, r.chunk_index, r.file_index) for s in self.streams.values() for r in s.records}
        if self.out.is_dir():
            for entry in self.out.iterdir():
                if entry.name not in ("data", "videos"):
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            for dirpath, _dirs, names in os.walk(self.out):
                for n in names:
                    if Path(dirpath, n) not in kept:
                        os.unlink(os.path.join(dirpath, n))
        self.out.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _continue(numbering: Any, stream: _Stream) -> None:
        if stream.records:  # the next shard is numbered after the last complete one
            numbering.chunk, numbering.file = stream.records[-1].chunk_index, stream.records[-1].file_index

    # ---- the episodes -----------------------------------------------------------------------
    def convert(self) -> Converted:
        self._resume()
        ex, n = self.exporter, len(self.items)
        data = DataShards(self.out, int(ex.data_mb * MIB), ex.chunks_size)
        self._continue(data.numbering, self.streams[DATA])
        tmp = self.out / ".v3tmp"
        videos, probes = {}, {}
        for k in self.keys:
            videos[k] = VideoShards(self.out, k, self.info.fps, self.info.features[k].shape, int(ex.video_mb * MIB),
                                    ex.chunks_size, ex.reencode_settings, tmp, 0, self.native.names)
            self._continue(videos[k].numbering, self.streams[k])
            probes[k] = Probes(self.info.fps)
            start = self.streams[k].end
            first = window_start(start, n, probes[k].window)
            probes[k].stream((i, self._item(i).source.camera_span(k).path) for i in range(first, n))
            for _ in range(first, start):  # passed: the window now holds what it held uninterrupted
                probes[k].next()
        nonfinite: list[tuple[int, tuple[tuple[str, int], ...]]] = []
        frames = reused = 0
        feed = Feed(self.items, self.streams[DATA].end, self.info, self.float_keys, self.source_stats)
        try:
            for i in range(n):
                entry, table = self._data(data, feed, i, frames)
                was_reused = table is None
                for k in self.keys:
                    self._video(videos[k], probes[k], k, i)
                self._episode_stats(i, entry, table)
                del table
                if entry.nonfinite:
                    nonfinite.append((i, entry.nonfinite))
                frames += self.native.rows[i].length
                reused += was_reused
                self.on_episode(1 + len(self.keys), self._item(i).source.bytes, was_reused)
                del self._near[i]
            data.close()
            self._commit(self.streams[DATA])
            self._close_log()
            for k in self.keys:
                videos[k].close()
                self._commit(self.streams[k])
        except BaseException:
            self._abandon(data, videos)
            raise
        finally:
            feed.close()
            shutil.rmtree(tmp, ignore_errors=True)
        return Converted(n, frames, nonfinite, reused)

    def _item(self, i: int) -> PlannedEpisode:
        """Planned episode ``i``, rebuilt once for every camera's probe and the loop (held from
        the first probe a window ahead until the loop passes it: memory is the window)."""
        p = self._near.get(i)
        if p is None:
            p = self._near[i] = self.items[i]
        return p

    def _close_log(self) -> None:
        log = self.streams[DATA].log
        if log is not None:
            log.close()

    def _abandon(self, data: DataShards, videos: dict[str, VideoShards]) -> None:
        self.stats.discard()
        self._close_log()
        for closer in (data.close, *(v.close for v in videos.values())):
            try:
                closer()
            except Exception:  # noqa: BLE001 - the export is failing anyway; its shard is not recorded
                pass

    def _data(self, data: DataShards, feed: Feed, i: int, offset: int) -> tuple[EpisodeEntry, pa.Table | None]:
        """Episode ``i``'s rows into the data shards, and its table; or its record's entry and
        None, when its shard is complete."""
        s, row = self.streams[DATA], self.native.rows[i]
        table: pa.Table | None = None
        if i < s.end:
            entry, rec = s.entry(i)
            loc = Locator(rec.chunk_index, rec.file_index)
        else:
            self.hold(f"unit:{self.items.source_index(i)}")
            table, entry = feed.get(i)
            loc = data.add(table)
            self._advance(s, loc, i)
            if s.log is None:
                s.log = EntryLog(s.folder)
            s.log.append(entry)
        for name, value in (("episode_index", row.episode_index), ("length", row.length),
                            ("data/chunk_index", loc.chunk_index), ("data/file_index", loc.file_index),
                            ("dataset_from_index", offset), ("dataset_to_index", offset + row.length)):
            self.locs.put(name, value)
        return entry, table

    def _video(self, shards: VideoShards, probes: Probes, key: str, i: int) -> None:
        s, row = self.streams[key], self.native.rows[i]
        if i < s.end:
            rec, at = s.recorded(i)
            loc, before = Locator(rec.chunk_index, rec.file_index), rec.before[at]
        else:
            episode_index, path, probed, lead = probes.next()
            assert episode_index == i, (episode_index, i)
            shards.ahead = lead * shards.tick
            n_reenc = len(shards.reencoded)
            loc, before = shards.add(row.episode_index, path, row.length, probed)
            self._advance(s, loc, i)
            s.before.append(before)
            if len(shards.reencoded) > n_reenc:
                s.reencoded.append(row.episode_index)
                self.reencoded.setdefault(key, []).append(row.episode_index)
        self.locs.put(f"videos/{key}/chunk_index", loc.chunk_index)
        self.locs.put(f"videos/{key}/file_index", loc.file_index)
        self.locs.put(f"videos/{key}/from_timestamp", before / self.info.fps)
        self.locs.put(f"videos/{key}/to_timestamp", (before + row.length) / self.info.fps)

    def _advance(self, s: _Stream, loc: Locator, i: int) -> None:
        """Episode ``i`` went to the shard at ``loc``: the shard before it, if another, is complete."""
        if s.loc is not None and loc != s.loc:
            self._commit(s)
            s.first = i
        s.loc = loc
        s.count += 1

    def _commit(self, s: _Stream) -> None:
        if s.loc is None:
            return
        rec = ShardRecord(s.name, s.loc.chunk_index, s.loc.file_index, s.first, s.count, 0, 0, tuple(s.before),
                          tuple(s.reencoded))
        s.records.append(commit(self.staging, self.name, rec,
                                self.shard_path(s.name, s.loc.chunk_index, s.loc.file_index), s.log))
        s.loc, s.count, s.before, s.reencoded = None, 0, [], []
        self.hold("shard")

    def _episode_stats(self, i: int, entry: EpisodeEntry, table: pa.Table | None) -> None:
        """The episode's v3 statistics (formats.episode_stats.episode_stats of the split's);
        an episode of a complete shard has no table column they lack: its split statistics
        recompute every table column."""
        st = dict(entry.stats)  # the entries of features added below; each entry is only read
        feats = self.info.features
        columns = table.column_names if table is not None else []
        for name in columns:
            if name not in st and name in feats and not feats[name].is_visual and table is not None:
                st[name] = stats_mod.column_stats(to_numpy(table.column(name)))
        for key in self.info.table_keys:
            if key not in st:
                raise ExportError(f"{self.native.names.episode(i)}: no statistics for {key!r}")
        for key in self.info.visual_keys:
            if key not in st:  # a camera without statistics in the source and the split's: its frames
                st[key] = image_stats_of(_frames(self.items[i], key))
        self.ep_stats.add(st)
        self.stats.add(i, entry.stats_json)

    # ---- the subset's metadata --------------------------------------------------------------
    def finish(self, conv: Converted) -> None:
        """The meta files, as the exporter writes them after its episodes (marker and card last)."""
        ex, out, native = self.exporter, self.out, self.native
        self.stats.commit()
        ex.last_reencoded = {k: v for k, v in self.reencoded.items() if v}
        ex._write_episodes(out, native.meta, self.locs, self.ep_stats)
        pq.write_table(tasks_table([(t.task_index, t.task) for t in native.tasks]), out / TASKS_PARQUET)
        copy_common_meta(native.dir, out)
        stats = self.ep_stats.aggregate()
        if any(k not in stats for k in self.ep_stats.cols):  # what the split's stats.json adds (rare)
            for key, value in self.stats.aggregate().items():
                if stats_mod.usable_entry(value):
                    stats.setdefault(key, value)
        missing = [k for k in self.info.features if k not in stats]
        if missing and conv.episodes:
            raise ExportError(f"no statistics for features {missing}")
        atomic_write_json(out / STATS, stats)
        atomic_write_json(out / INFO, ex._info(self.info, conv.episodes, conv.frames, len(native.tasks)))
        reenc = {k: [native.names.index(i) for i in v] for k, v in ex.last_reencoded.items()}
        write_quality_split(native.dir, out, ex.name, {"reencoded_source_episodes": reenc} if reenc else None)


def window_start(resume: int, total: int, window: int) -> int:
    """The episode at which ``Probes.next`` of an uninterrupted run loaded episode ``resume``
    into its window. A camera stream resumed there, its episodes before ``resume`` passed, has
    the window (the episodes probed ahead, whose largest reorder lead sets a new shard's decode
    delay) the uninterrupted run had at every episode from ``resume`` on."""
    held = loaded = start = 0
    for e in range(resume + 1):
        if held <= window // 2:  # Probes.next refills to ``window`` episodes ahead
            take = min(window - held, total - loaded)
            if loaded <= resume < loaded + take:
                start = e
            loaded, held = loaded + take, held + take
        held -= 1
    return start


def _frames(p: PlannedEpisode, key: str) -> Any:
    from ..formats.common.video import iter_frames

    return iter_frames(p.source.camera_span(key).path)
