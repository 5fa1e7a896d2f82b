"""Bag ingest: bags written by `rosbags` (not our code) become the episodes live capture
makes of the same messages; bad bags are refused or marked, never silently lost."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from bag_helpers import LiveFeed, Recorded, make_config, offline, string_msg, write_bag, write_config

from eva_export import faults
from eva_export.capture.ingest import BagIngest, IngestError
from eva_export.capture.recorder import Recorder


def rows_of(root: Path) -> list[dict]:
    p = root / "meta" / "episodes.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def table(root: Path, i: int) -> dict:
    return pq.read_table(root / f"data/chunk-000/episode_{i:06d}.parquet").to_pydict()


def frames(root: Path, cam: str, i: int) -> list[np.ndarray]:
    path = root / f"videos/chunk-000/observation.images.{cam}/episode_{i:06d}.mp4"
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_ingested_bag_equals_live_capture_of_the_same_messages(tmp_path):
    col = make_config(tmp_path)
    rec = Recorder(col)
    try:
        feed = LiveFeed(rec, 2.6).start()
        time.sleep(0.7)
        assert rec.start("live").ok
        ep = rec._episode
        time.sleep(1.5)
        stop = rec.stop()
        assert stop.ok and stop.frames > 30, stop
        assert rec.wait_saved(60)
        assert feed.done.wait(30)
    finally:
        rec.close()
    bag = write_bag(tmp_path / "bag", feed.recorded)
    first = min(r.log_ns for r in feed.recorded) * 1e-9
    res = BagIngest(col, bag, "bag", episodes=f"ranges:{ep.start - first:.9f}-{ep.t_stop - first:.9f}").run()
    assert res.episodes_done == 1 and res.messages_done == len(feed.recorded) and not res.damage
    live, ing = col.dataset_dir("live"), col.dataset_dir("bag")
    (lr,), (ir,) = rows_of(live), rows_of(ing)
    assert lr["quality"] == ir["quality"] == "green", (lr, ir)
    assert lr["length"] == ir["length"] == stop.frames
    assert lr["stream_stats"].keys() == ir["stream_stats"].keys()
    for name, st in lr["stream_stats"].items():
        for key in ("dropped", "late", "time_base"):
            assert st[key] == ir["stream_stats"][name][key], (name, key, st, ir["stream_stats"][name])
        # messages counted in the window: the ranges cut is given in seconds (9 decimals) while
        # the live STOP cut is the worker's own clock reading, so one message of the 100 Hz
        # streams can land on either side of the edge; rows, values and frames stay exact below
        assert abs(st["received"] - ir["stream_stats"][name]["received"]) <= 1, (name, st, ir["stream_stats"][name])
    lt, it = table(live, 0), table(ing, 0)
    assert lt.keys() == it.keys()
    for key in lt:
        if key == "capture_time":  # seconds since START: START is a float on both sides
            assert np.allclose(lt[key], it[key], atol=1e-6)
        else:
            assert lt[key] == it[key], key  # value by value
    # the vectors are the published ones (state reordered by name, action, pose)
    state = np.array(lt["observation.state"])
    assert np.allclose(state[:, 1] - state[:, 0], 0.25) and np.allclose(state[:, 2] - state[:, 0], 0.5)
    for cam in ("front", "wrist"):  # frame by frame
        lf, inf = frames(live, cam, 0), frames(ing, cam, 0)
        assert len(lf) == len(inf) == stop.frames
        assert all(np.array_equal(a, b) for a, b in zip(lf, inf, strict=True)), cam
    assert ir["ingest_source"]["bag"] == str(bag.resolve())


def test_truncated_bag_is_read_up_to_the_damage_and_marked_red(tmp_path):
    col = make_config(tmp_path)
    bag = write_bag(tmp_path / "bag", offline(8.0))  # about 3 chunks of 1 MiB
    mcap = next(bag.glob("*.mcap"))
    data = mcap.read_bytes()
    mcap.write_bytes(data[: int(len(data) * 0.8)])  # the recorder was killed: a cut chunk, no summary
    res = BagIngest(col, bag, "bag").run()
    assert res.damage and "damaged" in res.damage
    (row,) = rows_of(col.dataset_dir("bag"))
    assert row["quality"] == "red"
    codes = [i["code"] for i in row["quality_issues"]]
    assert "source_damaged" in codes, row["quality_issues"]
    assert 30 < row["length"] < 235  # what was before the damage is kept
    assert len(frames(col.dataset_dir("bag"), "front", 0)) == row["length"]


def test_marker_cutting_resume_and_append(tmp_path):
    col = make_config(tmp_path, marker="/marker")
    rec = offline(4.0)
    t0 = rec[0].log_ns
    marks = [(0.5, "start"), (1.5, "stop"), (2.0, "start"), (3.5, "stop")]
    rec += [Recorded(t0 + int(s * 1e9), "/marker", string_msg(w)) for s, w in marks]
    rec.sort(key=lambda r: r.log_ns)
    bag = write_bag(tmp_path / "bag", rec, {"/marker": "std_msgs/msg/String"})
    res = BagIngest(col, bag, "bag", episodes="marker").run()
    assert res.episodes_done == 2, res
    rows = rows_of(col.dataset_dir("bag"))
    assert [r["episode_index"] for r in rows] == [0, 1]
    assert abs(rows[0]["length"] - 30) <= 2 and abs(rows[1]["length"] - 45) <= 2, [r["length"] for r in rows]
    assert all(r["quality"] == "green" for r in rows), rows
    # episode 1 starts 2.0 s into the bag (state n = 200 at 100 Hz), on the first camera frame
    # after every stream delivered (the aligner's t0 rule, the same as live)
    assert 200 <= table(col.dataset_dir("bag"), 1)["observation.state"][0][0] <= 206
    # a re-run resumes: both episodes were committed, nothing is written twice
    again = BagIngest(col, bag, "bag", episodes="marker").run()
    assert again.episodes_done == 0 and again.episodes_skipped == 2
    # another bag appends to the existing dataset
    other = write_bag(tmp_path / "other", offline(1.0, t0=1_800_000_000.0))
    assert BagIngest(col, other, "bag").run().episodes_done == 1
    rows = rows_of(col.dataset_dir("bag"))
    assert [r["episode_index"] for r in rows] == [0, 1, 2]
    assert table(col.dataset_dir("bag"), 2)["index"][0] == rows[0]["length"] + rows[1]["length"]


def test_bad_bags_are_refused_with_a_reason_and_nothing_written(tmp_path):
    from mcap.writer import Writer as McapWriter
    from rosbags.rosbag2 import StoragePlugin, Writer

    col = make_config(tmp_path)
    # sqlite3 storage (the rosbag2 default before Iron)
    with Writer(tmp_path / "db3bag", version=9, storage_plugin=StoragePlugin.SQLITE3):
        pass
    with pytest.raises(IngestError, match="ros2 bag convert"):
        BagIngest(col, tmp_path / "db3bag", "bag")
    # an eva-client MCAP (MessagePack, not a bag)
    with open(tmp_path / "export.mcap", "wb") as fh:
        w = McapWriter(fh)
        w.start(profile="eva-client", library="test")
        w.finish()
    with pytest.raises(IngestError, match="not a ROS 2 bag"):
        BagIngest(col, tmp_path / "export.mcap", "bag")
    # a configured topic missing from the bag, and a type mismatch: both name the topic
    rec = [r for r in offline(1.0) if r.topic != "/p"]
    bag = write_bag(tmp_path / "nopose", rec, {"/p": "std_msgs/msg/String"})
    with pytest.raises(IngestError, match="topic /p .*std_msgs/msg/String"):
        BagIngest(col, bag, "bag")
    bag2 = tmp_path / "missing"
    from bag_helpers import TOPICS

    with Writer(bag2, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        from bag_helpers import TS
        for t, ty in TOPICS.items():
            if t != "/w":
                w.add_connection(t, ty, typestore=TS)
    with pytest.raises(IngestError, match="topic /w "):
        BagIngest(col, bag2, "bag")
    with pytest.raises(IngestError, match="does not exist"):
        BagIngest(col, tmp_path / "nothing", "bag")
    assert not (col.dataset_dir("bag") / "meta").exists()


def test_cli_ingest(tmp_path):
    col = make_config(tmp_path)
    cfg = write_config(tmp_path)
    bag = write_bag(tmp_path / "bag", offline(2.0))
    out = subprocess.run([sys.executable, "-m", "eva_export.cli", "ingest", str(bag), "--config", str(cfg),
                          "--dataset", "bag", "--episodes", "ranges:0.2-0.9,1.0-1.8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert [e["index"] for e in res["episodes"]] == [0, 1]
    rows = rows_of(col.dataset_dir("bag"))
    assert [abs(r["length"] - n) <= 1 for r, n in zip(rows, (21, 24), strict=True)] == [True, True], rows
    bad = subprocess.run([sys.executable, "-m", "eva_export.cli", "ingest", str(tmp_path / "none"), "--config",
                          str(cfg), "--dataset", "bag"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_marker_is_the_capture_nodes_own_status_topic(tmp_path):
    from bag_helpers import register_eva_types, status_msg

    register_eva_types()
    col = make_config(tmp_path)  # no marker topic configured: the CaptureStatus topic is found by type
    rec = offline(3.0)
    t0 = rec[0].log_ns
    states = ["IDLE"] * 2 + ["RECORDING"] * 3 + ["SAVING", "IDLE", "IDLE"]  # 2 Hz: 1.0 s to 2.5 s recording
    rec += [Recorded(t0 + int(k * 0.5e9), "/eva/capture/status", status_msg(s)) for k, s in enumerate(states)]
    rec.sort(key=lambda r: r.log_ns)
    bag = write_bag(tmp_path / "bag", rec, {"/eva/capture/status": "eva_export_interfaces/msg/CaptureStatus"})
    res = BagIngest(col, bag, "bag", episodes="marker").run()
    assert res.episodes_done == 1, res
    (row,) = rows_of(col.dataset_dir("bag"))
    assert abs(row["length"] - 45) <= 2 and row["quality"] == "green", row
    with pytest.raises(IngestError, match="marker"):
        BagIngest(col, write_bag(tmp_path / "plain", offline(1.0)), "bag", episodes="marker")


def test_killed_ingest_resumes_per_episode_without_duplicates(tmp_path):
    import os
    import signal

    cfg = write_config(tmp_path, marker="/marker")
    col = make_config(tmp_path, marker="/marker")
    rec = offline(6.0)
    t0 = rec[0].log_ns
    marks = [(0.3, "start"), (1.8, "stop"), (2.2, "start"), (3.6, "stop"), (4.0, "start"), (5.5, "stop")]
    rec += [Recorded(t0 + int(s * 1e9), "/marker", string_msg(w)) for s, w in marks]
    rec.sort(key=lambda r: r.log_ns)
    bag = write_bag(tmp_path / "bag", rec, {"/marker": "std_msgs/msg/String"})
    cmd = [sys.executable, "-m", "eva_export.cli", "ingest", str(bag), "--config", str(cfg), "--dataset", "bag",
           "--episodes", "marker"]
    proc = subprocess.Popen(cmd, env={**os.environ, **faults.env(save_delay="2.0")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = col.dataset_dir("bag")
    end = time.monotonic() + 120
    while time.monotonic() < end and not rows_of(root):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # during the second episode's save (2 s each)
    proc.wait(30)
    assert len(rows_of(root)) == 1
    res = BagIngest(col, bag, "bag", episodes="marker").run()  # the re-run recovers and resumes
    assert res.episodes_skipped == 1 and res.episodes_done == 2, res
    rows = rows_of(root)
    assert [r["episode_index"] for r in rows] == [0, 1, 2]
    assert [r["ingest_source"]["episode"] for r in rows] == [0, 1, 2]
    staging = root / ".staging"
    assert not staging.exists() or not any(staging.iterdir())  # the killed save left nothing visible
    # the same episodes an uninterrupted ingest gives
    col2 = make_config(tmp_path, marker="/marker", log_dir="logs2")
    whole = BagIngest(col2, bag, "bag", episodes="marker").run()
    assert [e["frames"] for e in whole.episodes] == [r["length"] for r in rows]
    for i in range(3):
        assert table(root, i)["observation.state"] == table(col2.dataset_dir("bag"), i)["observation.state"]
