"""Every valid LeRobot v2.1 dataset exports to every format, and nothing that fails
verification is published.

The inputs are the corpus under tests/fixtures/lerobot-corpus, written by LeRobot 0.3.3's own
recorder (tools/make_lerobot_corpus.py): AV1, H.264, HEVC and mixed-codec video, images stored
in Parquet, 1-3 cameras, 10-30 fps, unrated / all-green / all-red / mixed, one episode.
Every export is read back with the consumer's reader (pyarrow, PyAV, h5py, mcap).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import av
import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
from export_faults import faulty_service
from mcap.reader import make_reader

from eva_export.config import parse_config
from eva_export.export.paths import ExportPaths
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.export.split import classify
from eva_export.formats.common.records import EpisodeRow
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter
from eva_export.formats.verify import verify_export
from eva_export.fsutil import iter_jsonl, read_json
from eva_export.jobs import COMPLETED, FAILED, INTERRUPTED, RUNNING, Job, JobStore

CORPUS = Path(__file__).parent / "fixtures" / "lerobot-corpus"
DATASETS = sorted(p.name for p in CORPUS.iterdir() if (p / "meta/info.json").is_file())
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store")
REPO = Path(__file__).resolve().parents[1]


def test_corpus_is_there() -> None:
    # A missing corpus must fail loudly, not parametrize zero cases.
    assert len(DATASETS) >= 8, DATASETS


def copy_source(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / "data" / name
    shutil.copytree(CORPUS / name, dst)
    return dst


def service(tmp_path: Path, **kw: Any) -> ExportService:
    cfg = parse_config({"export": {"data_roots": [str(tmp_path / "data")], "jobs_dir": str(tmp_path / "jobs")}})
    return faulty_service(cfg, background=False, recover=False, **kw)


def expected_split(src: Path) -> dict[str, list[EpisodeRow]]:
    rows = [EpisodeRow.from_dict(d) for d in iter_jsonl(src / "meta/episodes.jsonl")]
    out: dict[str, list[EpisodeRow]] = {"accepted": [], "rejected": []}
    for r in rows:
        out[classify(r)].append(r)
    return out


def decode_count(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def codec_of(path: Path) -> str:
    """The codec as Debian's ffprobe names it (independent of PyAV's decoder choice)."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "stream=codec_name", "-of", "csv=p=0", str(path)], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip()


def decode_png(data: bytes) -> np.ndarray:
    cc = av.CodecContext.create("png", "r")
    return cc.decode(av.Packet(data))[0].to_ndarray(format="rgb24")


