"""eva_store: round trip against the source, multi-process reads, kill/resume, corruption, service path.

Every check reads the store back with the package's reader (``eva_export.formats.eva_store.open_store``),
and compares against the source decoded independently (pyarrow for the tables, PyAV for the MP4s).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, complete_stats, make_dataset, make_subset, state_value

from eva_export.config import ConfigError, parse_config
from eva_export.errors import ExportError
from eva_export.export.paths import ExportPaths
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats.common.exporter import VerifyReport
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.table import to_numpy
from eva_export.formats.common.video import iter_frames
from eva_export.formats.eva_store import StoreError, open_store
from eva_export.formats.eva_store.codecs import encode_image
from eva_export.formats.eva_store.exporter import EvaStoreExporter, split_of_episodes
from eva_export.formats.eva_store.options import EvaStoreOptions
from eva_export.formats.eva_store.reader import _read_numeric
from eva_export.formats.eva_store.records import (
    KIND_RECORDS,
    KIND_ZARR,
    SAMPLE_INDEX_FILE,
    SHARD_FILE,
    IndexRecord,
    Manifest,
    ShardSpec,
)
from eva_export.formats.eva_store.verify import _verify_shard
from eva_export.formats.registry import get_exporter
from eva_export.formats.verify import verify_export
from eva_export.fsutil import read_json
from eva_export.jobs import COMPLETED

REPO = Path(__file__).resolve().parents[1]
FIXTURE_V21 = REPO / "tests" / "fixtures" / "lerobot-written" / "v21"
W, H = 64, 48
CAMS = ("observation.images.cam0", "observation.images.cam1")
JPEG_TOL = 4.0  # mean absolute difference per pixel against the decoded source frame (lossy)


def _source_frames(src: Path) -> dict[tuple[str, int], list[np.ndarray]]:
    meta = read_meta(src)
    return {(k, e.episode_index): list(iter_frames(meta.video_path(k, e.episode_index)))
            for k in meta.info.video_keys for e in meta.episodes}


def _source_tables(src: Path) -> list[pa.Table]:
    meta = read_meta(src)
    return [pq.read_table(meta.data_path(e.episode_index)) for e in meta.episodes]


def _check_round_trip(src: Path, out: Path, codec: str) -> None:
    """Every value and every frame of the store equals the source (frames within JPEG_TOL for jpeg)."""
    store = open_store(out)
    tables = _source_tables(src)
    frames = _source_frames(src)
    meta = read_meta(src)
    assert len(store) == sum(t.num_rows for t in tables)
    i = 0
    for ep, table in zip(meta.episodes, tables, strict=False):
        cols = {name: to_numpy(table.column(name)) for name in table.column_names}
        for row in range(table.num_rows):
            s = store[i]
            assert s["sample_key"] == f"{ep.episode_index}:{row}"
            assert s["task"] == meta.task_text[int(cols["task_index"][row])]
            for name, col in cols.items():
                assert s[name].dtype == col.dtype, name
                np.testing.assert_array_equal(s[name], col[row], err_msg=f"{name} sample {i}")
            for key in meta.info.video_keys:
                got, want = s[key], frames[(key, ep.episode_index)][row]
                assert got.shape == want.shape and got.dtype == np.uint8
                if codec == "jpeg":
                    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
                    assert diff.mean() <= JPEG_TOL, (key, i, diff.mean())
                else:
                    np.testing.assert_array_equal(got, want, err_msg=f"{key} sample {i}")
            i += 1
    store.close()


@pytest.mark.parametrize("codec", ["jpeg", "png", "raw"])
def test_store_round_trip_every_frame_and_value(tmp_path: Path, codec: str) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=9, task="pick"), Ep(frames=7, task="place", quality="red")])
    out = tmp_path / "out"
    ex = EvaStoreExporter(EvaStoreOptions(image_codec=codec, jpeg_quality=92))
    ex.export(src, out)
    report = ex.verify(out)
    assert report.ok, report.errors
    assert any(c.startswith("real read") and "state[0]=[0.0]" in c and "frame 64x48" in c for c in report.checks)
    _check_round_trip(src, out, codec)

    # the manifest is the physical inventory: kinds, paths, dtypes and shapes of every block
    m = Manifest.read(out)
    assert m.format == "eva_store" and m.version == 1 and m.fps == 30 and m.created_at.endswith("Z")
    assert m.source["source_dir"] == str(src) and len(m.source["info_sha256"]) == 64
    assert m.materialized_blocks.cameras == CAMS and m.materialized_blocks.image_codec == codec
    assert m.materialized_blocks.jpeg_quality == (92 if codec == "jpeg" else None)
    assert m.stats["total_frames"] == 16 and m.stats["total_episodes"] == 2
    assert "observation.state" in m.stats["features"]
    assert m.provenance["options"]["image_codec"] == codec
    assert [s.shard_id for s in m.shards] == ["shard-00000", "shard-00001"]
    assert [(s.row_start, s.num_rows) for s in m.shards] == [(0, 9), (9, 7)]
    s1 = m.shards[1]
    assert s1.relative_dir == "shards/shard-00001"
    st = s1.blocks["observation.state"]
    assert (st.kind, st.paths, st.dtype, st.shape) == (KIND_ZARR, ("data.zarr/observation.state",), "float32", (7, 6))
    assert s1.blocks["timestamp"].shape == (7,) and s1.blocks["index"].dtype == "int64"
    cam = s1.blocks["observation.images.cam1"]
    assert cam.kind == KIND_RECORDS and cam.codec == codec and cam.shape == (7, H, W, 3)
    assert cam.paths == ("records/observation.images.cam1.msgpack", "records/observation.images.cam1.offsets.npy")
    assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m  # typed record round trip
    assert ShardSpec.from_dict(read_json(out / s1.relative_dir / SHARD_FILE)["spec"]).blocks == s1.blocks

    # the sample index, read with pyarrow
    idx = pq.read_table(out / SAMPLE_INDEX_FILE)
    assert idx.column_names == ["sample_index", "sample_key", "episode_index", "task", "split", "shard_id", "row"]
    recs = IndexRecord.read_many(out / SAMPLE_INDEX_FILE)
    assert recs[10] == IndexRecord(10, "1:1", 1, "place", "all", "shard-00001", 1)
    assert {r.split for r in recs} == {"all"}

    info = json.loads((out / "meta/info.json").read_text())
    assert info["dataset_format"] == "eva_store" and info["total_frames"] == 16 and "video_path" not in info
    assert info["features"]["observation.images.cam0"]["dtype"] == "image"
    assert QualitySplit.read(out).dataset_format == "eva_store"
    assert not list(out.rglob("*.mp4")) and not list(out.rglob("*.partial"))


def test_store_views_splits_and_temporal_context(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=5 + e) for e in range(6)], cameras=1)
    out = tmp_path / "out"
    EvaStoreExporter(EvaStoreOptions(image_codec="raw", val_ratio=0.34, split_seed=3)).export(src, out)
    assert verify_export(out).ok
    splits = split_of_episodes(list(range(6)), 0.34, 3)
    assert splits == split_of_episodes(list(range(6)), 0.34, 3)  # deterministic
    assert sorted(splits.values()).count("val") == 2
    store = open_store(out)
    train, val = store.split("train"), store.split("val")
    assert len(train) + len(val) == len(store) == sum(5 + e for e in range(6))
    assert len(store.split("all")) == len(store)
    val_eps = {e for e, s in splits.items() if s == "val"}
    assert {int(s["episode_index"]) for s in val} == val_eps
    assert {int(s["episode_index"]) for s in train} == set(range(6)) - val_eps
    assert Manifest.read(out).split["episodes"]["val"] == sorted(val_eps)
    ep3 = store.episode(3)
    assert len(ep3) == 8 and [int(s["frame_index"]) for s in ep3] == list(range(8))
    np.testing.assert_array_equal(ep3[2]["observation.state"], state_value(3, 2))
    with pytest.raises(StoreError, match="episode 42 is not in this store"):
        store.episode(42)
    with pytest.raises(IndexError):
        store[len(store)]

    # delta_timestamps: offsets in seconds, clamped at the episode's edges, with a pad mask
    fps = store.fps
    ctx = open_store(out, delta_timestamps={"action": [-2 / fps, 0, 1 / fps, 3 / fps],
                                            "observation.images.cam0": [-1 / fps, 0]})
    first = ctx.episode(3)[0]
    np.testing.assert_array_equal(first["action"]["value"], -np.stack([state_value(3, f) for f in (0, 0, 1, 3)]))
    assert first["action"]["is_pad"].tolist() == [True, False, False, False]
    assert first["observation.images.cam0"]["value"].shape == (2, H, W, 3)
    assert first["observation.images.cam0"]["is_pad"].tolist() == [True, False]
    last = ctx.episode(3)[7]
    np.testing.assert_array_equal(last["action"]["value"], -np.stack([state_value(3, f) for f in (5, 7, 7, 7)]))
    assert last["action"]["is_pad"].tolist() == [False, False, True, True]
    with pytest.raises(StoreError, match="not a block"):
        open_store(out, delta_timestamps={"nope": [0.0]})


def _read_all(path: str, order: list[int], store: Any = None) -> tuple[int, list[float]]:
    """Read samples in ``order``; returns this process's pid and one number per sample."""
    store = store if store is not None else open_store(path)
    sums = []
    for i in order:
        s = store[i]
        sums.append(float(s["observation.state"].sum()) + float(s["observation.images.cam0"].astype(np.int64).sum())
                    + float(s["observation.images.cam1"].astype(np.int64).sum()))
    return os.getpid(), sums


