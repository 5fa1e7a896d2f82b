"""``eva-export check`` on sources we did not record, LeRobot v3.0 and v2.0.

The fault corpus (quality_corpus.py) is written as v2.1, as a v3.0 dataset (one shared Parquet,
one shared MP4 per camera, converted by the project's v3.0 exporter and stripped to what LeRobot
writes) and as a v2.0 dataset; the offline rules give the same verdicts, with the same frames,
on all three (the v2.1 verdicts equal live capture's: test_quality.py). LeRobot 0.4.4's own
v3.0 output (tests/fixtures/lerobot-written/v30) and the v2.0 fixture get a faulty episode
injected into their real files: it is flagged, the clean control is not. ``--write`` on these
sources writes meta/eva_quality.jsonl only (the source stays byte-identical) and the split
judges by it. Everything runs on real files with the real readers (pyarrow, PyAV).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from quality_corpus import CorpusEpisode, corpus, missing, write_corpus, write_v20_corpus, write_v30_corpus

from eva_export.config import parse_config
from eva_export.export.runner import ExportService
from eva_export.formats.common import sidecar
from eva_export.formats.common.source import SourceKind
from eva_export.formats.common.table import to_numpy
from eva_export.formats.lerobot_v3.options import V3Options
from eva_export.fsutil import iter_jsonl
from eva_export.jobs import COMPLETED, Job
from eva_export.quality.offline import DatasetCheck, check_dataset
from eva_export.quality.rules import RULE_VERSION

pytestmark = pytest.mark.timeout(900)
REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
V30 = FIXTURES / "lerobot-written" / "v30"
V20 = FIXTURES / "lerobot-derived" / "v20"
V30_DATA = "data/chunk-000/file-000.parquet"
V30_EPISODES = "meta/episodes/chunk-000/file-000.parquet"


# ---- helpers ------------------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eva_export.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def without_sidecar(digest: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in digest.items() if k != sidecar.SIDECAR}


def findings(chk: DatasetCheck, i: int) -> list[tuple[str, str, str, tuple[tuple[int, int], ...]]]:
    return [(f.code, str(f.severity), f.stream, tuple(tuple(r) for r in f.ranges)) for f in chk.episodes[i].findings]


def export(tmp_path: Path, src: Path, fmt: str = "lerobot_v21") -> Job:
    cfg = parse_config({"export": {"data_roots": [str(src.parent)], "jobs_dir": str(tmp_path / "jobs")}})
    job = ExportService(cfg, background=False, recover=False).run(src, fmt)
    assert job.state == COMPLETED, job.error
    return job


def source_indices(subset: str) -> list[int]:
    return [r["source_episode_index"] for r in iter_jsonl(Path(subset) / "meta/episodes.jsonl")]


def set_nan(path: Path, column: str, rows: slice) -> None:
    """Overwrite rows of a fixed-size-list float column with NaN, keeping the file's schema
    (LeRobot's metadata included): the table still reads as the writer wrote it, bar the values."""
    table = pq.read_table(path)
    col = table.column(column)
    values = to_numpy(col).astype(np.float64)
    values[rows] = np.nan
    typ = col.type
    arr = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), typ.value_type), typ.list_size)
    table = table.set_column(table.schema.get_field_index(column), table.schema.field(column), arr)
    pq.write_table(table, path)


# ---- the fault corpus on every source kind ------------------------------------------------------
@pytest.fixture(scope="module")
def episodes() -> list[CorpusEpisode]:
    # the short-video episode last: a v3.0 source holds it as a shared file that ends early
    eps = corpus()
    return [e for e in eps if not e.video_frames] + [e for e in eps if e.video_frames]


@pytest.fixture(scope="module")
def checks(tmp_path_factory, episodes) -> dict[str, tuple[Path, DatasetCheck]]:
    base = tmp_path_factory.mktemp("kinds")
    roots = {"v21": write_corpus(base / "v21", episodes),
             "v30": write_v30_corpus(base / "work", base / "v30", episodes),
             "v20": write_v20_corpus(base / "v20", episodes)}
    return {k: (root, check_dataset(root)) for k, root in roots.items()}