# ---- reading back with each consumer's reader -----------------------------------------------
def read_back(fmt: str, subset: Path, info_src: dict[str, Any], rows: list[EpisodeRow]) -> None:
    """Open every file of the subset with the consumer's reader; check frames and shapes."""
    visual = {k: f for k, f in info_src["features"].items() if f["dtype"] in ("video", "image")}
    lengths = [r.length for r in rows]
    info = read_json(subset / "meta/info.json")
    assert info["total_episodes"] == len(rows) and info["total_frames"] == sum(lengths)
    if fmt == "lerobot_v21":
        for new, n in enumerate(lengths):
            t = pq.read_table(subset / info["data_path"].format(episode_chunk=0, episode_index=new))
            assert t.num_rows == n
            for key, f in visual.items():
                if f["dtype"] == "video":
                    p = subset / info["video_path"].format(episode_chunk=0, video_key=key, episode_index=new)
                    assert decode_count(p) == n
                else:
                    img = decode_png(t.column(key)[0].as_py()["bytes"])
                    assert list(img.shape) == f["shape"]
    elif fmt == "lerobot_v3":
        data_rows = sum(pq.read_metadata(p).num_rows for p in sorted((subset / "data").rglob("*.parquet")))
        assert data_rows == sum(lengths)
        for key, f in visual.items():
            if f["dtype"] == "video":
                frames = sum(decode_count(p) for p in sorted((subset / "videos" / key).rglob("*.mp4")))
                assert frames == sum(lengths)
            elif lengths:
                shard = sorted((subset / "data").rglob("*.parquet"))[0]
                hf = json.loads(pq.read_schema(shard).metadata[b"huggingface"])
                assert hf["info"]["features"][key] == {"_type": "Image"}
                t = pq.read_table(shard, columns=[key])
                assert list(decode_png(t.column(key)[0].as_py()["bytes"]).shape) == f["shape"]
        eps = pq.read_table(sorted((subset / "meta/episodes").rglob("*.parquet"))[0])
        assert eps.num_rows == len(rows)
        stats = read_json(subset / "meta/stats.json")
        assert (set(stats) >= set(info["features"])) if rows else stats == {}
    elif fmt == "hdf5":
        files = sorted((subset / "data").rglob("*.hdf5"))
        assert len(files) == len(rows)
        for path, n in zip(files, lengths, strict=False):
            with h5py.File(path, "r") as h:
                imgs = {it.attrs["key"]: it["value"] for it in h["images"].values()}
                assert set(imgs) == set(visual), path
                for key, ds in imgs.items():
                    assert ds.shape == (n, *visual[key]["shape"])
                    assert ds[n - 1].std() > 0  # a real picture, not zeros
                cols = {it.attrs["key"] for it in h["columns"].values()}
                assert not cols & set(visual) and "observation.state" in cols
    elif fmt == "eva_store":
        from eva_export.formats.eva_store.reader import open_store
        store = open_store(subset)
        try:
            assert len(store) == sum(lengths) and sorted(store.episodes) == list(range(len(rows)))
            assert set(store.frame_keys) == set(visual)
            if rows:  # the first and the last sample decode to the declared shapes
                for i in (0, len(store) - 1):
                    sample = store[i]
                    for key, f in visual.items():
                        assert list(sample[key].shape) == f["shape"], (key, sample[key].shape)
        finally:
            store.close()
    else:
        files = sorted((subset / "data").rglob("*.mcap"))
        assert len(files) == len(rows)
        for path, n in zip(files, lengths, strict=False):
            with open(path, "rb") as fh:
                counts: dict[str, int] = {}
                for _s, ch, _m in make_reader(fh, validate_crcs=True).iter_messages():
                    counts[ch.topic] = counts.get(ch.topic, 0) + 1
            assert counts == {"episode": 1, **{f"episode/image/{k}": n for k in visual}}, path


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", DATASETS)
def test_corpus_exports_verifies_and_reads_back(tmp_path: Path, name: str, fmt: str) -> None:
    src = copy_source(tmp_path, name)
    info_src = read_json(src / "meta/info.json")
    split = expected_split(src)
    job = service(tmp_path).run(src, fmt)
    assert job.state == COMPLETED, job.error
    assert not list((tmp_path / "data").rglob(".staging-*"))  # nothing left behind
    # each source episode counted once (v3, hdf5 and mcap said 8/8 for 4 episodes)
    assert job.episodes_done == job.episodes_total == len(split["accepted"]) + len(split["rejected"])
    assert (job.accepted_episodes, job.rejected_episodes) == (len(split["accepted"]), len(split["rejected"]))
    unrated = sum(1 for r in split["accepted"] + split["rejected"] if not r.quality and not r.qc_verdict)
    assert job.unrated_episodes == unrated
    for subset, rows in split.items():
        d = Path(job.accepted_dir).parent / subset
        rep = verify_export(d)
        assert rep.ok, (subset, rep.errors)
        assert not any(".staging-" in m for m in rep.checks + rep.errors)  # the published names only
        assert rep.episodes == len(rows)
        if not rows:
            assert any("empty subset" in c for c in rep.checks)
        assert QualitySplit.read(d).unrated_count == unrated
        read_back(fmt, d, info_src, rows)


