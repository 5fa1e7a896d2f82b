"""Our v2.1 writer's output against a dataset written by LeRobot 0.3.3 itself, field by field.

The reference (tests/fixtures/lerobot-written/v21) has the same state/action layout; our
dataset adds capture_time and quality fields, which LeRobot ignores (checked separately with
LeRobot's reader, see docs/lerobot-check.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from dsfactory import Ep, make_dataset

from eva_export.fsutil import iter_jsonl, read_json

REF = Path(__file__).resolve().parent / "fixtures" / "lerobot-written" / "v21"


def ours(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "raw", [Ep(frames=12), Ep(frames=9, task="place the cube")], cameras=1)


def test_info_json_matches_lerobot(tmp_path: Path) -> None:
    root = ours(tmp_path)
    ref, mine = read_json(REF / "meta/info.json"), read_json(root / "meta/info.json")
    assert list(mine) == list(ref)  # same keys, same order
    assert mine["codebase_version"] == "v2.1" and mine["data_path"] == ref["data_path"]
    assert mine["video_path"] == ref["video_path"] and mine["chunks_size"] == ref["chunks_size"]
    assert (mine["total_episodes"], mine["total_frames"], mine["total_tasks"], mine["total_videos"]) == (2, 21, 2, 2)
    assert mine["splits"] == {"train": "0:2"} and mine["total_chunks"] == 1
    for key in ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert mine["features"][key]["dtype"] == ref["features"][key]["dtype"], key
        assert mine["features"][key]["shape"] == ref["features"][key]["shape"], key
    cam_ref = ref["features"]["observation.images.cam"]
    cam = mine["features"]["observation.images.cam0"]
    assert cam["dtype"] == "video" and cam["names"] == cam_ref["names"]
    assert set(cam["info"]) == set(cam_ref["info"])
    assert cam["info"]["video.pix_fmt"] == "yuv420p" and cam["info"]["video.codec"] == "h264"
    assert mine["features"]["capture_time"] == {"dtype": "float64", "shape": [1], "names": None}


def test_parquet_schema_matches_lerobot(tmp_path: Path) -> None:
    root = ours(tmp_path)
    ref = pq.read_schema(REF / "data/chunk-000/episode_000000.parquet")
    mine = pq.read_schema(root / "data/chunk-000/episode_000001.parquet")
    for name in ref.names:
        assert mine.field(name).type == ref.field(name).type, name
    assert mine.names == [n for n in mine.names if n in ref.names or n == "capture_time"]
    hf_ref = json.loads(ref.metadata[b"huggingface"])["info"]["features"]
    hf = json.loads(mine.metadata[b"huggingface"])["info"]["features"]
    assert {k: hf[k] for k in hf_ref} == hf_ref
    t = pq.read_table(root / "data/chunk-000/episode_000001.parquet")
    assert t.column("index").to_pylist() == list(range(12, 21))
    assert t.column("episode_index").to_pylist() == [1] * 9 and t.column("task_index").to_pylist() == [1] * 9
    assert t.column("timestamp").to_pylist() == [float(np.float32(i / 30)) for i in range(9)]


def test_meta_jsonl_match_lerobot(tmp_path: Path) -> None:
    root = ours(tmp_path)
    ref_ep = next(iter_jsonl(REF / "meta/episodes.jsonl"))
    for row in iter_jsonl(root / "meta/episodes.jsonl"):
        assert set(ref_ep) <= set(row) and isinstance(row["tasks"], list)
    assert list(iter_jsonl(root / "meta/tasks.jsonl")) == [
        {"task_index": 0, "task": "pick the cube"}, {"task_index": 1, "task": "place the cube"}]
    ref_stats = next(iter_jsonl(REF / "meta/episodes_stats.jsonl"))["stats"]
    stats = next(iter_jsonl(root / "meta/episodes_stats.jsonl"))["stats"]
    for key, ref_st in ref_stats.items():
        key = "observation.images.cam0" if key == "observation.images.cam" else key
        assert set(ref_st) <= set(stats[key]), key
        for stat in ("min", "max", "mean", "std"):
            assert np.asarray(stats[key][stat]).shape == \
                np.asarray(ref_st[stat]).shape, (key, stat)
    assert stats["index"]["count"] == [12] and stats["observation.images.cam0"]["mean"][0][0][0] <= 1.0