_FORKED_STORE: Any = None
_FORK_BARRIER: Any = None  # both workers wait here: neither can take both tasks, and they read at once


def _forked_worker(order: list[int]) -> tuple[int, list[float], list[int]]:
    """Runs in a forked child: reads through the store object the parent created and used."""
    _FORK_BARRIER.wait()
    pid, sums = _read_all("", order, _FORKED_STORE)
    fds = sorted(fd for h in _FORKED_STORE._open.values() for fd, _, _ in h.records.values())
    return pid, sums, fds


def _fork_check(out: str) -> None:
    """The parent half of the fork test, run in a fresh interpreter (see the test)."""
    global _FORKED_STORE, _FORK_BARRIER
    store = open_store(out)
    n = len(store)
    _, expect = _read_all(out, list(range(n)), store)  # the parent has opened every shard
    parent_fds = sorted(fd for h in store._open.values() for fd, _, _ in h.records.values())
    _FORKED_STORE = store
    orders = [random.Random(seed).sample(range(n), n) for seed in (1, 2)]
    ctx = mp.get_context("fork")
    _FORK_BARRIER = ctx.Barrier(2, timeout=240)  # inherited by the forked workers
    with ctx.Pool(2) as pool:
        results = pool.map(_forked_worker, orders)  # both workers read at the same time
    assert len({pid for pid, _, _ in results} | {os.getpid()}) == 3
    for order, (_, sums, child_fds) in zip(orders, results, strict=False):
        assert sums == [expect[i] for i in order]
        assert child_fds  # the child opened its own descriptors ...
    # ... and the parent's cache is untouched and still reads correctly after the fork
    assert sorted(fd for h in store._open.values() for fd, _, _ in h.records.values()) == parent_fds
    assert _read_all(out, [n - 1, 0], store)[1] == [expect[n - 1], expect[0]]
    print("fork check ok", n)


