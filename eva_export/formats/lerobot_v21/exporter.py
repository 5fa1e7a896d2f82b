"""Native LeRobot v2.1: the staged subset published as is (hard links, copies across devices).

Whatever the source kind (v2.1, v3.0, v2.0: formats/sources.py), the split has already written the staged
subset as real v2.1: per-episode Parquet and MP4 files (a v3.0 source's cut out of its shared
files), per-episode statistics, episodes.jsonl / tasks.jsonl. So this writer never converts.

Writer: every file of the staged native subset is hard-linked (or copied) into the output;
meta/quality_split.json is rewritten with dataset_format "lerobot_v21" (a new inode, so the
staged original is never modified through a link).

Verifier (the only one of v2.1 exports): info.json totals against the episode tables, and per
episode the Parquet row count against the frames really decoded (or demuxed) from each camera
MP4; the source-level validation of a raw v2.1 dataset (``validate_source``, as an export);
episode_index and the global index columns contiguous; then one state value, one action
value and one decoded frame.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..common.meta import DatasetMeta, read_meta
from ..common.records import FORMAT_V21
from ..common.table import in_memory, read_parquet
from ..common.video import count_frames, decode_count, iter_frames
from ..common.records import QUALITY_SPLIT_FILE, QualitySplit
from ...errors import DatasetError, EvaError, ExportError, VideoError
from ..common.episode_list import rows_at
from ..common.source import SourceCheck
from .validate import TableTap, validate_source
from .options import V21Options
from ..common.exporter import Progress, VerifyReport
from ..common.checks import check_sample, check_totals, start_report
from ..common.images import iter_table_images, parquet_image_keys
from ..common.train_checks import ValueCheck, check_stats
from .subset import column_numpy, link_or_copy, load_source, state_action_keys, write_quality_split


class LeRobotV21Exporter:
    """Publish the native subset unchanged."""

    name = FORMAT_V21

    def __init__(self, options: V21Options = V21Options()) -> None:
        self.decode_frames = options.decode_frames  # verify by decoding (True) or by demuxing packets

    def export(self, native_subset: Path, out_dir: Path, progress: Progress | None = None) -> None:
        progress = progress or Progress()
        src, out = Path(native_subset), Path(out_dir)
        meta = load_source(src)
        out.mkdir(parents=True, exist_ok=True)
        for dirpath, dirnames, names in os.walk(src):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]  # no .staging / .orphans
            rel = Path(dirpath).relative_to(src)
            for name in names:
                if (rel / name).as_posix() == QUALITY_SPLIT_FILE or name.startswith("."):
                    continue
                dst = out / rel / name
                if dst.exists():
                    if os.path.samefile(src / rel / name, dst) or dst.stat().st_size == (src / rel / name).stat().st_size:
                        continue  # resumed run
                    dst.unlink()
                link_or_copy(src / rel / name, dst)
        write_quality_split(src, out, self.name)
        for ep in meta.episodes:
            size = meta.data_path(ep.episode_index).stat().st_size
            size += sum(meta.video_path(k, ep.episode_index).stat().st_size for k in meta.info.video_keys
                        if meta.video_path(k, ep.episode_index).is_file())
            progress.on_episode(ep.episode_index, size)

    def verify(self, out_dir: Path) -> VerifyReport:
        return verify_v21(Path(out_dir), self.decode_frames)


def verify_v21(root: Path, decode_frames: bool = True) -> VerifyReport:
    """Check a v2.1 export against its own metadata; ``decode_frames`` False: demux only."""
    return _Verifier(decode_frames).verify(Path(root))


class _Verifier:
    name = FORMAT_V21

    def __init__(self, decode_frames: bool) -> None:
        self.decode_frames = decode_frames

    def verify(self, out_dir: Path) -> VerifyReport:
        report, info = start_report(Path(out_dir), self.name)
        if info is None:
            return report
        try:
            meta = read_meta(Path(out_dir), digest=True)  # validate_source's stats row checks
        except DatasetError as exc:
            report.errors.append(str(exc))
            return report
        # each table read once: its value columns checked as validation reads its small ones
        values, seen = ValueCheck(Path(out_dir), info), set()

        def on_table(ep: int, path: Path, table: pa.Table) -> None:
            seen.add(ep)
            values.episode(str(path), ep, {k: column_numpy(table, k) for k in values.floats + ["timestamp"]
                                           if k in table.column_names})

        check = _check_structure(Path(out_dir), report, meta, TableTap((*values.floats, "timestamp"), on_table))
        if check is not None and not self.decode_frames:
            # validate_source just read every table's footer and every MP4's index, and
            # refuses a row count other than the episode's length or a camera's frame count
            # other than the rows: the per-episode count below would read them all again.
            frames = sum(rows_at(check.episodes, n) for n in range(len(check.episodes)))
            report.checks.append(f"every episode: Parquet rows == demuxed MP4 frames for "
                                 f"{len(meta.info.video_keys)} camera(s)")
        else:  # decoding proves more; a failed validation: every episode's fault listed
            frames = self._count(meta, report)
        check_totals(report, info, len(meta.episodes), frames, "the episode tables")
        check_stats(report, Path(out_dir), info, empty=not meta.episodes)
        self._values(meta, report, values, seen)
        self._sample(meta, report)
        return report

    def _values(self, meta: DatasetMeta, report: VerifyReport, values: ValueCheck, seen: set[int]) -> None:
        """Every episode's float features and timestamps, as a trainer reads them (those
        validation did not read: ``seen`` were checked as it read them)."""
        for ep in meta.episodes:
            if ep.episode_index in seen:
                continue
            path = meta.data_path(ep.episode_index)
            try:
                # read whole and parsed in memory, without the thread pools (dataset.table.in_memory)
                with pa.OSFile(str(path)) as fh, pq.ParquetFile(in_memory(fh)) as pf:
                    cols = [k for k in (*values.floats, "timestamp") if k in pf.schema_arrow.names]
                    table = pf.read(columns=cols, use_threads=False)
            except (OSError, pa.ArrowException) as exc:
                report.errors.append(f"episode {ep.episode_index}: {path} unreadable ({exc})")
                continue
            values.episode(str(path), ep.episode_index, {k: column_numpy(table, k) for k in cols})
        values.finish(report)

    def _count(self, meta: DatasetMeta, report: VerifyReport) -> int:
        """Each episode's Parquet rows against its length and its cameras' frames (decoded or
        demuxed), every mismatch reported; returns the rows counted."""
        frames = 0
        bad = 0
        for ep in meta.episodes:
            path = meta.data_path(ep.episode_index)
            try:
                rows = pq.read_metadata(path).num_rows
            except OSError as exc:
                report.errors.append(f"episode {ep.episode_index}: {path} unreadable ({exc})")
                bad += 1
                continue
            frames += rows
            if rows != ep.length:
                report.errors.append(f"episode {ep.episode_index}: {rows} Parquet rows, length {ep.length}")
                bad += 1
            for key in meta.info.video_keys:
                vpath = meta.video_path(key, ep.episode_index)
                try:
                    n = decode_count(vpath) if self.decode_frames else count_frames(vpath)
                except (VideoError, OSError) as exc:
                    report.errors.append(f"episode {ep.episode_index} {key}: {exc}")
                    bad += 1
                    continue
                if n != rows:
                    report.errors.append(f"episode {ep.episode_index} {key}: {n} video frames, {rows} Parquet rows")
                    bad += 1
        if not bad:
            how = "decoded" if self.decode_frames else "demuxed"
            report.checks.append(f"every episode: Parquet rows == {how} MP4 frames for {len(meta.info.video_keys)} "
                                 "camera(s)")
        return frames

    def _sample(self, meta: DatasetMeta, report: VerifyReport) -> None:
        if not meta.episodes:
            check_sample(report, None, None, None, "the episode tables", empty=True)
            return
        ep = meta.episodes[0].episode_index
        state_key, action_key = state_action_keys(meta.info)
        table = read_parquet(meta.data_path(ep))  # not read_table: its dataset layer costs ms per file
        state = column_numpy(table, state_key)[0] if state_key in table.column_names and state_key else None
        action = (column_numpy(table, action_key)[0]
                  if action_key in table.column_names and action_key else None)
        frame = None
        image_keys = parquet_image_keys(meta.info)
        if not meta.info.video_keys and image_keys:
            try:
                frame = next(iter_table_images(table, image_keys[0], f"episode {ep}"), None)
            except ExportError as exc:
                report.errors.append(str(exc))
        elif meta.info.video_keys:
            try:
                frame = next(iter_frames(meta.video_path(meta.info.video_keys[0], ep)), None)
            except VideoError as exc:
                report.errors.append(str(exc))
        check_sample(report, state, action, frame, f"episode {ep} (pyarrow + PyAV)")



def _check_structure(root: Path, report: VerifyReport, meta: DatasetMeta,
                     tap: TableTap | None = None) -> SourceCheck | None:
    """What a raw v2.1 dataset must satisfy (validate_source, as an export, not a source), the
    marker's episode count, and episode_index / global index columns contiguous per episode
    (validate_source reads and checks both columns of every table against the running offset).

    Every staged table is read again: the split rewrote it (renumbered columns), and this check
    is what proves the rewrite. A camera file the split hard-linked is the source's inode, so
    its (device, inode, size, mtime_ns) key is the one source validation demuxed under;
    check_video takes that demux's facts while the key still matches (video_facts), since
    unchanged bytes give the same frames and timing, and demuxes a file whose key moved."""
    try:
        check = validate_source(root, as_source=False, meta=meta, tap=tap)
        marker = QualitySplit.read(root)
    except (EvaError, OSError, ValueError, TypeError) as exc:
        report.errors.append(str(exc))
        return None
    if len(marker.source_episode_indices) != len(check.episodes):
        report.errors.append(f"{QUALITY_SPLIT_FILE}: {len(marker.source_episode_indices)} source_episode_indices "
                             f"for {len(check.episodes)} episodes")
        return None
    report.checks.append(f"{len(check.episodes)} episodes valid as a v2.1 dataset: episode_index and "
                         "index columns contiguous")
    return check
