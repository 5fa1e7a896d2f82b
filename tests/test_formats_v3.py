"""LeRobot v3.0 export: real datasets from dsfactory, read back with pyarrow, PyAV and ffprobe."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, image, make_dataset, make_subset, replace_video, state_value
from short_videos import encode_bframes, short_subset, textured

from eva_export.errors import ExportError
from eva_export.export.records import QualitySplit
from eva_export.formats.common.table import to_numpy
from eva_export.formats.common.video import VideoSettings, iter_frames, stream_timing
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter, tasks_table
from eva_export.formats.lerobot_v3.options import V3Options

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lerobot-written" / "v30"  # LeRobot-written reference (copied from shared/fixtures)
W, H, FPS = 64, 48, 30
TOL = 5  # H.264 keeps flat colours within a few levels


def subset(root: Path, eps: list[Ep], **kw: object) -> Path:
    return make_subset(root, eps, "accepted", **kw)


def decode_all(path: Path) -> list[np.ndarray]:
    """Every frame of an MP4, checking frame i is shown at exactly i / fps."""
    out = []
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        for i, f in enumerate(c.decode(s)):
            assert Fraction(f.pts) * s.time_base == Fraction(i, FPS), (path, i, f.pts)
            out.append(f.to_ndarray(format="rgb24"))
    return out


def check_colour(frame: np.ndarray, episode: int, frame_index: int, cam: int) -> None:
    want = image(episode, frame_index, cam, W, H).reshape(-1, 3).mean(0)
    got = frame.reshape(-1, 3).mean(0)
    assert np.all(np.abs(got - want) <= TOL), (episode, frame_index, cam, got, want)


def read_locator(root: Path) -> list[dict]:
    return pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()


def check_through_locator(out: Path, lengths: list[int], cams: int = 2) -> None:
    info = json.loads((out / "meta/info.json").read_text())
    eps = read_locator(out)
    assert [e["episode_index"] for e in eps] == list(range(len(lengths)))
    shards: dict[Path, list[np.ndarray]] = {}
    data: dict[Path, object] = {}
    for e, n in zip(eps, lengths, strict=False):
        assert e["length"] == n
        dpath = out / info["data_path"].format(chunk_index=e["data/chunk_index"], file_index=e["data/file_index"])
        t = data.setdefault(dpath, pq.read_table(dpath))
        idx = to_numpy(t.column("index"))
        rows = np.nonzero((idx >= e["dataset_from_index"]) & (idx < e["dataset_to_index"]))[0]
        assert len(rows) == n
        state = to_numpy(t.column("observation.state"))[rows]
        action = to_numpy(t.column("action"))[rows]
        src = e["episode_index"]
        for i in range(n):
            np.testing.assert_array_equal(state[i], state_value(src, i))
            np.testing.assert_array_equal(action[i], -state_value(src, i))
        assert to_numpy(t.column("frame_index"))[rows].tolist() == list(range(n))
        for c in range(cams):
            key = f"observation.images.cam{c}"
            vpath = out / info["video_path"].format(video_key=key, chunk_index=e[f"videos/{key}/chunk_index"],
                                                    file_index=e[f"videos/{key}/file_index"])
            frames = shards.setdefault(vpath, decode_all(vpath))
            start = round(e[f"videos/{key}/from_timestamp"] * FPS)
            assert e[f"videos/{key}/from_timestamp"] == start / FPS
            assert e[f"videos/{key}/to_timestamp"] == (start + n) / FPS
            for i in range(n):
                check_colour(frames[start + i], src, i, c)


def test_v3_several_shards_every_frame_through_the_locator(tmp_path: Path) -> None:
    lengths = [12, 20, 7, 15, 9, 11]
    src = subset(tmp_path / "src", [Ep(frames=n) for n in lengths])
    biggest = max(p.stat().st_size for p in (src / "videos").rglob("*.mp4"))
    ex = LeRobotV3Exporter(V3Options(data_file_mb=1500 / 2**20, video_file_mb=2.5 * biggest / 2**20))
    out = tmp_path / "out"
    seen: list[int] = []
    ex.export(src, out, progress=_progress(seen))
    assert seen == list(range(len(lengths)))
    data_files = sorted((out / "data").rglob("*.parquet"))
    assert len(data_files) >= 3
    for c in range(2):
        assert len(sorted((out / f"videos/observation.images.cam{c}").rglob("*.mp4"))) >= 2
    assert not list(out.rglob("episode_*.mp4"))  # no v2.1 per-episode files
    check_through_locator(out, lengths)
    report = ex.verify(out)
    assert report.ok, report.errors
    # shard numbering chunk-000/file-000, file-001, ... with no gap
    names = [p.relative_to(out).as_posix() for p in data_files]
    assert names == [f"data/chunk-000/file-{i:03d}.parquet" for i in range(len(names))]


def _progress(seen: list[int]):  # type: ignore[no-untyped-def]
    from eva_export.formats.common.exporter import Progress
    return Progress(on_episode=lambda i, b: seen.append(i))


def test_v3_ffprobe_counts_match_shard_lengths(tmp_path: Path) -> None:
    assert shutil.which("ffprobe"), "Debian ffprobe missing: tools/setup.sh installs ffmpeg"
    lengths = [10, 14, 6, 9]
    src = subset(tmp_path / "src", [Ep(frames=n) for n in lengths])
    biggest = max(p.stat().st_size for p in (src / "videos").rglob("*.mp4"))
    out = tmp_path / "out"
    LeRobotV3Exporter(V3Options(video_file_mb=2.2 * biggest / 2**20)).export(src, out)
    eps = read_locator(out)
    per_file: dict[tuple[str, int, int], int] = {}
    for e in eps:
        for c in range(2):
            key = f"observation.images.cam{c}"
            k = (key, e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"])
            per_file[k] = per_file.get(k, 0) + e["length"]
            per_file[k] = max(per_file[k], round(e[f"videos/{key}/to_timestamp"] * FPS))
    assert len(per_file) > 2
    for (key, chunk, file), frames in per_file.items():
        path = out / f"videos/{key}/chunk-{chunk:03d}/file-{file:03d}.mp4"
        res = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                              "stream=nb_read_frames", "-of", "csv=p=0", str(path)],
                             capture_output=True, text=True, check=True)
        assert int(res.stdout.strip()) == frames, (path, res.stdout)


def test_v3_metadata_matches_lerobot_fixture(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=8, task="pick the cube"), Ep(frames=6, task="place the cube"),
                                    Ep(frames=5, task="pick the cube")], cameras=1)
    out = tmp_path / "out"
    LeRobotV3Exporter().export(src, out)
    ours = json.loads((out / "meta/info.json").read_text())
    ref = json.loads((FIXTURE / "meta/info.json").read_text())
    assert list(k for k in ours if k in ref) == list(ref)  # same keys, same order
    assert set(ours) - set(ref) == {"dataset_format"}
    assert ours["codebase_version"] == "v3.0" and ours["dataset_format"] == "lerobot_v3"
    assert ours["total_episodes"] == 3 and ours["total_frames"] == 19 and ours["total_tasks"] == 2
    for key in ("data_path", "video_path", "chunks_size", "data_files_size_in_mb", "video_files_size_in_mb"):
        assert ours[key] == ref[key]
    cam = ours["features"]["observation.images.cam0"]
    assert cam["dtype"] == "video" and cam["names"] == ["height", "width", "channels"]
    assert set(cam["info"]) == set(ref["features"]["observation.images.cam"]["info"])
    # episode metadata columns: every LeRobot column (quantiles aside) with the same Arrow type
    ref_sch = pq.read_schema(FIXTURE / "meta/episodes/chunk-000/file-000.parquet")
    our_sch = pq.read_schema(out / "meta/episodes/chunk-000/file-000.parquet")
    for f in ref_sch:
        if re.search(r"/q\d\d$", f.name):
            continue  # LeRobot 0.4 quantiles; the v2.1 source has no quantile statistics
        name = f.name.replace("observation.images.cam/", "observation.images.cam0/")
        assert name in our_sch.names, name
        if not name.startswith("stats/timestamp"):
            assert our_sch.field(name).type == f.type, (name, our_sch.field(name).type, f.type)
    # tasks.parquet: task_index int64 column + task strings as the pandas index
    ref_t = pq.read_table(FIXTURE / "meta/tasks.parquet")
    our_t = pq.read_table(out / "meta/tasks.parquet")
    assert [str(f.type) for f in our_t.schema] == [str(f.type) for f in ref_t.schema]
    pm, ref_pm = (json.loads(t.schema.metadata[b"pandas"]) for t in (our_t, ref_t))
    assert pm.keys() == ref_pm.keys()
    assert [c["pandas_type"] for c in pm["columns"]] == [c["pandas_type"] for c in ref_pm["columns"]]
    assert pm["index_columns"] == ["task"]
    assert our_t.column("task").to_pylist() == ["pick the cube", "place the cube"]
    assert our_t.column("task_index").to_pylist() == [0, 1]
    assert tasks_table([(1, "b"), (0, "a")]).column("task").to_pylist() == ["a", "b"]
    # data shard schema like LeRobot's (fixed-size float32 vectors, int64 indices, 'List' metadata)
    ref_d = pq.read_schema(FIXTURE / "data/chunk-000/file-000.parquet")
    our_d = pq.read_schema(out / "data/chunk-000/file-000.parquet")
    for f in ref_d:
        assert our_d.field(f.name).type == f.type
    hf = json.loads(our_d.metadata[b"huggingface"])["info"]["features"]
    assert hf["observation.state"] == {"feature": {"dtype": "float32", "_type": "Value"}, "length": 6, "_type": "List"}
    # stats.json: every feature, cameras included, shaped like LeRobot's
    stats = json.loads((out / "meta/stats.json").read_text())
    assert set(stats) == set(ours["features"])
    assert np.asarray(stats["observation.images.cam0"]["mean"]).shape == (3, 1, 1)
    # copies kept
    for name in ("episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl"):
        assert (out / "meta" / name).read_bytes() == (src / "meta" / name).read_bytes()
    qs = QualitySplit.read(out)
    assert qs.dataset_format == "lerobot_v3" and qs.source_episode_indices == [0, 1, 2]


def test_v3_every_episode_field_survives(tmp_path: Path) -> None:
    issues = [{"code": "frame_drop", "severity": "error", "detail": "3 frames late"}]
    src = subset(tmp_path / "src", [
        Ep(frames=6, extra={"only_first": "first-only", "stream_stats": {"cam0": {"late": 0}}}),
        Ep(frames=5, quality="red", issues=issues, verdict="pass", note="operator override",
           extra={"only_second": [{"a": 1}, {"b": [2, 3]}], "source_episode_index": 7, "ratio": 0.5}),
        Ep(frames=4, verdict="fail", extra={"ratio": 2}),
    ], cameras=1)
    out = tmp_path / "out"
    LeRobotV3Exporter().export(src, out)
    rows = read_locator(out)
    source_rows = [json.loads(line) for line in (src / "meta/episodes.jsonl").read_text().splitlines()]
    assert (out / "meta/episodes.jsonl").read_text() == (src / "meta/episodes.jsonl").read_text()
    fields = {k for r in source_rows for k in r} - {"episode_index", "tasks", "length"}
    assert {"only_first", "only_second", "quality", "quality_issues", "qc_verdict", "note", "stream_stats",
            "source_episode_index", "ratio", "reviewed_at"} <= fields
    for row, srow in zip(rows, source_rows, strict=False):
        for k in fields:
            assert k in row, k
            got = row[k]
            want = srow.get(k)
            if isinstance(want, (list, dict)):
                assert isinstance(got, str) and json.loads(got) == want, (k, got)
            elif k == "ratio" and want is not None:
                assert got == float(want)
            else:
                assert got == want, (k, got, want)
    assert rows[0]["only_second"] is None and rows[1]["only_first"] is None
    assert rows[1]["qc_verdict"] == "pass" and rows[1]["quality"] == "red"
    assert json.loads(rows[1]["quality_issues"]) == issues
    assert rows[0]["source_episode_index"] is None and rows[1]["source_episode_index"] == 7
    sch = pq.read_schema(out / "meta/episodes/chunk-000/file-000.parquet")
    assert str(sch.field("source_episode_index").type) == "int64"
    assert str(sch.field("ratio").type) == "double"


def test_v3_frame_count_mismatch_aborts_naming_the_episode(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=8), Ep(frames=9), Ep(frames=7)])
    replace_video(src, "observation.images.cam1", 1, 7)
    with pytest.raises(ExportError, match=r"episode 1 \(.*episode_000001.mp4\): observation.images.cam1 video has 7 frames.*9 rows"):
        LeRobotV3Exporter().export(src, tmp_path / "out")


def test_v3_resolution_mismatch_aborts(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=5), Ep(frames=5)])
    replace_video(src, "observation.images.cam0", 1, 5, width=32, height=32)
    with pytest.raises(ExportError, match=r"episode 1 \(.*episode_000001.mp4\): observation.images.cam0 video is 32x32"):
        LeRobotV3Exporter().export(src, tmp_path / "out")


def test_v3_reencodes_only_the_mismatching_episode(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, [Ep(frames=8)], cameras=1, settings=VideoSettings(crf=10))
    make_dataset(src, [Ep(frames=6)], cameras=1, settings=VideoSettings(crf=18))  # other PPS: not joinable
    make_dataset(src, [Ep(frames=7)], cameras=1, settings=VideoSettings(crf=10))
    subset(src, [], cameras=1)
    ex = LeRobotV3Exporter(reencode_settings=VideoSettings(crf=10))
    out = tmp_path / "out"
    ex.export(src, out)
    assert ex.last_reencoded == {"observation.images.cam0": [1]}
    assert len(list((out / "videos").rglob("*.mp4"))) == 1
    check_through_locator(out, [8, 6, 7], cams=1)
    assert ex.verify(out).ok


def test_v3_starts_a_new_shard_when_reencoding_cannot_match(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, [Ep(frames=8)], cameras=1, settings=VideoSettings(preset="medium", crf=10))
    make_dataset(src, [Ep(frames=6)], cameras=1, settings=VideoSettings(crf=10))
    subset(src, [], cameras=1)
    out = tmp_path / "out"
    ex = LeRobotV3Exporter(reencode_settings=VideoSettings(crf=18))
    ex.export(src, out)
    eps = read_locator(out)
    assert [e["videos/observation.images.cam0/file_index"] for e in eps] == [0, 1]
    assert eps[1]["videos/observation.images.cam0/from_timestamp"] == 0.0
    check_through_locator(out, [8, 6], cams=1)
    assert ex.verify(out).ok


def test_v3_a_reordered_episode_past_the_probe_window_starts_a_new_shard(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard's decode clock is set from the episodes probed ahead when it opens; a later
    B-frame episode needing more lead starts a new shard, stream-copied (not re-encoded)."""
    from eva_export.formats.lerobot_v3 import probe as v3_probe

    monkeypatch.setattr(v3_probe, "PROBE_WINDOW", 2)
    lengths = [1, 2, 1, 2, 1, 30, 30]
    src = short_subset(tmp_path / "src", lengths, "libx264")
    key = "observation.images.cam0"
    for e in (5, 6):  # GOPs of 12: frames really reordered (g=2 has none to reorder)
        encode_bframes(src / f"videos/chunk-000/{key}/episode_{e:06d}.mp4",
                       [textured(e, i, 64, 48) for i in range(30)], FPS, "libx264", gop=12)
    leads = [v3_probe.probe(p, FPS, keep=False) for p in sorted((src / "videos").rglob("*.mp4"))]
    assert [p.lead_frames > 0 for p in leads if p is not None] == [False] * 5 + [True] * 2
    out = tmp_path / "out"
    ex = LeRobotV3Exporter()
    ex.export(src, out)
    assert ex.last_reencoded == {}
    eps = read_locator(out)
    assert [e[f"videos/{key}/file_index"] for e in eps] == [0] * 5 + [1] * 2
    rep = ex.verify(out)
    assert rep.ok, rep.errors
    shards = {i: decode_all(out / f"videos/{key}/chunk-000/file-{i:03d}.mp4") for i in (0, 1)}
    for e, n in zip(eps, lengths, strict=True):
        start = round(e[f"videos/{key}/from_timestamp"] * FPS)
        want = list(iter_frames(src / f"videos/chunk-000/{key}/episode_{e['episode_index']:06d}.mp4"))
        for i in range(n):
            np.testing.assert_array_equal(shards[e[f"videos/{key}/file_index"]][start + i], want[i])