@pytest.mark.parametrize("kind", ["v30", "v20"])
def test_foreign_source_gets_the_same_verdicts_as_v21(checks, episodes, kind):
    root, chk = checks[kind]
    _, ref = checks["v21"]
    assert chk.kind == {"v30": SourceKind.LEROBOT_V30, "v20": SourceKind.LEROBOT_V20}[kind] and not chk.owned
    if kind == "v30":  # really the shared-file layout
        assert not (root / "meta/episodes.jsonl").exists() and len(list((root / "data").rglob("*.parquet"))) == 1
    assert [e.episode_index for e in chk.episodes] == list(range(len(episodes)))
    assert chk.rows == {}  # not ours: no eva rows to merge into
    for i, ep in enumerate(episodes):
        got = findings(chk, i)
        assert got == findings(ref, i), (ep.name, got, findings(ref, i))
        assert chk.episodes[i].stream_stats == ref.episodes[i].stream_stats, ep.name
        if ep.kind == "control":
            assert got == [] and chk.episodes[i].quality == "green", (ep.name, got)
        else:
            assert chk.episodes[i].quality == "red", ep.name
            assert missing([(c, s, [list(r) for r in rs]) for c, _sev, s, rs in got], ep) == [], (ep.name, got)


def test_v30_short_shared_video_is_a_frame_count_mismatch_of_its_episode_only(checks, episodes):
    _, chk = checks["v30"]
    last = chk.episodes[-1]
    assert episodes[-1].name == "frame_count_mismatch"
    assert last.stream_stats["observation.images.cam0"] == {"video_frames": episodes[-1].video_frames["cam0"]}
    assert last.stream_stats["observation.images.cam1"] == {"video_frames": episodes[-1].rows}
    assert all(e.stream_stats["observation.images.cam0"]["video_frames"] == ep.rows
               for e, ep in zip(chk.episodes[:-1], episodes[:-1], strict=True))


# ---- --write on a v3.0 source: the sidecar only, and the split judges by it -----------------------
def test_v30_check_write_fills_the_sidecar_and_the_split_follows_it(tmp_path, episodes):
    names = ("sine_mid", "action_spike", "ramp", "frozen_camera", "held_gripper")
    picked = [ep for ep in episodes if ep.name in names]
    src = write_v30_corpus(tmp_path / "work", tmp_path / "data" / "v30", picked)
    before = tree_digest(src)
    out = cli("check", str(src), "--write", "--json")  # no --sidecar: a v3.0 source is not ours
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["source_kind"] == "lerobot_v30" and report["rule_version"] == RULE_VERSION
    assert (report["red"], report["green"]) == (2, 3)
    assert without_sidecar(tree_digest(src)) == before  # the source's own files are byte-identical
    lines = sidecar.read_entries(src)
    assert [(e.episode_index, e.values["quality"], e.written_by) for e in lines] == [
        (i, "red" if ep.kind == "fault" else "green", "check") for i, ep in enumerate(picked)]
    spike = lines[[ep.name for ep in picked].index("action_spike")].values["quality_issues"]
    assert [(q["code"], q["stream"], q["ranges"]) for q in spike] == [("spike", "action[joint_3]", [[119, 121]])]
    job = export(tmp_path, src)
    clean = [i for i, ep in enumerate(picked) if ep.kind == "control"]
    assert source_indices(job.accepted_dir) == clean
    assert source_indices(job.rejected_dir) == [i for i in range(len(picked)) if i not in clean]
    assert job.unrated_episodes == 0