def test_store_read_from_two_forked_processes_at_once(tmp_path: Path) -> None:
    """A store object opened and used in a parent, then read by two forked workers at once.

    The parent is a fresh interpreter (as a training script's would be): forking the pytest
    process itself, which runs rclpy/DDS threads for other tests, can deadlock the child.
    """
    src = make_subset(tmp_path / "src", [Ep(frames=12), Ep(frames=10), Ep(frames=8)])
    out = tmp_path / "out"
    EvaStoreExporter().export(src, out)
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
            f"import test_formats_store as t; t._fork_check({str(out)!r})")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == f"fork check ok {12 + 10 + 8}"


def _corrupt_copy(out: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "bad"
    shutil.copytree(out, dst)
    return dst


def test_verify_catches_corrupt_offsets_and_truncated_blob(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5)])
    out = tmp_path / "out"
    EvaStoreExporter().export(src, out)
    assert verify_export(out).ok
    rel_off = "shards/shard-00001/records/observation.images.cam0.offsets.npy"
    rel_blob = "shards/shard-00001/records/observation.images.cam0.msgpack"

    bad = _corrupt_copy(out, tmp_path / "a")
    off = np.load(bad / rel_off)
    off[2], off[3] = off[3], off[2]  # two offsets swapped: not monotonic
    np.save(bad / rel_off, off)
    rep = verify_export(bad)
    assert not rep.ok and any(rel_off in e and "not strictly increasing" in e for e in rep.errors), rep.errors

    bad = _corrupt_copy(out, tmp_path / "b")
    off = np.load(bad / rel_off)
    off[-1] += 10_000  # points past the end of the payload
    np.save(bad / rel_off, off)
    rep = verify_export(bad)
    assert not rep.ok and any(rel_blob in e and "truncated" in e for e in rep.errors), rep.errors

    bad = _corrupt_copy(out, tmp_path / "c")
    size = (bad / rel_blob).stat().st_size
    with open(bad / rel_blob, "r+b") as f:
        f.truncate(size - 100)  # a truncated blob (a copy cut short)
    rep = verify_export(bad)
    assert not rep.ok and any(rel_blob in e and "truncated" in e for e in rep.errors), rep.errors
    with pytest.raises(StoreError, match=r"observation\.images\.cam0\.offsets\.npy: record 4 spans"):
        open_store(bad)[6 + 4]  # the reader refuses the record too, naming the file

    bad = _corrupt_copy(out, tmp_path / "d")
    off = np.load(bad / rel_off)
    off[1:-1] += 3  # still increasing and in bounds, but every record starts mid-record
    np.save(bad / rel_off, off)
    rep = verify_export(bad)
    assert not rep.ok and any(rel_blob in e and "does not decode" in e for e in rep.errors), rep.errors

    bad = _corrupt_copy(out, tmp_path / "e")
    shutil.rmtree(bad / "shards/shard-00000")
    rep = verify_export(bad)
    assert not rep.ok and any("shards/shard-00000: shard directory is missing" in e for e in rep.errors)

    bad = _corrupt_copy(out, tmp_path / "f")
    idx = pq.read_table(bad / SAMPLE_INDEX_FILE).slice(0, 10)
    pq.write_table(idx, bad / SAMPLE_INDEX_FILE)
    rep = verify_export(bad)
    assert not rep.ok and any("sample_index.parquet: 10 samples, the shards hold 11" in e for e in rep.errors)


