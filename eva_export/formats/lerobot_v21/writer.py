"""Crash-safe, append-only writer of LeRobot v2.1 datasets.

An episode is streamed into a private staging directory ``<root>/.staging/<id>/`` (one MP4
per camera, encoded frame by frame in a thread per camera). Committing it:

1. writes the Parquet table into staging, then ``journal.json`` (the commit point),
2. renames every file to its templated final path (never over an existing file),
3. appends its rows to episodes_stats.jsonl and tasks.jsonl, then episodes.jsonl (the
   moment the episode becomes visible), then rewrites info.json and stats.json,
4. removes the staging directory.

Every meta file is replaced atomically. Opening the dataset for writing (``open``, or
``recover`` on an existing one: the capture node does it for every configured dataset at
start-up, before it answers any service) replays committed journals and discards uncommitted
staging directories, moves stray files no row names to ``.orphans/``, removes temp files of
interrupted meta writes and an empty ``.staging/``, and makes the meta files agree
(episodes_stats.jsonl keeps only listed episodes; info.json totals and stats.json follow
episodes.jsonl). So a process killed at any moment leaves a dataset whose listed episodes are
complete, and the next index never lands on a partly written one. Meta files take the mode
of the data files (umask), not the 0600 of a temp file.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DatasetError
from ...fsutil import LockHeld, atomic_write_json, atomic_write_jsonl, fsync_dir, read_json, take_lock
from ..common import stats as stats_mod
from ..common.commits import StagingJournal
from ..common.meta import EPISODES, EPISODES_STATS, INFO, STATS, TASKS, read_meta
from ..common.records import (
    CODEBASE_V21,
    DEFAULT_FEATURES,
    REVIEW_VERDICTS,
    DatasetInfo,
    EpisodeRow,
    EpisodeStats,
    Feature,
    TaskRow,
    present_with,
)
from ..common.table import build_table, schema, write_table
from ..common.video import VideoSettings
from .episode_writer import EpisodeWriter, FinishedEpisode
from .promises import Promises

__all__ = ["JOURNAL", "ORPHANS", "STAGING", "WRITER_LOCK", "DatasetWriter", "EpisodeWriter", "FinishedEpisode",
           "check_matches", "lock_dataset", "make_features"]

log = logging.getLogger(__name__)

STAGING = ".staging"
ORPHANS = ".orphans"
WRITER_LOCK = ".writer.lock"  # held (lockf) by the one process that writes this dataset
JOURNAL = "journal.json"


def lock_dataset(root: Path) -> int:
    """Claim ``root`` for this process's writer; refuse if another process writes it.

    Each writer keeps the dataset's rows in memory and rewrites ``episodes.jsonl`` from them,
    so two writing processes (a capture node and ``eva-export review``/``ingest``) would
    overwrite each other's rows. A POSIX record lock belongs to the process, so writers within
    one process (the capture node's live capture and bag ingest share one) do not conflict,
    and the kernel releases it when the process dies: no stale lock after a crash.
    """
    try:
        return take_lock(root / WRITER_LOCK, per_process=True)
    except LockHeld as exc:
        raise DatasetError(f"{root}: another process (pid {exc.holder}) is writing this dataset; review it "
                           f"through that capture node (its ~/review service or the console), or stop it "
                           f"first") from exc


def make_features(extra: dict[str, Feature]) -> dict[str, Feature]:
    """User features first, then LeRobot's five default columns."""
    feats = dict(extra)
    for key, d in DEFAULT_FEATURES.items():
        feats[key] = Feature.from_dict(d)
    return feats


def check_matches(root: Path, info: DatasetInfo, fps: int, features: dict[str, Feature]) -> None:
    """Refuse to append to a dataset recorded with another frame rate or other features.

    Every writer opened for appending must pass this, also one first opened only to recover or
    review the dataset (which takes the features from info.json): appending 6-camera frames to a
    3-camera dataset would silently encode only the dataset's 3 cameras."""
    if info.fps != fps:
        raise DatasetError(f"{root}: recorded at {info.fps} fps, config asks {fps}; use a new dataset name")
    want = {k: f.to_dict() for k, f in features.items()}
    have = {k: f.to_dict() for k, f in info.features.items()}
    if want != have:
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        raise DatasetError(f"{root}: features differ from the config ({diff}); use a new dataset name")


class DatasetWriter:
    """The single writer of one v2.1 dataset directory (episodes, meta files, reviews)."""

    def __init__(self, root: Path, info: DatasetInfo, settings: VideoSettings = VideoSettings()) -> None:
        self.root = Path(root)
        self.info = info
        self.settings = settings
        self.lock = threading.RLock()
        meta = read_meta(self.root)
        # held while this writer lives (closed when it is collected, or at process exit)
        weakref.finalize(self, os.close, lock_dataset(self.root))
        self.episodes = meta.episodes
        self.tasks = meta.tasks
        self.episodes_stats = meta.episodes_stats
        try:
            self.promises = Promises(self.root)  # indices STOP promised to takes not yet saved
        except ValueError as exc:
            raise DatasetError(str(exc)) from exc
        self.recovered: list[str] = []  # what the last recover() did (start-up log)

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, root: Path, *, fps: int, features: dict[str, Feature], robot_type: str,
             settings: VideoSettings = VideoSettings()) -> DatasetWriter:
        """Create the dataset, or reopen it for appending after recovering a crash."""
        root = Path(root)
        if (root / INFO).is_file():
            info = DatasetInfo.from_dict(read_json(root / INFO))
            if info.codebase_version != CODEBASE_V21:
                raise DatasetError(f"{root / INFO}: codebase_version {info.codebase_version}, expected v2.1")
            check_matches(root, info, fps, features)
        else:
            info = DatasetInfo(codebase_version=CODEBASE_V21, robot_type=robot_type, fps=fps,
                               features=dict(features))
            (root / "meta").mkdir(parents=True, exist_ok=True)
            for name in (EPISODES, EPISODES_STATS, TASKS):
                if not (root / name).exists():
                    atomic_write_jsonl(root / name, [])
            atomic_write_json(root / INFO, info.to_dict())
        writer = cls(root, info, settings)
        writer.recovered = writer.recover()
        return writer

    def recover(self) -> list[str]:
        """Bring the dataset back to a consistent state after a crash; returns what was done."""
        done: list[str] = []
        with self.lock:
            staging_root = self.root / STAGING
            for d in sorted(staging_root.glob("*")) if staging_root.is_dir() else []:
                if (d / JOURNAL).is_file():
                    log.warning("%s: finishing the commit of an interrupted save (%s)", self.root, d.name)
                    self._apply_journal(d, StagingJournal.from_dict(read_json(d / JOURNAL)))
                    done.append(f"finished the interrupted save {d.name}")
                else:
                    log.warning("%s: discarding an unfinished episode (%s)", self.root, d.name)
                    if lost := self.promises.recover(d):
                        done.append(lost)
                    shutil.rmtree(d, ignore_errors=True)
                    done.append(f"discarded the unfinished episode {d.name}")
            if staging_root.is_dir() and not any(staging_root.iterdir()):
                staging_root.rmdir()
            done += self._park_orphans()
            done += self._remove_temp_files()
            listed = {e.episode_index for e in self.episodes}
            extra = sorted(set(self.episodes_stats) - listed)
            if extra:  # a save killed between the stats row and the episode row
                for i in extra:
                    del self.episodes_stats[i]
                atomic_write_jsonl(self.root / EPISODES_STATS,
                                   [s.to_dict() for _, s in sorted(self.episodes_stats.items())])
                done.append(f"dropped episodes_stats rows of unlisted episodes {extra}")
            self._write_derived_meta()
            self._fix_meta_modes()
        return done

    def _remove_temp_files(self) -> list[str]:
        """Temp files of atomic writes that a kill interrupted (``.<name>.<random>.tmp``)."""
        out = []
        for d in (self.root, self.root / "meta"):
            for p in sorted(d.glob(".*.tmp")) if d.is_dir() else []:
                if p.is_file():
                    p.unlink()
                    out.append(f"removed the temp file {p.relative_to(self.root)}")
        return out

    def _meta_mode(self) -> int:
        """The mode data files get (the process umask applied to 0666)."""
        for e in self.episodes[:1]:
            p = self.root / self.info.data_file(e.episode_index)
            if p.is_file():
                return p.stat().st_mode & 0o777
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask

    def _fix_meta_modes(self) -> None:
        mode = self._meta_mode()
        for name in (INFO, EPISODES, EPISODES_STATS, TASKS, STATS):
            p = self.root / name
            if p.is_file() and (p.stat().st_mode & 0o777) != mode:
                os.chmod(p, mode)

    def _park_orphans(self) -> list[str]:
        out = []
        listed = {self.info.data_file(e.episode_index) for e in self.episodes}
        listed |= {self.info.video_file(k, e.episode_index) for e in self.episodes for k in self.info.video_keys}
        for top in ("data", "videos"):
            base = self.root / top
            if not base.is_dir():
                continue
            for p in sorted(base.rglob("*")):
                if p.is_file() and str(p.relative_to(self.root)) not in listed:
                    dest = self.root / ORPHANS / time.strftime("%Y%m%dT%H%M%S") / p.relative_to(self.root)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    log.warning("%s: moving stray file %s to %s", self.root, p, dest)
                    os.replace(p, dest)
                    out.append(f"moved the stray file {p.relative_to(self.root)} to {dest.relative_to(self.root)}")
        return out

    # ---- episodes --------------------------------------------------------------------------
    @property
    def next_episode_index(self) -> int:
        return max((e.episode_index for e in self.episodes), default=-1) + 1

    def free_index(self) -> int:
        """The index the next take gets: after every listed and every promised one."""
        return max(self.next_episode_index, self.promises.floor())

    def reserve_index(self, ep: EpisodeWriter) -> int:
        """Promise the next free index to ``ep`` (STOP's reply): its commit writes exactly it."""
        with self.lock:
            index = self.free_index()
            self.promises.reserve(ep.staging, index)
            return index

    def give_up(self, ep: EpisodeWriter, reason: str) -> int | None:
        """``ep`` will not be saved: report the index it was promised (returned) as lost and
        discard its staging directory."""
        with self.lock:
            index = self.promises.give_up(ep.staging, reason)
        ep.abort()
        return index

    @property
    def total_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    def check_matches(self, fps: int, features: dict[str, Feature]) -> None:
        """See the module function: raise DatasetError unless this config may append here."""
        check_matches(self.root, self.info, fps, features)

    def begin_episode(self, task: str) -> EpisodeWriter:
        staging = self.root / STAGING / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        staging.parent.mkdir(parents=True, exist_ok=True)
        return EpisodeWriter(staging, self.info, task, self.settings)

    def commit(self, ep: EpisodeWriter, row_extra: dict[str, Any] | None = None) -> EpisodeRow | None:
        """Make a finished episode durable and visible. A zero-row episode writes nothing."""
        done = ep.finish()
        if done.rows == 0:
            ep.abort()
            return None
        with self.lock:
            if (ep.staging / JOURNAL).is_file():  # a retry after a failure past the commit point
                journal = StagingJournal.from_dict(read_json(ep.staging / JOURNAL))
                self._apply_journal(ep.staging, journal)
                self.promises.done(ep.staging)
                return journal.episode
            promised = self.promises.index_of(ep.staging)
            index = self.free_index() if promised is None else promised
            if any(e.episode_index == index for e in self.episodes):
                raise DatasetError(f"{self.root}: episode {index} is already in the dataset")
            offset = self.total_frames
            cols = ep.columns()
            n = done.rows
            frame_index = np.arange(n, dtype=np.int64)
            cols.update({
                "timestamp": (frame_index / self.info.fps).astype(np.float32),
                "frame_index": frame_index,
                "episode_index": np.full(n, index, dtype=np.int64),
                "index": offset + frame_index,
                "task_index": np.full(n, self._task_index_for(ep.task), dtype=np.int64),
            })
            table = build_table(cols, schema(self.info.features))
            write_table(table, ep.staging / "data.parquet")
            ep_stats = {k: stats_mod.column_stats(cols[k]) for k in self.info.table_keys}
            ep_stats.update(done.image_stats)
            take = {} if promised is None else {"take_id": ep.staging.name}  # the id STOP returned (take.json)
            row = EpisodeRow.from_dict({**(row_extra or {}), "episode_index": index, "tasks": [ep.task], "length": n,
                                        **take})
            moves = [("data.parquet", self.info.data_file(index))]
            moves += [(f"{k}.mp4", self.info.video_file(k, index)) for k in self.info.video_keys]
            journal = StagingJournal(row, EpisodeStats(index, ep_stats), ep.task, tuple(moves))
            for name, _ in moves:
                _fsync_file(ep.staging / name)
            atomic_write_json(ep.staging / JOURNAL, journal.to_dict())  # the commit point
            self._apply_journal(ep.staging, journal)
            self.promises.done(ep.staging)
            return row

    def _task_index_for(self, task: str) -> int:
        for t in self.tasks:
            if t.task == task:
                return t.task_index
        return max((t.task_index for t in self.tasks), default=-1) + 1

    def _apply_journal(self, staging: Path, journal: StagingJournal) -> None:
        row = journal.episode
        if any(e.episode_index == row.episode_index for e in self.episodes):
            shutil.rmtree(staging, ignore_errors=True)  # already fully applied
            return
        for src_name, final_rel in journal.moves:
            src, dst = staging / src_name, self.root / final_rel
            if src.exists():
                if dst.exists():
                    raise DatasetError(f"{dst} already exists; refusing to overwrite it with episode "
                                       f"{row.episode_index} (move it away and reopen)")
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dst)
                fsync_dir(dst.parent)
            elif not dst.exists():
                raise DatasetError(f"journal {staging} lists {src_name} but neither it nor {dst} exists")
        self.episodes_stats[row.episode_index] = journal.stats
        atomic_write_jsonl(self.root / EPISODES_STATS,
                           [s.to_dict() for _, s in sorted(self.episodes_stats.items())])
        task = journal.task
        if task not in {t.task for t in self.tasks}:
            self.tasks.append(TaskRow(self._task_index_for(task), task))
            atomic_write_jsonl(self.root / TASKS, [t.to_dict() for t in self.tasks])
        self.episodes.append(row)
        atomic_write_jsonl(self.root / EPISODES, [e.to_dict() for e in self.episodes])  # visible now
        self._write_derived_meta()
        self._fix_meta_modes()
        shutil.rmtree(staging, ignore_errors=True)

    def _write_derived_meta(self) -> None:
        """info.json totals and stats.json follow from episodes.jsonl and episodes_stats.jsonl."""
        info = self.info
        info.set_totals(len(self.episodes), self.total_frames, len(self.tasks), self.next_episode_index)
        atomic_write_json(self.root / INFO, info.to_dict())
        listed = [self.episodes_stats[e.episode_index].stats for e in self.episodes
                  if e.episode_index in self.episodes_stats]
        atomic_write_json(self.root / STATS, stats_mod.aggregate(listed))

    # ---- review ----------------------------------------------------------------------------
    def review(self, episode_index: int, verdict: str, note: str | None, take_id: str = "") -> EpisodeRow:
        """Set or clear qc_verdict and optionally replace the note; quality fields stay. With a
        ``take_id``, only if the row at ``episode_index`` holds that take."""
        if verdict not in REVIEW_VERDICTS:
            raise DatasetError(f"verdict {verdict!r} must be pass, fail, clear or empty")
        with self.lock:
            row = next((e for e in self.episodes if e.episode_index == episode_index), None)
            if why := self.promises.mismatch(episode_index, row.take_id if row else None, take_id):
                raise DatasetError(f"{self.root}: {why}")
            if row is None:
                why = self.promises.absent_reason(episode_index) or "is not in the dataset"
                raise DatasetError(f"{self.root}: episode {episode_index} {why}")
            row.review(verdict, note, time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            atomic_write_jsonl(self.root / EPISODES, [e.to_dict() for e in self.episodes])
            self._fix_meta_modes()
            return row

    def set_quality(self, rows: Mapping[int, EpisodeRow]) -> None:
        """Store offline verdicts (eva-export check --write, eva_export.quality.store): each
        given row's quality fields replace the stored ones; tasks, length and review stay."""
        with self.lock:
            by_index = {e.episode_index: e for e in self.episodes}
            unknown = sorted(set(rows) - set(by_index))
            if unknown:
                raise DatasetError(f"{self.root}: no episode(s) {unknown}")
            for i, new in rows.items():
                row = by_index[i]
                row.quality, row.quality_issues, row.stream_stats = new.quality, new.quality_issues, new.stream_stats
                row.extra.update({k: v for k, v in new.extra.items() if k == "quality_rules"})
                row.present = present_with(row.present, "quality", "quality_issues", "stream_stats")
            atomic_write_jsonl(self.root / EPISODES, [e.to_dict() for e in self.episodes])
            self._fix_meta_modes()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
