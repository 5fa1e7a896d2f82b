"""LeRobot v3.0 and v2.0 sources export to every format.

Inputs are real files: tests/fixtures/lerobot-written/v30 (written by LeRobot 0.4.4's own
recorder: one AV1 MP4 and one Parquet holding both episodes) and tests/fixtures/lerobot-derived/v20
(LeRobot 0.3.3's v2.1 output with the v2.0 meta, tools/make_v20_fixture.py). Every export is
verified and read back with the consumer's reader (pyarrow, PyAV, h5py, mcap, the store reader);
the source tree stays byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
from export_faults import faulty_service
from mcap.reader import make_reader

from eva_export.config import parse_config
from eva_export.export.runner import ExportService
from eva_export.formats.common import sidecar
from eva_export.formats.common.source import SourceKind
from eva_export.formats.common.table import to_numpy
from eva_export.formats.eva_store import open_store
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter
from eva_export.formats.lerobot_v3.options import V3Options
from eva_export.formats.sources import detect_kind, validate_any
from eva_export.formats.verify import verify_export
from eva_export.fsutil import iter_jsonl, read_json
from eva_export.jobs import COMPLETED, Job

FIXTURES = Path(__file__).resolve().parent / "fixtures"
V30 = FIXTURES / "lerobot-written" / "v30"
V21 = FIXTURES / "lerobot-written" / "v21"
V20 = FIXTURES / "lerobot-derived" / "v20"
CAM = "observation.images.cam"
SHARD = f"videos/{CAM}/chunk-000/file-000.mp4"
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store")
REPO = Path(__file__).resolve().parents[1]


# ---- helpers ------------------------------------------------------------------------------------
def copy_source(tmp_path: Path, src: Path) -> Path:
    dst = tmp_path / "data" / src.name
    shutil.copytree(src, dst)
    return dst


def service(tmp_path: Path) -> ExportService:
    cfg = parse_config({"export": {"data_roots": [str(tmp_path / "data")], "jobs_dir": str(tmp_path / "jobs")}})
    return ExportService(cfg, background=False, recover=False)


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root by content (symlinks by target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def frames_of(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def source_episodes(src: Path) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    """Per source episode: its table columns and its decoded frames, read without eva_export."""
    info = read_json(src / "meta/info.json")
    out = []
    if info["codebase_version"] == "v3.0":
        table = pq.read_table(src / "data/chunk-000/file-000.parquet")
        frames = frames_of(src / SHARD)
        eps = pq.read_table(src / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        for e in eps:
            a, b = e["dataset_from_index"], e["dataset_to_index"]
            t = table.slice(a, b - a)
            first = round(e[f"videos/{CAM}/from_timestamp"] * info["fps"])
            out.append(({c: to_numpy(t.column(c)) for c in t.column_names}, frames[first:first + b - a]))
        return out
    for row in iter_jsonl(src / "meta/episodes.jsonl"):
        i = row["episode_index"]
        t = pq.read_table(src / f"data/chunk-000/episode_{i:06d}.parquet")
        out.append(({c: to_numpy(t.column(c)) for c in t.column_names},
                    frames_of(src / f"videos/chunk-000/{CAM}/episode_{i:06d}.mp4")))
    return out


def read_back(fmt: str, subset: Path, episodes: list[tuple[dict[str, np.ndarray], list[np.ndarray]]]) -> None:
    """The subset read with the consumer's reader: rows, values, frame counts (pixels for v2.1/v3)."""
    info = read_json(subset / "meta/info.json")
    assert info["total_episodes"] == len(episodes)
    assert info["total_frames"] == sum(len(f) for _c, f in episodes)
    for new, (cols, frames) in enumerate(episodes):
        n = len(frames)
        if fmt == "lerobot_v21":
            t = pq.read_table(subset / info["data_path"].format(episode_chunk=0, episode_index=new))
            np.testing.assert_allclose(to_numpy(t.column("observation.state")), cols["observation.state"], atol=1e-7)
            np.testing.assert_allclose(to_numpy(t.column("action")), cols["action"], atol=1e-7)
            got = frames_of(subset / info["video_path"].format(episode_chunk=0, video_key=CAM, episode_index=new))
            assert len(got) == n and all(np.array_equal(a, b) for a, b in zip(got, frames, strict=True))
        elif fmt == "hdf5":
            with h5py.File(subset / f"data/chunk-000/episode_{new:06d}.hdf5", "r") as h:
                images = {it.attrs["key"]: it["value"] for it in h["images"].values()}
                columns = {it.attrs["key"]: it["value"] for it in h["columns"].values()}
                assert images[CAM].shape == (n, 48, 64, 3)
                np.testing.assert_allclose(np.asarray(columns["action"]), cols["action"], atol=1e-7)
                assert np.array_equal(images[CAM][0], frames[0])
        elif fmt == "mcap":
            with open(subset / f"data/chunk-000/episode_{new:06d}.mcap", "rb") as fh:
                counts: dict[str, int] = {}
                for _s, ch, _m in make_reader(fh, validate_crcs=True).iter_messages():
                    counts[ch.topic] = counts.get(ch.topic, 0) + 1
            assert counts == {"episode": 1, f"episode/image/{CAM}": n}
    if fmt == "lerobot_v3" and episodes:
        t = pq.read_table(sorted((subset / "data").rglob("*.parquet"))[0])
        want = np.concatenate([c["action"] for c, _f in episodes])
        np.testing.assert_allclose(to_numpy(t.column("action")), want, atol=1e-7)
        got = [f for p in sorted((subset / "videos" / CAM).rglob("*.mp4")) for f in frames_of(p)]
        want_frames = [f for _c, fr in episodes for f in fr]
        assert len(got) == len(want_frames) and all(np.array_equal(a, b) for a, b in zip(got, want_frames, strict=True))
    if fmt == "eva_store" and episodes:
        store = open_store(subset)
        assert len(store) == sum(len(f) for _c, f in episodes)
        np.testing.assert_allclose(np.asarray(store[0]["action"]), episodes[0][0]["action"][0], atol=1e-7)