# ---- LeRobot's own files with a fault injected ---------------------------------------------------
def test_lerobot_written_v30_faulty_episode_flagged_clean_control_not(tmp_path):
    src = tmp_path / "v30"
    shutil.copytree(V30, src)
    clean = cli("check", str(src), "--json")
    assert clean.returncode == 0, clean.stderr
    assert [e["quality"] for e in json.loads(clean.stdout)["episodes"]] == ["green", "green"]
    eps = pq.read_table(src / V30_EPISODES).to_pylist()
    first = eps[1]["dataset_from_index"]  # episode 1's rows in the shared file
    set_nan(src / V30_DATA, "observation.state", slice(first + 3, first + 7))
    before = tree_digest(src)
    out = cli("check", str(src), "--write", "--sidecar", "--json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert [e["quality"] for e in report["episodes"]] == ["green", "red"]
    assert report["episodes"][0]["quality_issues"] == []
    assert [(i["code"], i["stream"], i["ranges"]) for i in report["episodes"][1]["quality_issues"]] == [
        ("non_finite", "observation.state", [[3, 6]])]
    assert report["episodes"][1]["stream_stats"]["observation.state"] == {"rows": 15, "non_finite_rows": 4}
    assert without_sidecar(tree_digest(src)) == before
    assert {i: v["quality"] for i, v in sidecar.merged(src).items()} == {0: "green", 1: "red"}
    text = cli("check", str(src))
    assert "episode    1: red" in text.stdout and "non_finite" in text.stdout and "frames 3-6" in text.stdout
    assert "(lerobot_v30): 1 red, 1 green" in text.stdout


def test_v20_check_write_goes_to_the_sidecar_and_the_export_follows_it(tmp_path):
    src = tmp_path / "data" / "v20"
    shutil.copytree(V20, src)
    set_nan(src / "data/chunk-000/episode_000001.parquet", "action", slice(5, 8))
    before = tree_digest(src)
    out = cli("check", str(src), "--write", "--json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["source_kind"] == "lerobot_v20" and [e["quality"] for e in report["episodes"]] == ["green", "red"]
    assert [(i["code"], i["stream"], i["ranges"]) for i in report["episodes"][1]["quality_issues"]] == [
        ("non_finite", "action", [[5, 7]])]
    assert without_sidecar(tree_digest(src)) == before  # episodes.jsonl untouched: not ours
    job = export(tmp_path, src)
    assert source_indices(job.accepted_dir) == [0] and source_indices(job.rejected_dir) == [1]


# ---- bad input: named, nothing written -----------------------------------------------------------
def test_v30_locator_off_its_episode_is_refused_naming_file_and_episode(tmp_path):
    src = tmp_path / "v30"
    shutil.copytree(V30, src)
    table = pq.read_table(src / V30_EPISODES)
    starts = table.column("dataset_from_index").to_pylist()
    starts[1] -= 2  # episode 1 said to begin inside episode 0's rows
    table = table.set_column(table.schema.get_field_index("dataset_from_index"), "dataset_from_index",
                             pa.array(starts, table.schema.field("dataset_from_index").type))
    pq.write_table(table, src / V30_EPISODES)
    out = cli("check", str(src), "--write")
    assert out.returncode == 2
    assert "episode 1" in out.stderr and str(src / V30_DATA) in out.stderr and "episode_index" in out.stderr
    assert not (src / sidecar.SIDECAR).exists()
    (src / V30_DATA).unlink()
    out = cli("check", str(src), "--json")
    assert out.returncode == 2 and "episode 0" in out.stderr and str(src / V30_DATA) in out.stderr, out.stderr


# ---- the health report on a foreign source: unrated until checked, NaN counted ---------------------
@pytest.mark.parametrize("which", ["v30", "v20"])
def test_report_on_a_foreign_source_tells_unrated_then_the_checks_verdicts(tmp_path, which):
    src = tmp_path / which
    shutil.copytree({"v30": V30, "v20": V20}[which], src)
    if which == "v30":
        first = pq.read_table(src / V30_EPISODES).to_pylist()[1]["dataset_from_index"]
        set_nan(src / V30_DATA, "observation.state", slice(first + 3, first + 7))
    else:
        set_nan(src / "data/chunk-000/episode_000001.parquet", "observation.state", slice(3, 7))
    before = tree_digest(src)
    html = tmp_path / "before.html"
    assert cli("report", str(src), "-o", str(html)).returncode == 0
    text = html.read_text()
    assert f'id="source-kind">lerobot_{which}' in text
    assert 'id="count-red" class="red">0 red' in text and 'class="green">0 green' in text
    assert 'class="unrated">2 unrated' in text  # nobody rated them: not green
    assert "4 NaN/inf values in 1 episodes" in text and "episode 1: non_finite frames 3..6" in text
    assert cli("check", str(src), "--write").returncode == 1
    html = tmp_path / "after.html"
    assert cli("report", str(src), "-o", str(html)).returncode == 0
    text = html.read_text()
    assert 'class="red">1 red' in text and 'class="green">1 green' in text and 'class="unrated">0 unrated' in text
    assert without_sidecar(tree_digest(src)) == before


def test_v30_check_over_several_data_and_video_files_reads_each_episode_from_its_file(tmp_path):
    """File rollover: each data and camera file holds a few episodes; every episode's rows and
    frames are found in the right file (the same findings and counts as the per-episode v2.1)."""
    from dsfactory import Ep, make_subset

    from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter

    v21 = make_subset(tmp_path / "made", [Ep(frames=n) for n in (40, 7, 45, 33, 12)], cameras=2, width=32, height=24)
    src = tmp_path / "v30multi"
    LeRobotV3Exporter(V3Options(data_file_mb=0.004, video_file_mb=0.008)).export(v21, src)
    for name in ("quality_split.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl"):
        (src / "meta" / name).unlink(missing_ok=True)
    assert len(list((src / "data").rglob("*.parquet"))) > 1
    assert len(list((src / "videos/observation.images.cam1").rglob("*.mp4"))) > 1
    ref, got = check_dataset(v21), check_dataset(src)
    assert got.kind == SourceKind.LEROBOT_V30 and len(got.episodes) == 5
    for i in range(5):
        assert findings(got, i) == findings(ref, i), i
        assert got.episodes[i].stream_stats == ref.episodes[i].stream_stats, i
    assert [c for c, *_ in findings(got, 1)] == ["too_short"]  # 7 rows: the only red one
    assert [e.quality for e in got.episodes] == ["green", "red", "green", "green", "green"]


def test_v30_episode_starting_mid_gop_with_b_frames_is_decoded_frame_exact(tmp_path):
    """The shared camera file re-encoded as H.264 with B-frames and a 7-frame GOP: episode 1
    (frame 20) starts between keyframes, so its range is decoded from the keyframe before it;
    it still gets exactly its 15 frames and the same changes as the same frames decoded whole."""
    import av

    from eva_export.quality.offline import luma_frames
    from eva_export.quality.rules import frame_change, signature

    src = tmp_path / "v30"
    shutil.copytree(V30, src)
    shard = src / "videos/observation.images.cam/chunk-000/file-000.mp4"
    with av.open(str(shard)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    with av.open(str(shard), "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        s.options = {"preset": "medium", "x264-params": "keyint=7:min-keyint=7:scenecut=0:bframes=2:threads=1"}
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = i
            out.mux(s.encode(vf))
        out.mux(s.encode(None))
    with av.open(str(shard)) as c:
        keys = [round(p.pts * p.time_base * 10) for p in c.demux(video=0) if p.size and p.is_keyframe]
    assert 20 not in keys and any(k < 20 for k in keys)
    chk = check_dataset(src)
    assert [e.stream_stats["observation.images.cam"]["video_frames"] for e in chk.episodes] == [20, 15]
    assert [e.quality for e in chk.episodes] == ["green", "green"]
    whole = [signature(img).copy() for img in luma_frames(shard)]
    part = [signature(img).copy() for img in luma_frames(shard, 20, 15, 10)]
    assert len(whole) == 35 and len(part) == 15
    for a, b in zip(whole[20:], part, strict=True):
        assert frame_change(a, b) == pytest.approx(0.0, abs=1e-9)
