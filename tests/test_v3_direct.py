"""The lerobot_v3 job straight from the source publishes what converting a staged native split
publishes: the same files, tables, statistics, info, marker, card and video frames.

The native path is the same job with the v3 exporter injected (faults.FaultPlan.exporters): the
runner then splits into staged native subsets and converts each. Only the job's own values
differ (job id, creation time, the manifest's hashes of the files naming them).
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset, without_keys
from export_faults import faulty_service

from eva_export import pool, pool_meter
from eva_export.config import parse_config
from eva_export.export.paths import ExportPaths
from eva_export.formats.common.card import CARD_FILE
from eva_export.formats.common.records import QualitySplit
from eva_export.formats.common.video import iter_frames
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter
from eva_export.jobs import COMPLETED
from eva_export.manifest import MANIFEST_FILE

pytestmark = pytest.mark.timeout(600)

VOLATILE = {"job_id", "created_at"}


def _tree(root: Path) -> dict[str, Any]:
    """Every file of the published pair: bytes, or for the files naming the job its content
    without the job's values."""
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        rel = str(p.relative_to(root))
        if rel.endswith(MANIFEST_FILE):  # every entry; the marker's and card's hashes name the job
            man = json.loads(p.read_text())
            out[rel] = {**man, "files": [f if f["path"] not in (CARD_FILE, "meta/quality_split.json")
                                         else {"path": f["path"]} for f in man["files"]]}
        elif p.name == CARD_FILE:
            marker = json.loads((p.parent / "meta/quality_split.json").read_text())
            text = p.read_text()
            for key in sorted(VOLATILE):
                text = text.replace(str(marker[key]), f"<{key}>")
            out[rel] = text
        elif rel.endswith("quality_split.json"):
            out[rel] = without_keys(json.loads(p.read_text()), VOLATILE)
        else:
            out[rel] = p.read_bytes()
        out[rel + " (mode)"] = p.stat().st_mode
    return out


def _export(log_dir: Path, src: Path, native: bool, config: dict[str, Any] | None = None) -> tuple[Path, Any]:
    base = {k: v for k, v in (config or {}).items() if k != "direct_workers"}
    cfg = parse_config({"collection": {"log_dir": str(log_dir)}, "export": {"workers": 1, **base}})
    if not native and "direct_workers" in (config or {}):  # the direct job reading on N processes
        cfg = parse_config({"collection": {"log_dir": str(log_dir)},
                            "export": {**{k: v for k, v in (config or {}).items() if k != "direct_workers"},
                                       "workers": (config or {})["direct_workers"]}})
    options = cfg.export.options_for("lerobot_v3")
    svc = faulty_service(cfg, background=False, recover=False,
                         exporters={"lerobot_v3": lambda: LeRobotV3Exporter(options)} if native else None)
    job = svc.run(src, "lerobot_v3")
    assert job.state == COMPLETED, job.error
    return ExportPaths.of(src, "lerobot_v3").pair_dir, job


def _eps(n: int) -> list[Ep]:
    return [Ep(frames=5 + (i * 7) % 11, quality="green" if i % 3 else "red",
               verdict="fail" if i == 4 else "", note="take note: grüße ✓" if i == 2 else None,  # non-ASCII: written as is
               extra={"take_id": f"take-{i:03d}"}) for i in range(n)]


def _both(tmp_path: Path, eps: list[Ep], config: dict[str, Any] | None = None) -> tuple[dict[str, Any], ...]:
    """One source exported by the native path, then by the direct one: both published trees."""
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", eps, cameras=2, width=32, height=24)
    # the card's review times (seconds) must not read as an export's created_at, replaced below
    time.sleep(1.1)
    pair, old_job = _export(log_dir, src, True, config)
    old = _tree(pair)
    pair, new_job = _export(log_dir, src, False, config)
    return old, old_job, _tree(pair), new_job, pair


@pytest.mark.parametrize("shards", [{}, {"v3_data_file_mb": 0.002, "v3_video_file_mb": 0.002},
                                    {"v3_data_file_mb": 0.002, "v3_video_file_mb": 0.002, "direct_workers": 2}],
                         ids=["one-shard", "many-shards", "many-shards-2-workers"])
