"""Verification of an eva_store: manifest vs shards vs sample index vs info.json, then one
real read per shard through ``eva_export.formats.eva_store`` (beside exporter.py, the writer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..common.checks import check_sample, check_totals, read_episode_rows, start_report
from ..common.exporter import VerifyReport
from ..common.train_checks import ValueCheck, check_stats, stat_keys, stats_problems
from .records import KIND_RECORDS, KIND_ZARR, SAMPLE_INDEX_FILE, STORE_FORMAT, IndexRecord, Manifest, ShardSpec


def verify_store(root: Path) -> VerifyReport:
    """Manifest vs shards vs sample index vs info.json; then one real read per shard."""
    report, info = start_report(root, STORE_FORMAT)
    if info is None:
        return report
    try:
        manifest = Manifest.read(root)
    except (OSError, ValueError) as exc:
        report.errors.append(f"manifest.json: unreadable ({exc})")
        return report
    n_err = len(report.errors)
    row = 0
    values = ValueCheck(root, info)
    for spec in manifest.shards:
        if spec.row_start != row:
            report.errors.append(f"manifest.json: {spec.shard_id} row_start {spec.row_start}, expected {row}")
        row += spec.num_rows
        before = len(report.errors)
        _verify_shard(root, spec, report)
        if len(report.errors) == before:
            _check_values(root, spec, values, report)
    episodes = read_episode_rows(root, report)
    lengths = {e.episode_index: e.length for e in episodes}
    shard_len = {s.episode_index: s.num_rows for s in manifest.shards}
    if lengths != shard_len:
        report.errors.append(f"episodes.jsonl lengths {sorted(lengths.items())[:5]}... differ from the shards' rows "
                             f"{sorted(shard_len.items())[:5]}...")
    _check_index(root, manifest, report)
    if len(report.errors) == n_err:
        report.checks.append(f"{len(manifest.shards)} shards: block shapes and dtypes match manifest.json, offsets "
                             f"monotonic and inside their payloads, sample index enumerates all {manifest.total_rows} rows")
    check_totals(report, info, len(manifest.shards), manifest.total_rows, "the shards")
    values.finish(report)
    check_stats(report, root, info, empty=not manifest.shards)
    bad = stats_problems(manifest.stats.get("features"), stat_keys(info)) if manifest.shards else []
    if bad:
        report.errors.append(f"manifest.json stats: would not normalise for a trainer: {'; '.join(bad[:5])}")
    if manifest.stats.get("total_frames") != manifest.total_rows:
        report.errors.append(f"manifest.json stats total_frames {manifest.stats.get('total_frames')}, shards hold "
                             f"{manifest.total_rows}")
    if report.errors:
        return report
    _real_read(root, manifest, report)
    return report


def _check_values(root: Path, spec: ShardSpec, values: ValueCheck, report: VerifyReport) -> None:
    """The shard's numeric columns (its episode's) through the store's own reader: each array's
    shape and dtype against manifest.json, then the values."""
    from .reader import _read_numeric

    try:
        cols = _read_numeric(root / spec.relative_dir, spec)
    except Exception:  # noqa: BLE001 - zarr raises many kinds: the arrays one by one name the bad one
        _name_unreadable(root, spec, report)
        return
    before = len(report.errors)
    for name, block in spec.blocks.items():
        arr = cols.get(name)
        if arr is not None and (tuple(arr.shape) != block.shape or str(arr.dtype) != block.dtype):
            report.errors.append(f"{spec.relative_dir}/{block.paths[0]}: shape {tuple(arr.shape)} {arr.dtype}, "
                                 f"manifest.json says {block.shape} {block.dtype}")
    if len(report.errors) == before:
        values.episode(spec.relative_dir, spec.episode_index, cols)


def _name_unreadable(root: Path, spec: ShardSpec, report: VerifyReport) -> None:
    """Each Zarr array of the shard opened and read alone, the unreadable ones named."""
    import zarr

    before = len(report.errors)
    for block in spec.blocks.values():
        if block.kind == KIND_ZARR:
            rel = f"{spec.relative_dir}/{block.paths[0]}"
            try:
                zarr.open_array(str(root / rel), mode="r")[...]
            except Exception as exc:  # noqa: BLE001 - zarr raises many kinds; name the array
                report.errors.append(f"{rel}: unreadable Zarr array ({type(exc).__name__}: {exc})")
    if len(report.errors) == before:
        report.errors.append(f"{spec.relative_dir}: numeric columns unreadable together")


def _check_index(root: Path, manifest: Manifest, report: VerifyReport) -> None:
    """The sample index enumerates every shard row once, in order, with known splits."""
    try:
        index = IndexRecord.read_table(root / SAMPLE_INDEX_FILE)
        sids = index.column("shard_id").to_pylist()
        rows = index.column("row").to_numpy()
        if index.num_rows != manifest.total_rows:
            report.errors.append(f"{SAMPLE_INDEX_FILE}: {index.num_rows} samples, the shards hold {manifest.total_rows}")
        elif not np.array_equal(index.column("sample_index").to_numpy(), np.arange(index.num_rows)):
            report.errors.append(f"{SAMPLE_INDEX_FILE}: sample_index is not 0..{index.num_rows - 1} in order")
        else:
            expect_sid = [s.shard_id for s in manifest.shards for _ in range(s.num_rows)]
            expect_row = np.concatenate([np.arange(s.num_rows) for s in manifest.shards]) if manifest.shards else rows
            if sids != expect_sid or not np.array_equal(rows, expect_row):
                report.errors.append(f"{SAMPLE_INDEX_FILE}: (shard_id, row) do not enumerate the shards' rows")
        bad_split = set(index.column("split").to_pylist()) - {"all", "train", "val"}
        if bad_split:
            report.errors.append(f"{SAMPLE_INDEX_FILE}: unknown split values {sorted(bad_split)}")
    except Exception as exc:  # noqa: BLE001 - name the file whatever pyarrow raised
        report.errors.append(f"{SAMPLE_INDEX_FILE}: unreadable ({exc})")


def _real_read(root: Path, manifest: Manifest, report: VerifyReport) -> None:
    """One real read per shard through the package's reader, as a trainer would."""
    from .reader import StoreError, open_store

    state_key, action_key = _state_action(manifest)
    try:
        store = open_store(root)
        for spec in manifest.shards:
            sample = store[spec.row_start + spec.num_rows // 2]
            for k in store.frame_keys:
                shape = spec.blocks[k].shape  # None only in a manifest that lacks it: report, do not crash
                frame_shape = None if shape is None else shape[1:]
                if sample[k].shape != frame_shape:
                    report.errors.append(f"{spec.relative_dir}/{spec.blocks[k].paths[0]}: frames decode to "
                                         f"{sample[k].shape}, manifest.json says {frame_shape}")
        sample = store[0] if len(store) else {}
        frame = sample.get(store.frame_keys[0]) if store.frame_keys else None
        first = (None if state_key is None else sample.get(state_key),
                 None if action_key is None else sample.get(action_key), frame)
        store.close()
        report.checks.append(f"read the middle sample of each of {len(manifest.shards)} shards "
                             f"({len(store.frame_keys)} frames each decoded)")
        check_sample(report, *first, where=f"{manifest.shards[0].shard_id} (eva_export.formats.eva_store reader)"
                     if manifest.shards else "an empty store", empty=not manifest.shards)
    except StoreError as exc:
        report.errors.append(f"real read: {exc}")


def _state_action(manifest: Manifest) -> tuple[str | None, str | None]:
    keys = list(manifest.materialized_blocks.numeric)
    state = "observation.state" if "observation.state" in keys else next((k for k in keys if "state" in k), None)
    action = "action" if "action" in keys else next((k for k in keys if "action" in k), None)
    return state, action


def _verify_shard(root: Path, spec: ShardSpec, report: VerifyReport) -> None:
    """Row counts, record offsets monotonic and in bounds; errors name the file."""
    d = root / spec.relative_dir
    if not d.is_dir():
        report.errors.append(f"{spec.relative_dir}: shard directory is missing")
        return
    for name, block in spec.blocks.items():
        if block.num_rows != spec.num_rows:
            report.errors.append(f"manifest.json: {spec.shard_id} block {name} has {block.num_rows} rows, "
                                 f"the shard {spec.num_rows}")
        if block.kind == KIND_RECORDS:  # Zarr arrays: read and checked by _check_values
            payload, offsets_rel = block.paths
            p_rel, o_rel = f"{spec.relative_dir}/{payload}", f"{spec.relative_dir}/{offsets_rel}"
            try:
                offsets = np.load(d / offsets_rel, allow_pickle=False)
                size = (d / payload).stat().st_size
            except (OSError, ValueError) as exc:
                report.errors.append(f"{o_rel}: unreadable ({exc})")
                continue
            if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) != spec.num_rows + 1:
                report.errors.append(f"{o_rel}: {offsets.shape} {offsets.dtype}, expected {spec.num_rows + 1} integer "
                                     "offsets")
                continue
            steps = np.diff(offsets)
            if offsets[0] != 0 or np.any(steps <= 0):
                bad = int(np.flatnonzero(steps <= 0)[0]) + 1 if np.any(steps <= 0) else 0
                report.errors.append(f"{o_rel}: offsets not strictly increasing from 0 (first bad entry {bad})")
            elif int(offsets[-1]) != size:
                what = "truncated" if int(offsets[-1]) > size else "has trailing bytes"
                report.errors.append(f"{p_rel}: {what}: {size} bytes, offsets end at {int(offsets[-1])}")