def export(tmp_path: Path, src: Path, fmt: str) -> Job:
    job = service(tmp_path).run(src, fmt)
    assert job.state == COMPLETED, job.error
    return job


# ---- kinds --------------------------------------------------------------------------------------
def test_kind_is_detected_from_codebase_version() -> None:
    assert detect_kind(V21) == SourceKind.LEROBOT_V21
    assert detect_kind(V30) == SourceKind.LEROBOT_V30
    assert detect_kind(V20) == SourceKind.LEROBOT_V20
    check = validate_any(V30)
    assert [(e.index, e.rows) for e in check.episodes] == [(0, 20), (1, 15)]
    assert check.meta.info.codebase_version == "v2.1"  # described as the v2.1 dataset the split writes


# ---- every format -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("which", ["v30", "v20"])
def test_source_exports_to_every_format_and_reads_back(tmp_path: Path, which: str, fmt: str) -> None:
    src = copy_source(tmp_path, {"v30": V30, "v20": V20}[which])
    sidecar.append_review(src, [1], "pass", "looked at it")  # one accepted, one unrated (rejected)
    before = tree_digest(src)
    episodes = source_episodes(src)
    job = export(tmp_path, src, fmt)
    assert (job.accepted_episodes, job.rejected_episodes, job.unrated_episodes) == (1, 1, 1)
    assert job.reencoded_episodes == 0
    for subset, eps in (("accepted", [episodes[1]]), ("rejected", [episodes[0]])):
        d = Path(job.accepted_dir).parent / subset
        rep = verify_export(d)
        assert rep.ok, (subset, rep.errors)
        assert read_json(d / "meta/quality_split.json")["source_episode_indices"] == [1 if subset == "accepted" else 0]
        read_back(fmt, d, eps)
    assert tree_digest(src) == before  # the source we do not own is never written


def test_unrated_without_sidecar(tmp_path: Path) -> None:
    src = copy_source(tmp_path, V30)
    job = export(tmp_path, src, "lerobot_v21")
    assert (job.accepted_episodes, job.rejected_episodes, job.unrated_episodes) == (0, 2, 2)