# ---- very short B-frame episodes anywhere in a shard --------------------------------
SHORT_CASES = [[1, 25], [1, 30, 30], [30, 1, 30], [30, 30, 1], [2, 30], [30, 2, 30], [30, 30, 2], [1, 2, 1]]


@pytest.mark.parametrize("codec", ["libx264", "libx265"])
@pytest.mark.parametrize("lengths", SHORT_CASES, ids=lambda v: "-".join(map(str, v)))
def test_v3_short_bframe_episodes_join_pixel_exact(tmp_path: Path, codec: str, lengths: list[int]) -> None:
    """LeRobot's H.264/HEVC episodes decode from below zero, 1- and 2-frame ones do not: joined
    as they were, decode times went 0 -> 0, the shard lasted a frame short of to_timestamp, or
    the muxer refused it. Every frame must come back as the source episode's decoded frame."""
    assert codec in av.codecs_available
    src = short_subset(tmp_path / "src", lengths, codec)
    out = tmp_path / "out"
    ex = LeRobotV3Exporter()
    ex.export(src, out)
    assert ex.last_reencoded == {}  # every episode placed by stream copy
    rep = ex.verify(out)
    assert rep.ok, rep.errors
    key = "observation.images.cam0"
    (shard,) = sorted((out / "videos" / key).rglob("*.mp4"))
    t = stream_timing(shard)
    assert all(b > a for a, b in zip(t.dts, t.dts[1:], strict=False)), t.dts[:6]
    assert sorted(t.pts) == [Fraction(i, FPS) for i in range(sum(lengths))]
    eps = read_locator(out)
    assert t.duration is not None and abs(t.duration - Fraction(sum(lengths), FPS)) < Fraction(1, 10000)
    assert abs(float(t.duration) - eps[-1][f"videos/{key}/to_timestamp"]) < 1e-4
    with av.open(str(shard)) as c:
        assert c.streams.video[0].average_rate == FPS  # what torchcodec turns timestamps into indices with
    frames = decode_all(shard)
    for e, n in zip(eps, lengths, strict=True):
        start = round(e[f"videos/{key}/from_timestamp"] * FPS)
        want = list(iter_frames(src / f"videos/chunk-000/{key}/episode_{e['episode_index']:06d}.mp4"))
        assert len(want) == n
        for i in range(n):
            np.testing.assert_array_equal(frames[start + i], want[i])