def test_export_refuses_frame_count_mismatch(tmp_path: Path) -> None:
    from dsfactory import replace_video

    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5)])
    replace_video(src, "observation.images.cam1", 1, frames=4)
    with pytest.raises(ExportError, match=r"episode 1: observation\.images\.cam1 has 4 frames, the table has 5 rows"):
        EvaStoreExporter().export(src, tmp_path / "out")
    shards = tmp_path / "out" / "shards"
    assert sorted(p.name for p in shards.iterdir()) == ["shard-00000"]  # episode 0 finished, nothing half


def test_rerun_reuses_finished_shards_and_rewrites_changed_ones(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5), Ep(frames=4)], cameras=1)
    out = tmp_path / "out"
    ex = EvaStoreExporter()
    ex.export(src, out)
    ino = {p.name: (p / SHARD_FILE).stat().st_ino for p in (out / "shards").iterdir()}
    keep = tmp_path / "keep"  # hard links hold the old inodes, so the filesystem cannot reuse them
    keep.mkdir()
    for p in (out / "shards").iterdir():
        os.link(p / SHARD_FILE, keep / p.name)
    ex.export(src, out)
    assert ex.resumed == [0, 1, 2]
    ex_png = EvaStoreExporter(EvaStoreOptions(image_codec="png"))  # other options: every shard is rewritten
    ex_png.export(src, out)
    assert ex_png.resumed == [] and verify_export(out).ok
    assert Manifest.read(out).shards[0].blocks["observation.images.cam0"].codec == "png"
    new_ino = {p.name: (p / SHARD_FILE).stat().st_ino for p in (out / "shards").iterdir()}
    assert new_ino.keys() == ino.keys() and all(new_ino[k] != ino[k] for k in ino)  # every shard rewritten