# ---- codecs: stream copy whatever decoder PyAV picks -------------------------------------------
@pytest.mark.parametrize("name,codec", [("av1-red", "av1"), ("h264-1cam-green", "h264")])
def test_v3_stream_copies_the_source_codec(tmp_path: Path, name: str, codec: str) -> None:
    """Bug 1: AV1 failed with UnknownCodecError libdav1d (output stream built from the decoder)."""
    src = copy_source(tmp_path, name)
    job = service(tmp_path).run(src, "lerobot_v21")  # the native split gives the exporter its input
    assert job.state == COMPLETED, job.error
    subset = Path(job.accepted_dir).parent / ("accepted" if job.accepted_episodes else "rejected")
    exp = LeRobotV3Exporter()
    exp.export(subset, tmp_path / "v3")
    assert exp.last_reencoded == {}  # nothing decoded or re-encoded: a stream copy
    shards = sorted((tmp_path / "v3/videos").rglob("*.mp4"))
    assert shards and all(codec_of(p) == codec for p in shards)


def test_v3_mixed_codecs_reencode_only_the_odd_episode(tmp_path: Path) -> None:
    src = copy_source(tmp_path, "hevc-av1-mixed-codecs")
    job = service(tmp_path).run(src, "lerobot_v21")
    assert job.state == COMPLETED, job.error
    exp = LeRobotV3Exporter()
    exp.export(Path(job.accepted_dir), tmp_path / "v3")
    assert exp.last_reencoded == {"observation.images.cam0": [1]}  # episode 0 (HEVC) copied
    assert verify_export(tmp_path / "v3").ok
    first = sorted((tmp_path / "v3/videos").rglob("*.mp4"))[0]
    assert codec_of(first) == "hevc"


# ---- publish only what verifies -----------------------------------------------------------------
class BreakingHdf5:
    """The real hdf5 exporter whose staged accepted output then loses an episode file."""

    name = "hdf5"

    def __init__(self) -> None:
        from eva_export.formats.hdf5.exporter import Hdf5Exporter
        self.real = Hdf5Exporter()

    def export(self, native_subset: Path, out_dir: Path, progress: Any) -> None:
        self.real.export(native_subset, out_dir, progress)
        if out_dir.name == "accepted":
            next(out_dir.rglob("*.hdf5")).unlink()

    def verify(self, out_dir: Path) -> Any:
        return self.real.verify(out_dir)


def test_staged_output_that_fails_verification_publishes_nothing(tmp_path: Path) -> None:
    src = copy_source(tmp_path, "h264-1cam-green")
    good = service(tmp_path).run(src, "hdf5")
    assert good.state == COMPLETED, good.error
    pair = Path(good.accepted_dir).parent
    before = {p.relative_to(pair): p.stat().st_mtime_ns for p in pair.rglob("*")}
    (src / "meta/episodes.jsonl").write_text((src / "meta/episodes.jsonl").read_text().replace('"green"', '"green" '))
    job = service(tmp_path, exporters={"hdf5": BreakingHdf5}).run(src, "hdf5")
    assert job.state == FAILED
    assert "failed verification, nothing was published" in job.error and "accepted:" in job.error
    assert {p.relative_to(pair): p.stat().st_mtime_ns for p in pair.rglob("*")} == before  # old pair intact
    assert verify_export(pair / "accepted").ok


def test_first_export_failing_verification_leaves_no_pair(tmp_path: Path) -> None:
    src = copy_source(tmp_path, "images-parquet-mixed")
    job = service(tmp_path, exporters={"hdf5": BreakingHdf5}).run(src, "hdf5")
    assert job.state == FAILED and "failed verification" in job.error
    assert not ExportPaths.of(src, "hdf5").pair_dir.exists()