def test_direct_job_publishes_what_the_native_path_publishes(tmp_path: Path, shards: dict[str, float]) -> None:
    eps = _eps(14)
    old, old_job, new, new_job, pair = _both(tmp_path, eps, shards)
    assert sorted(old) == sorted(new)
    different = [k for k in old if old[k] != new[k]]
    assert different == []
    # the same episodes on each side, renumbered, and what the rows carry (take ids) kept
    for subset in ("accepted", "rejected"):
        marker = QualitySplit.read(pair / subset)
        assert marker.dataset_format == "lerobot_v3"
        eps_table = pq.read_table(pair / subset / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        assert [r["episode_index"] for r in eps_table] == list(range(marker.episode_count))
        assert [r["take_id"] for r in eps_table] == [f"take-{i:03d}" for i in marker.source_episode_indices]
    assert (new_job.accepted_episodes, new_job.rejected_episodes) == (old_job.accepted_episodes,
                                                                       old_job.rejected_episodes)
    assert new_job.episodes_done == new_job.episodes_total == 14
    assert (new_job.files_done, new_job.bytes_done) == (new_job.files_total, new_job.bytes_total)
    if shards:  # small shards: several files of each stream
        assert len(list((pair / "accepted/data").rglob("*.parquet"))) > 2
        assert len(list((pair / "accepted/videos").rglob("*.mp4"))) > 4


@pytest.mark.parametrize("cheap", [True, False], ids=["read-by-the-writer", "handed-to-workers"])
def test_direct_job_on_an_auto_pool_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   cheap: bool) -> None:
    """export.workers 0 (auto): the writer reads the episodes' batches itself while the pool's
    measure calls the rest cheap, and hands the rest to worker processes once it does not (the
    measure is fixed here, not timed): the same published pair either way, and workers started
    only in the second case."""
    started: list[int] = []
    start = pool.LocalPool._start

    def counted(self: pool.LocalPool, n: int) -> None:
        started.append(n)
        start(self, n)

    monkeypatch.setattr(pool, "default_workers", lambda: 2)  # a pool on a one-core machine too
    monkeypatch.setattr(pool.LocalPool, "_start", counted)
    monkeypatch.setattr(pool_meter.SerialMeter, "still_cheap", lambda self, left: cheap)
    old, _, new, new_job, _ = _both(tmp_path, _eps(14), {"v3_data_file_mb": 0.002, "v3_video_file_mb": 0.002,
                                                         "direct_workers": 0})
    assert sorted(old) == sorted(new)
    assert [k for k in old if old[k] != new[k]] == []
    assert new_job.episodes_done == 14
    assert (max(started, default=0) > 0) == (not cheap)