# ---- a kill during the export (eva-export CLI, SIGKILL) ----------------------------------------
N_KILL_EPISODES = 14


def _cmd(config: Path, src: Path) -> list[str]:
    return [sys.executable, "-m", "eva_export.cli", "export", "--config", str(config), "--source", str(src),
            "--format", "eva_store"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _visible_shards(staging: Path) -> list[Path]:
    return sorted(p for p in staging.glob("out/*/shards/shard-*"))


def _check_visible_shards_whole(staging: Path) -> dict[str, int]:
    """Every shard with a final name is complete; returns subset/shard -> inode of its shard.json."""
    seen = {}
    for d in _visible_shards(staging):
        spec = ShardSpec.from_dict(read_json(d / SHARD_FILE)["spec"])
        rep = VerifyReport(path=str(d), dataset_format="eva_store")
        _verify_shard(d.parents[1], spec, rep)
        assert rep.ok, (d, rep.errors)
        cols = _read_numeric(d, spec)  # every Zarr array whole, as the manifest says
        assert {n: c.shape for n, c in cols.items()} == {n: b.shape for n, b in spec.blocks.items() if b.kind == KIND_ZARR}
        seen[f"{d.parents[1].name}/{d.name}"] = (d / SHARD_FILE).stat().st_ino
    return seen


@pytest.mark.timeout(600)
def test_sigkill_during_export_leaves_no_half_shard_and_rerun_reuses(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=40, quality="green" if i % 3 else "red")
                                                  for i in range(N_KILL_EPISODES)], cameras=2, width=96, height=72)
    config = tmp_path / "config.yaml"
    config.write_text(f'collection:\n  log_dir: "{log_dir}"\nexport:\n  eva_store:\n    image_codec: png\n')
    paths = ExportPaths.of(src, "eva_store")
    rng = random.Random(11)
    reused_total = 0
    for trial in range(4):
        proc = subprocess.Popen(_cmd(config, src), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        if trial % 2 == 0:  # k finished shards visible
            k = rng.randrange(2, N_KILL_EPISODES)
            cond = lambda: len(_visible_shards(paths.staging)) >= k  # noqa: E731, B023 - used in this iteration
        else:  # a shard being written right now, after at least one finished
            cond = lambda: (bool(_visible_shards(paths.staging))  # noqa: E731
                            and bool(list(paths.staging.glob("out/*/shards/.shard-*.partial"))))
        while time.monotonic() < deadline and proc.poll() is None and not cond():
            time.sleep(0.0005)
        assert proc.poll() is None, f"the export finished before the kill (trial {trial}); make it longer"
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        before = _check_visible_shards_whole(paths.staging)
        assert before, f"the kill came before any shard was finished (trial {trial})"
        rerun = subprocess.run(_cmd(config, src), env=_env(), capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        job = json.loads(rerun.stdout)
        assert job["state"] == COMPLETED and not paths.staging.exists()
        after = {f"{sub}/{d.name}": (d / SHARD_FILE).stat().st_ino
                 for sub in ("accepted", "rejected") for d in (paths.pair_dir / sub / "shards").iterdir()}
        assert not any(p.name.startswith(".") for sub in ("accepted", "rejected")
                       for p in (paths.pair_dir / sub / "shards").iterdir())
        kept = [k for k, ino in before.items() if after.get(k) == ino]
        assert kept == sorted(before), "every shard finished before the kill is reused (same file) by the rerun"
        reused_total += len(kept)
        for sub in ("accepted", "rejected"):
            rep = verify_export(paths.pair_dir / sub)
            assert rep.ok, rep.errors
        assert Manifest.read(paths.accepted).materialized_blocks.image_codec == "png"
        shutil.rmtree(paths.pair_dir)  # the next trial exports from scratch again
    assert reused_total > 0


# ---- the normal export path -------------------------------------------------------------------
def test_export_service_produces_accepted_and_rejected_stores(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=6 + i, quality=q)
                                                  for i, q in enumerate(["green", "red", "green", "green", "red"])])
    cfg = parse_config({"collection": {"log_dir": str(log_dir)},
                        "export": {"eva_store": {"image_codec": "raw", "val_ratio": 0.5, "split_seed": 7}}})
    svc = ExportService(cfg, background=False, recover=False)
    job = svc.run(src, "eva_store")
    assert job.state == COMPLETED, job.error
    assert (job.accepted_episodes, job.rejected_episodes) == (3, 2)
    for sub, eps, frames in ((job.accepted_dir, [0, 2, 3], 6 + 8 + 9), (job.rejected_dir, [1, 4], 7 + 10)):
        rep = verify_export(Path(sub))
        assert rep.ok, rep.errors
        store = open_store(sub)
        assert len(store) == frames
        m = store.manifest
        assert m.source["source_episode_indices"] == eps and m.materialized_blocks.image_codec == "raw"
        assert m.source["info_sha256"] is not None and m.split["seed"] == 7
        assert {len(store.split("train")) > 0, len(store.split("val")) > 0} == {True}
        s = store[0]  # first frame of the subset's first source episode
        np.testing.assert_array_equal(s["observation.state"], state_value(eps[0], 0))