# ---- leftovers ------------------------------------------------------------------------------
def test_failed_job_records_staging_and_clean_removes_it(tmp_path: Path) -> None:
    src = copy_source(tmp_path, "av1-3cam-mixed")
    job = service(tmp_path, fail_at="convert_rejected").run(src, "hdf5")
    assert job.state == FAILED
    staging = ExportPaths.of(src, "hdf5").staging
    assert job.staging_dir == str(staging) and staging.is_dir() and job.staging_bytes > 0
    stored = JobStore(tmp_path / "jobs").get(job.job_id)
    assert stored is not None and stored.staging_dir == str(staging)
    # the next export of the same source and format reuses it, then removes it
    again = service(tmp_path).run(src, "hdf5")
    assert again.state == COMPLETED and again.reused_episodes == 3
    assert not staging.exists()
    # a failed run again, then clean
    service(tmp_path, fail_at="convert_rejected").run(src, "mcap")
    st = ExportPaths.of(src, "mcap").staging
    assert st.is_dir()
    r = subprocess.run([sys.executable, "-m", "eva_export.cli", "clean", str(tmp_path / "data"), "--older-than", "0"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert not st.exists() and "freed" in r.stdout
    assert not list((tmp_path / "data").rglob(".staging-*"))


def test_staging_of_a_source_that_became_invalid_is_removed(tmp_path: Path) -> None:
    src = copy_source(tmp_path, "av1-red")
    assert service(tmp_path, fail_at="convert_accepted").run(src, "mcap").state == FAILED
    staging = ExportPaths.of(src, "mcap").staging
    assert staging.is_dir()
    (src / "data/chunk-000/episode_000001.parquet").unlink()
    job = service(tmp_path).run(src, "mcap")
    assert job.state == FAILED and "episode 1" in job.error
    assert not staging.exists()


def test_recovery_of_interrupted_publication_runs_before_validation(tmp_path: Path) -> None:
    """Bug 8: a kill between the two renames, then an export that fails validation, left the old
    pair only in .backup-*."""
    src = copy_source(tmp_path, "h264-1cam-green")
    job = service(tmp_path).run(src, "lerobot_v21")
    assert job.state == COMPLETED
    paths = ExportPaths.of(src, "lerobot_v21")
    os.rename(paths.pair_dir, paths.backup("killed-job"))  # the kill: first rename done, second not
    (src / "meta/info.json").write_text("{not json")
    failed = service(tmp_path).run(src, "lerobot_v21")
    assert failed.state == FAILED
    assert paths.pair_dir.is_dir() and not paths.backups()
    assert verify_export(paths.accepted).ok


def test_job_of_a_dead_process_is_marked_interrupted(tmp_path: Path) -> None:
    """Bug 8: a killed CLI export left its job 'running' forever."""
    store = JobStore(tmp_path / "jobs")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    job = dataclasses.replace(Job.new("export", "/x", "hdf5", state=RUNNING).claimed(), pid=dead.pid)
    store.save(job)
    alive = Job.new("export", "/y", "hdf5", state=RUNNING).claimed()  # this very process: alive
    store.save(alive)
    JobStore(tmp_path / "jobs")  # any process opening the store
    got = store.get(job.job_id)
    assert got is not None and got.state == INTERRUPTED and str(dead.pid) in got.error
    kept = store.get(alive.job_id)
    assert kept is not None and kept.state == RUNNING


# ---- unrated episodes, review, CLI without config ----------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eva_export.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_cli_export_without_config_warns_about_unrated_and_review_accepts(tmp_path: Path) -> None:
    """Bugs 5 and 'export needs --config': a dataset with no quality fields is rejected whole;
    the user is told how many and how to accept them, and can do it without ROS."""
    src = copy_source(tmp_path, "images-parquet-unrated-2cam")
    r = cli("export", str(src), "--format", "lerobot_v3")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["unrated_episodes"] == 2 and job["accepted_episodes"] == 0
    assert "2 of 2 episodes have no quality field and no verdict" in r.stderr
    assert "eva-export review" in r.stderr
    assert (tmp_path / "data/.jobs/export").is_dir()  # job records beside the source, no config needed
    bad = cli("review", str(src), "--episodes", "0,7", "--verdict", "pass")
    assert bad.returncode == 2 and "no episode(s) [7]" in bad.stderr
    assert all("qc_verdict" not in row for row in iter_jsonl(src / "meta/episodes.jsonl"))  # nothing written
    ok = cli("review", str(src), "--episodes", "all", "--verdict", "pass", "--note", "checked by script")
    assert ok.returncode == 0, ok.stderr
    rows = list(iter_jsonl(src / "meta/episodes.jsonl"))
    assert [(r["qc_verdict"], r["note"]) for r in rows] == [("pass", "checked by script")] * 2
    r2 = cli("export", str(src), "--format", "lerobot_v3")
    assert r2.returncode == 0, r2.stderr
    job2 = json.loads(r2.stdout)
    assert job2["accepted_episodes"] == 2 and job2["unrated_episodes"] == 0 and "warning" not in r2.stderr
    clear = cli("review", str(src), "--episodes", "1", "--verdict", "clear")
    assert clear.returncode == 0
    assert "qc_verdict" not in list(iter_jsonl(src / "meta/episodes.jsonl"))[1]
    v = cli("verify", str(tmp_path / "data/images-parquet-unrated-2cam_export/lerobot_v3"))
    assert v.returncode == 0, v.stdout


def test_review_is_refused_while_another_process_writes_the_dataset(tmp_path: Path) -> None:
    """Two writing processes would overwrite each other's episodes.jsonl: the second is refused
    with the holder's pid, nothing is written, and a killed holder leaves no stale lock."""
    src = copy_source(tmp_path, "images-parquet-unrated-2cam")
    before = (src / "meta/episodes.jsonl").read_bytes()
    hold = subprocess.Popen([sys.executable, "-c",
                             "import sys, time; from pathlib import Path\n"
                             "from eva_export.formats.common.meta import read_info\n"
                             "from eva_export.formats.lerobot_v21.writer import DatasetWriter\n"
                             "w = DatasetWriter(Path(sys.argv[1]), read_info(Path(sys.argv[1])))\n"
                             "print('holding', flush=True); time.sleep(120)", str(src)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert hold.stdout is not None and hold.stdout.readline().strip() == "holding"
        r = cli("review", str(src), "--episodes", "all", "--verdict", "pass")
        assert r.returncode == 2 and f"another process (pid {hold.pid}) is writing this dataset" in r.stderr
        assert (src / "meta/episodes.jsonl").read_bytes() == before
    finally:
        hold.kill()
        hold.wait()
    ok = cli("review", str(src), "--episodes", "all", "--verdict", "pass")  # the kernel dropped the lock
    assert ok.returncode == 0, ok.stderr
    assert [r["qc_verdict"] for r in iter_jsonl(src / "meta/episodes.jsonl")] == ["pass", "pass"]


def test_v3_stream_copies_vp9(tmp_path: Path) -> None:
    """VP9 (LeRobot 0.3.3's recorder cannot write it; re-encoded here with PyAV's libvpx-vp9)."""
    from eva_export.formats.common.video import VideoEncoder, VideoSettings, iter_frames

    src = copy_source(tmp_path, "h264-1cam-green")
    job = service(tmp_path).run(src, "lerobot_v21")
    assert job.state == COMPLETED, job.error
    subset = tmp_path / "vp9"
    shutil.copytree(job.accepted_dir, subset)  # a copy: the published files are hard links
    mp4s = sorted((subset / "videos").rglob("*.mp4"))
    for p in mp4s:
        frames = list(iter_frames(p))
        p.unlink()
        enc = VideoEncoder(p, 96, 72, 15, VideoSettings(codec="libvpx-vp9", gop=5))
        for f in frames:
            enc.add(f)
        assert enc.close() == len(frames)
    assert all(codec_of(p) == "vp9" for p in mp4s)
    exp = LeRobotV3Exporter()
    exp.export(subset, tmp_path / "v3")
    assert exp.last_reencoded == {}
    assert [codec_of(p) for p in sorted((tmp_path / "v3/videos").rglob("*.mp4"))] == ["vp9"]
    rep = verify_export(tmp_path / "v3")
    assert rep.ok, rep.errors