# ---- v3.0 -> lerobot_v21 -> lerobot_v3 ----------------------------------------------------------
def test_v30_to_v21_is_real_v21_and_round_trips_to_v3(tmp_path: Path) -> None:
    src = copy_source(tmp_path, V30)
    sidecar.append_review(src, [0, 1], "pass", None)
    episodes = source_episodes(src)
    job = export(tmp_path, src, "lerobot_v21")
    v21 = Path(job.accepted_dir)
    # Real v2.1: one Parquet and one MP4 per episode, per-episode stats, jsonl meta.
    info = read_json(v21 / "meta/info.json")
    assert info["codebase_version"] == "v2.1" and info["total_videos"] == 2 and "data_files_size_in_mb" not in info
    assert [r["task"] for r in iter_jsonl(v21 / "meta/tasks.jsonl")] == ["pick the cube", "place the cube"]
    rows = list(iter_jsonl(v21 / "meta/episodes.jsonl"))
    assert [(r["length"], r["qc_verdict"]) for r in rows] == [(20, "pass"), (15, "pass")]
    src_stats = pq.read_table(src / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for st, s in zip(iter_jsonl(v21 / "meta/episodes_stats.jsonl"), src_stats, strict=True):
        assert set(st["stats"]) == set(info["features"])
        np.testing.assert_allclose(st["stats"]["action"]["mean"], s["stats/action/mean"], rtol=1e-6)
        np.testing.assert_allclose(st["stats"][CAM]["std"], s[f"stats/{CAM}/std"], rtol=1e-6)
    read_back("lerobot_v21", v21, episodes)  # values equal, frames pixel-exact (stream copy)
    # The 'huggingface' schema metadata in the types datasets 3.x (LeRobot 0.3.3's reader) parses:
    # LeRobot 0.4's "List" failed there with "Feature type 'List' not found".
    hf = json.loads(pq.read_schema(v21 / "data/chunk-000/episode_000001.parquet").metadata[b"huggingface"])
    assert hf["info"]["features"]["action"]["_type"] == "Sequence" and "fingerprint" not in hf
    exp = LeRobotV3Exporter()
    exp.export(v21, tmp_path / "v3")
    assert exp.last_reencoded == {}
    assert verify_export(tmp_path / "v3").ok
    read_back("lerobot_v3", tmp_path / "v3", episodes)
    # The locators give back the source's own ones.
    ours = pq.read_table(tmp_path / "v3/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for a, b in zip(ours, src_stats, strict=True):
        for col in ("dataset_from_index", "dataset_to_index", f"videos/{CAM}/from_timestamp",
                    f"videos/{CAM}/to_timestamp"):
            assert a[col] == pytest.approx(b[col], abs=1e-9), col


def test_episode_without_an_exact_cut_alone_is_reencoded(tmp_path: Path) -> None:
    """An H.264 shard with one keyframe: episode 0 (from frame 0) is copied, episode 1 (from
    frame 20, not a keyframe) cannot be cut by stream copy and is re-encoded, and the job says so."""
    from eva_export.formats.common.video import VideoEncoder, VideoSettings

    src = copy_source(tmp_path, V30)
    frames = frames_of(src / SHARD)
    with VideoEncoder(src / SHARD, 64, 48, 10, VideoSettings(gop=100, crf=10)) as enc:
        for f in frames:
            enc.add(f)
    info = read_json(src / "meta/info.json")
    info["features"][CAM]["info"]["video.codec"] = "h264"
    (src / "meta/info.json").write_text(json.dumps(info))
    sidecar.append_review(src, [0, 1], "pass", None)
    recoded = frames_of(src / SHARD)
    job = export(tmp_path, src, "lerobot_v21")
    assert job.reencoded_episodes == 1
    rows = list(iter_jsonl(Path(job.accepted_dir) / "meta/episodes.jsonl"))
    assert [r.get("source_video_reencoded") for r in rows] == [None, [CAM]]
    vid = Path(job.accepted_dir) / "videos/chunk-000" / CAM
    got0, got1 = frames_of(vid / "episode_000000.mp4"), frames_of(vid / "episode_000001.mp4")
    assert all(np.array_equal(a, b) for a, b in zip(got0, recoded[:20], strict=True))  # copied: exact
    assert len(got1) == 15
    assert max(np.abs(a.astype(int) - b).mean() for a, b in zip(got1, recoded[20:], strict=True)) < 4.0
    assert verify_export(Path(job.accepted_dir)).ok


# ---- v2.0 -----------------------------------------------------------------------------------------
def test_v20_per_episode_stats_computed_while_reading(tmp_path: Path) -> None:
    src = copy_source(tmp_path, V20)
    assert not (src / "meta/episodes_stats.jsonl").exists()
    job = export(tmp_path, src, "lerobot_v21")
    out = Path(job.rejected_dir)
    assert read_json(out / "meta/info.json")["codebase_version"] == "v2.1"
    ours = list(iter_jsonl(out / "meta/episodes_stats.jsonl"))
    lerobot = list(iter_jsonl(V21 / "meta/episodes_stats.jsonl"))  # LeRobot's own numbers
    for i, (a, b) in enumerate(zip(ours, lerobot, strict=True)):
        assert set(a["stats"]) == set(b["stats"])
        for key in ("observation.state", "action"):
            for stat in ("min", "max", "mean", "std"):
                np.testing.assert_allclose(a["stats"][key][stat], b["stats"][key][stat], rtol=1e-5, atol=1e-6)
        # camera statistics from decoded frames, sampled as formats/common/stats.ImageStats says (every
        # 5th frame, every 8th pixel): exact on that sample, near LeRobot's own sample
        frames = np.stack(frames_of(src / f"videos/chunk-000/{CAM}/episode_{i:06d}.mp4")[::5])[:, ::8, ::8]
        want = frames.reshape(-1, 3).mean(0) / 255.0
        np.testing.assert_allclose(np.ravel(a["stats"][CAM]["mean"]), want, atol=1e-9)
        np.testing.assert_allclose(np.ravel(a["stats"][CAM]["mean"]), np.ravel(b["stats"][CAM]["mean"]), atol=0.15)
        assert np.shape(a["stats"][CAM]["std"]) == (3, 1, 1)


# ---- review into the sidecar ----------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eva_export.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.parametrize("fixture", [V30, V20])
def test_review_writes_the_sidecar_only(tmp_path: Path, fixture: Path) -> None:
    src = copy_source(tmp_path, fixture)
    before = tree_digest(src)
    r = cli("review", str(src), "--episodes", "0", "--verdict", "pass", "--note", "fine")
    assert r.returncode == 0, r.stderr
    after = tree_digest(src)
    assert {k: v for k, v in after.items() if k != sidecar.SIDECAR} == before
    assert cli("review", str(src), "--episodes", "7", "--verdict", "pass").returncode == 2  # no episode 7
    job = export(tmp_path, src, "lerobot_v21")
    assert (job.accepted_episodes, job.unrated_episodes) == (1, 1)
    row = next(iter_jsonl(Path(job.accepted_dir) / "meta/episodes.jsonl"))
    assert (row["source_episode_index"], row["qc_verdict"], row["note"]) == (0, "pass", "fine")
    assert cli("review", str(src), "--episodes", "all", "--verdict", "clear").returncode == 0
    job = export(tmp_path, src, "lerobot_v21")  # the changed sidecar makes the staging stale
    assert (job.accepted_episodes, job.unrated_episodes) == (0, 2)


def test_sidecar_lines_merge_field_by_field(tmp_path: Path) -> None:
    (tmp_path / "meta").mkdir()
    sidecar.append_lines(tmp_path, [
        json.dumps({"episode_index": 0, "quality": "red", "quality_issues": [{"code": "gap", "severity": "error",
                                                                              "detail": "x"}], "written_by": "check"}) + "\n",
        json.dumps({"episode_index": 0, "qc_verdict": "pass", "written_by": "review"}) + "\n",
        json.dumps({"episode_index": 0, "quality": "green", "written_by": "check"}) + "\n",
    ])
    assert sidecar.merged(tmp_path)[0]["quality"] == "green"
    assert sidecar.merged(tmp_path)[0]["qc_verdict"] == "pass"
    assert sidecar.merged(tmp_path)[0]["quality_issues"][0]["code"] == "gap"


# ---- shapes of v3.0 files LeRobot may write ---------------------------------------------------------
def test_v30_shard_with_small_row_groups(tmp_path: Path) -> None:
    """An episode spread over several row groups is sliced row-exactly."""
    src = copy_source(tmp_path, V30)
    shard = src / "data/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(shard), shard, row_group_size=6)
    assert pq.ParquetFile(shard).metadata.num_row_groups == 6
    episodes = source_episodes(src)
    job = export(tmp_path, src, "lerobot_v21")
    read_back("lerobot_v21", Path(job.rejected_dir), episodes)


def test_v30_h264_with_b_frames_is_cut_by_stream_copy(tmp_path: Path) -> None:
    """x264's default (closed-GOP) B-frames: each episode starts at a keyframe, so both are
    copied, and their frames decode pixel-exact."""
    src = copy_source(tmp_path, V30)
    frames = frames_of(src / SHARD)
    with av.open(str(src / SHARD), "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        s.options = {"preset": "medium", "x264-params": "keyint=10:min-keyint=10:scenecut=0:bframes=2"}
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = i
            out.mux(s.encode(vf))
        out.mux(s.encode(None))
    with av.open(str(src / SHARD)) as c:
        pkts = [p for p in c.demux(video=0) if p.size]
        assert any(p.pts != p.dts for p in pkts)  # really reordered (B-frames)
        assert [round(p.pts * p.time_base * 10) for p in pkts if p.is_keyframe][:3] == [0, 10, 20]
    episodes = source_episodes(src)
    job = export(tmp_path, src, "lerobot_v21")
    assert job.reencoded_episodes == 0
    read_back("lerobot_v21", Path(job.rejected_dir), episodes)


def test_v30_export_resumes_from_its_staged_units(tmp_path: Path) -> None:
    src = copy_source(tmp_path, V30)
    cfg = parse_config({"export": {"data_roots": [str(tmp_path / "data")], "jobs_dir": str(tmp_path / "jobs")}})
    job = faulty_service(cfg, background=False, recover=False, fail_at="convert_accepted").run(src, "lerobot_v3")
    assert job.state != COMPLETED and "injected failure" in job.error
    job = export(tmp_path, src, "lerobot_v3")
    assert job.reused_episodes == 2  # the cut units were checked (sizes from their records) and kept
    assert verify_export(Path(job.rejected_dir)).ok


def test_v30_with_several_data_and_video_files(tmp_path: Path) -> None:
    """A v3.0 dataset whose episodes spread over several Parquet and MP4 files per camera (file
    rollover), two cameras: every episode's rows and frames come back from the right file."""
    from dsfactory import Ep, make_subset

    v21 = make_subset(tmp_path / "made", [Ep(frames=n) for n in (12, 7, 15, 9)], cameras=2, width=32, height=24)
    src = tmp_path / "data" / "v30multi"
    LeRobotV3Exporter(V3Options(data_file_mb=0.002, video_file_mb=0.004)).export(v21, src)
    for name in ("quality_split.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl"):
        (src / "meta" / name).unlink(missing_ok=True)  # a foreign v3.0 dataset, not our export
    assert len(list((src / "data").rglob("*.parquet"))) > 1
    assert len(list((src / "videos/observation.images.cam1").rglob("*.mp4"))) > 1
    job = export(tmp_path, src, "lerobot_v21")
    out = Path(job.rejected_dir)  # no sidecar: all unrated
    assert job.rejected_episodes == 4 and job.reencoded_episodes == 0
    for i in range(4):
        a = pq.read_table(out / f"data/chunk-000/episode_{i:06d}.parquet")
        b = pq.read_table(v21 / f"data/chunk-000/episode_{i:06d}.parquet")
        for col in ("observation.state", "action", "capture_time", "timestamp", "frame_index", "index"):
            np.testing.assert_array_equal(to_numpy(a.column(col)), to_numpy(b.column(col)))
        for cam in ("observation.images.cam0", "observation.images.cam1"):
            got = frames_of(out / f"videos/chunk-000/{cam}/episode_{i:06d}.mp4")
            want = frames_of(v21 / f"videos/chunk-000/{cam}/episode_{i:06d}.mp4")
            assert len(got) == len(want) and all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
    assert verify_export(out).ok