def test_config_section_eva_store() -> None:
    cfg = parse_config({"export": {"eva_store": {"image_codec": "png", "jpeg_quality": 80}}})
    store = cfg.export.options_for("eva_store")
    assert store.image_codec == "png" and store.jpeg_quality == 80
    assert parse_config({}).export.options_for("eva_store").image_codec == "jpeg"
    with pytest.raises(ConfigError, match="image_codec must be jpeg, png or raw"):
        parse_config({"export": {"eva_store": {"image_codec": "webp"}}})
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_config({"export": {"eva_store": {"quality": 80}}})
    with pytest.raises(ValueError, match="image_codec 'gif'"):
        get_exporter("eva_store", EvaStoreOptions(image_codec="gif"))


# ---- foreign inputs ---------------------------------------------------------------------------
def test_lerobot_written_v21_fixture_exports(tmp_path: Path) -> None:
    """LeRobot 0.3.3's own v2.1 dataset (AV1 video, two tasks) becomes a store, exact with png."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURE_V21, src)
    meta = read_meta(src)
    QualitySplit(str(src), "accepted", "lerobot_v21", [e.episode_index for e in meta.episodes],
                 episode_count=len(meta.episodes), frame_count=sum(e.length for e in meta.episodes)).write(src)
    complete_stats(src)  # LeRobot 0.3.3 writes no quantiles and no stats.json; the split computes them
    out = tmp_path / "out"
    ex = EvaStoreExporter(EvaStoreOptions(image_codec="png"))
    ex.export(src, out)
    rep = ex.verify(out)
    assert rep.ok, rep.errors
    assert rep.episodes == 2 and rep.frames == 35
    _check_round_trip(src, out, "png")
    store = open_store(out)
    assert {store[0]["task"], store[34]["task"]} == {t.task for t in meta.tasks}


def test_parquet_image_column_is_carried(tmp_path: Path) -> None:
    """A LeRobot ``image`` feature (PNG bytes in a Parquet struct column) comes back pixel-exact."""
    src = make_subset(tmp_path / "src", [Ep(frames=5), Ep(frames=4)], cameras=1)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.images.wrist"] = {"dtype": "image", "shape": [H, W, 3],
                                                    "names": ["height", "width", "channels"]}
    (src / "meta/info.json").write_text(json.dumps(info, indent=4))
    rng = np.random.default_rng(0)
    wrist: dict[tuple[int, int], np.ndarray] = {}
    for ep, n in ((0, 5), (1, 4)):
        path = src / f"data/chunk-000/episode_{ep:06d}.parquet"
        table = pq.read_table(path)
        imgs = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(n)]
        for r, img in enumerate(imgs):
            wrist[(ep, r)] = img
        col = pa.array([{"bytes": encode_image(img, "png"), "path": f"frame_{r:06d}.png"} for r, img in enumerate(imgs)],
                       type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        pq.write_table(table.append_column("observation.images.wrist", col), path)
    complete_stats(src)  # the new camera's statistics, as the split computes them
    out = tmp_path / "out"
    EvaStoreExporter().export(src, out)  # jpeg for the camera; the PNG bytes are carried as they are
    rep = verify_export(out)
    assert rep.ok, rep.errors
    store = open_store(out)
    assert store.manifest.materialized_blocks.images == ("observation.images.wrist",)
    assert store.manifest.shards[1].blocks["observation.images.wrist"].codec == "png"
    for i, key in enumerate([(0, r) for r in range(5)] + [(1, r) for r in range(4)]):
        np.testing.assert_array_equal(store[i]["observation.images.wrist"], wrist[key])


def test_raw_fast_path_refuses_shifted_records(tmp_path: Path) -> None:
    """Raw frames skip the MessagePack unpack of their pixels; the header is still checked."""
    src = make_subset(tmp_path / "src", [Ep(frames=4)], cameras=1)
    out = tmp_path / "out"
    EvaStoreExporter(EvaStoreOptions(image_codec="raw")).export(src, out)
    assert verify_export(out).ok
    rel_off = "shards/shard-00000/records/observation.images.cam0.offsets.npy"
    off = np.load(out / rel_off)
    off[1:-1] += 1  # in bounds and increasing, but every record after the first starts one byte late
    np.save(out / rel_off, off)
    rep = verify_export(out)
    assert not rep.ok and any("observation.images.cam0.msgpack: record 2 does not decode" in e for e in rep.errors), \
        rep.errors
    with pytest.raises(StoreError, match="record 1 does not decode"):
        open_store(out)[1]


def test_descriptor_eviction_keeps_numeric_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With more shards than MAX_OPEN_SHARDS, descriptors are recycled; Zarr is read once per shard."""
    import eva_export.formats.eva_store.reader as reader_mod

    src = make_subset(tmp_path / "src", [Ep(frames=3) for _ in range(4)], cameras=1)
    out = tmp_path / "out"
    EvaStoreExporter(EvaStoreOptions(image_codec="raw")).export(src, out)
    monkeypatch.setattr(reader_mod, "MAX_OPEN_SHARDS", 2)
    reads = []
    real = reader_mod._read_numeric
    monkeypatch.setattr(reader_mod, "_read_numeric", lambda d, spec: reads.append(spec.shard_id) or real(d, spec))
    store = open_store(out)
    order = [0, 3, 6, 9, 0, 9, 3, 6, 11, 1]
    got = [store[i] for i in order]
    assert len(store._open) == 2 and len(store._numeric_cache) == 4
    assert sorted(reads) == [f"shard-{e:05d}" for e in range(4)]  # each shard's columns read once
    for i, s in zip(order, got, strict=True):
        np.testing.assert_array_equal(s["observation.state"], state_value(i // 3, i % 3))