def test_direct_job_video_frames_decode_as_the_source(tmp_path: Path) -> None:
    """The shards are stream copies: each episode's frames are the source episode's frames."""
    log_dir = tmp_path / "frames"
    src = make_dataset(log_dir / "demo" / "raw", _eps(6), cameras=1, width=32, height=24)
    pair, _ = _export(log_dir, src, False)
    marker = QualitySplit.read(pair / "accepted")
    eps = pq.read_table(pair / "accepted/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    key = "observation.images.cam0"
    shard = pair / f"accepted/videos/{key}/chunk-000/file-000.mp4"
    frames = list(iter_frames(shard))
    for row, raw in zip(eps, marker.source_episode_indices, strict=True):
        got = frames[round(row[f"videos/{key}/from_timestamp"] * 30):round(row[f"videos/{key}/to_timestamp"] * 30)]
        want = list(iter_frames(src / f"videos/chunk-000/{key}/episode_{raw:06d}.mp4"))
        assert len(got) == len(want) == row["length"]
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("policy", ["keep_passed", "finite_runs", "refuse"])
def test_nan_and_inf_episodes_take_the_same_way_as_through_the_native_split(tmp_path: Path, policy: str) -> None:
    """Passed accepted episodes with NaN/inf: kept and recorded (keep_passed), cut into finite runs
    (finite_runs: the job takes the native split for them), or refused naming the same episodes;
    the rejected one's NaN recorded. Either way the same outcome as the native path."""
    from test_finite_runs import raw_source

    log_dir = tmp_path / "logs"
    src = raw_source(log_dir / "demo" / "raw")
    time.sleep(1.1)  # the card's review times are not an export's created_at
    outcomes = []
    for native in (True, False):
        cfg = parse_config({"collection": {"log_dir": str(log_dir)}, "export": {"workers": 1, "nonfinite": policy}})
        options = cfg.export.options_for("lerobot_v3")
        svc = faulty_service(cfg, background=False, recover=False,
                             exporters={"lerobot_v3": functools.partial(LeRobotV3Exporter, options)}
                             if native else None)
        job = svc.run(src, "lerobot_v3")
        pair = ExportPaths.of(src, "lerobot_v3").pair_dir
        tree = _tree(pair) if job.state == COMPLETED else None
        outcomes.append((job.state, job.error, job.nonfinite_cut_episodes, job.nonfinite_kept_episodes, tree))
        if pair.exists():
            shutil.rmtree(pair)
    assert outcomes[0] == outcomes[1]
    state, error, cut, kept, _ = outcomes[1]
    if policy == "refuse":
        assert state == "failed" and "refused" in error and "source episode 1" in error
    else:
        assert state == COMPLETED and (cut, kept) == ((2, 0) if policy == "finite_runs" else (0, 2))


def test_a_resumed_camera_stream_opens_its_shards_with_the_uninterrupted_decode_delay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's decode delay is the largest reorder lead among the episodes probed ahead when it
    opens; a resumed stream restores that window (not a fresh one from the resume point), so
    with a B-frame episode ahead its shards are the uninterrupted run's, byte for byte."""
    from short_videos import encode_bframes, textured

    from eva_export.formats.lerobot_v3 import probe

    monkeypatch.setattr(probe, "PROBE_WINDOW", 8)  # 16 episodes show what 64 would at 128
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=12) for _ in range(16)], cameras=1)
    key = "observation.images.cam0"
    bframes = src / f"videos/chunk-000/{key}/episode_000011.mp4"
    bframes.unlink()
    encode_bframes(bframes, [textured(11, i, 64, 48) for i in range(12)], 30, "libx264", gop=12)
    assert probe.probe(bframes, 30, True).lead_frames > 0  # type: ignore[union-attr]
    config = {"v3_video_file_mb": 1e-6}  # a shard of every episode: each opens with the window's lead
    pair, _ = _export(log_dir, src, False, config)
    want = _tree(pair)
    cfg = parse_config({"collection": {"log_dir": str(log_dir)}, "export": {"workers": 1, **config}})
    failed = faulty_service(cfg, background=False, recover=False, fail_at="shard#2").run(src, "lerobot_v3")
    assert failed.state == "failed" and "shard#2" in failed.error
    pair, job = _export(log_dir, src, False, config)
    assert _tree(pair) == want
    assert job.reused_episodes == 0  # the data shard was open: only the two camera shards were kept


def test_statistics_lines_reuse_the_encoded_text_as_the_encoder_writes_them(tmp_path: Path) -> None:
    """An episode's statistics are encoded once: its record line and its episodes_stats.jsonl
    line are what encoding the whole line gives (non-ASCII names, NaN, nesting, large ints)."""
    from eva_export.export.assemble import JsonlStream
    from eva_export.export.v3_episodes import NativeStats
    from eva_export.export.v3_records import EpisodeEntry

    stats = {"observation.grüße": {"min": [float("nan"), -0.1, 1e300], "count": [2 ** 70]},
             "observation.images.cam": {"mean": [[[0.25]], [[0.5]], [[1.0]]]}, "x": {"max": [True, None]}}
    entry = EpisodeEntry.of(stats, (("observation.grüße", 1),))
    assert entry.to_json() == json.dumps(entry.to_dict(), ensure_ascii=False)
    (tmp_path / "a" / "meta").mkdir(parents=True)
    (tmp_path / "b" / "meta").mkdir(parents=True)
    mine, theirs = NativeStats(tmp_path / "a"), JsonlStream(tmp_path / "b" / "meta" / "episodes_stats.jsonl")
    for i in (0, 7):
        mine.add(i, entry.stats_json)
        theirs.write({"episode_index": i, "stats": stats})
    mine.commit()
    theirs.commit()
    assert ((tmp_path / "a" / "meta" / "episodes_stats.jsonl").read_bytes()
            == (tmp_path / "b" / "meta" / "episodes_stats.jsonl").read_bytes())
