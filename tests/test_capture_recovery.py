"""Start-up recovery: a process killed in the middle of a save (at every write of the commit),
then a fresh capture node: before any START, the dataset on disk is consistent (no stray
episode files, no temp files, no empty .staging, meta files agree, same file modes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rosharness
from capture_helpers import DDS_ENV, check_dataset, episode_rows, write_config

pytestmark = pytest.mark.timeout(240)

# A real process records two episodes through the capture core and dies (os._exit, as hard as
# kill -9: no clean-up runs) at one write of the second episode's commit.
CRASH = r'''
import os, sys, threading, time
import numpy as np
from eva_export.config import load_config
from eva_export.capture import recorder as R
from eva_export.formats.lerobot_v21 import writer as W

cfg, point = sys.argv[1], sys.argv[2]
armed = [False]

def die(path):
    tmp = path.parent / f".{path.name}.killed.tmp"  # what an interrupted atomic write leaves
    tmp.write_text("partial")
    os._exit(9)

real_jsonl, real_json, real_rename = W.atomic_write_jsonl, W.atomic_write_json, os.rename
def jsonl(path, rows):
    if armed[0] and path.name == point:
        die(path)
    return real_jsonl(path, rows)
def js(path, obj):
    if armed[0] and path.name == point:
        die(path)
    return real_json(path, obj)
renames = [0]
def rename(src, dst):
    real_rename(src, dst)
    renames[0] += armed[0]
    if armed[0] and point == "rename" and renames[0] == 2:
        os._exit(9)  # the Parquet and one MP4 are in place, the rest still in staging
W.atomic_write_jsonl, W.atomic_write_json, os.rename = jsonl, js, rename

col = load_config(cfg).collection
rec = R.Recorder(col)
stop = threading.Event()
def feed():
    n = 0
    t0 = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        for i, s in enumerate(rec.streams):
            if s.is_camera:
                if n % 3 == 0:
                    img = np.full((s.height, s.width, 3), n % 255, np.uint8)
                    rec.offer(i, now, now + 1000.0, R.RawImage(img.reshape(-1), s.height, s.width, "rgb8", s.width * 3))
            else:
                stamp = now + 1000.0 if s.msg_type == "JointState" else None
                rec.offer(i, now, stamp, R.RawVector(np.arange(len(s.names), dtype=float) + n, s.names))
        n += 1
        time.sleep(max(0.0, t0 + n * 0.01 - time.monotonic()))
threading.Thread(target=feed, daemon=True).start()
time.sleep(0.3)
for k in range(2):
    assert rec.start().ok
    time.sleep(1.0)
    armed[0] = k == 1
    assert rec.stop().ok
    assert rec.wait_saved(60)
print("not killed", flush=True)
os._exit(3)
'''

POINTS = ["journal.json", "rename", "episodes_stats.jsonl", "episodes.jsonl", "info.json", "stats.json"]


def data_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for top in ("data", "videos") if (root / top).is_dir()
            for p in (root / top).rglob("*") if p.is_file()}


def named_files(root: Path) -> set[str]:
    info = json.loads((root / "meta" / "info.json").read_text())
    keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    out = set()
    for r in episode_rows(root):
        i, chunk = r["episode_index"], r["episode_index"] // info["chunks_size"]
        out.add(info["data_path"].format(episode_chunk=chunk, episode_index=i))
        out |= {info["video_path"].format(episode_chunk=chunk, video_key=k, episode_index=i) for k in keys}
    return out


@pytest.mark.parametrize("point", POINTS)
def test_node_start_recovers_a_save_killed_at_every_write(tmp_path, node_factory, ros_client, point):
    cfg = write_config(tmp_path, width=64, height=48)
    root = tmp_path / "datasets" / "pick" / "raw"
    env = {**os.environ, "PYTHONPATH": f"{rosharness.REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    crash = subprocess.run([sys.executable, "-c", CRASH, str(cfg), point], env=env, capture_output=True,
                           text=True, timeout=180)
    assert crash.returncode == 9, crash.stdout + crash.stderr
    committed = point != "journal.json"  # the journal is the commit point
    assert any(root.rglob(".*.tmp")) or point == "rename"
    if point in ("episodes_stats.jsonl", "episodes.jsonl"):
        assert data_files(root) != named_files(root)  # the crash left unlisted episode files
    if point == "info.json":  # info.json still counts one episode where two are listed
        assert json.loads((root / "meta" / "info.json").read_text())["total_episodes"] == 1
        assert len(episode_rows(root)) == 2

    cap = node_factory("capture_node", env=DDS_ENV, params={"config_file": str(cfg)})
    ros_client.wait_for_services([cap.service("list_episodes")], procs=[cap])
    # no START was sent: the node recovered the dataset before serving anything
    from eva_export_interfaces.srv import ListEpisodes

    listed = ros_client.call(ListEpisodes, cap.service("list_episodes"), ListEpisodes.Request(), timeout=15)
    rows = episode_rows(root)
    assert [e.episode_index for e in listed.episodes] == [r["episode_index"] for r in rows]
    assert len(rows) == (2 if committed else 1)
    assert data_files(root) == named_files(root), "stray files must be parked in .orphans"
    assert not list(root.rglob("*.tmp")), list(root.rglob("*.tmp"))
    assert not (root / ".staging").exists()
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == len(rows)
    assert info["total_frames"] == sum(r["length"] for r in rows)
    stats_rows = [json.loads(x) for x in (root / "meta" / "episodes_stats.jsonl").read_text().splitlines() if x]
    assert sorted(s["episode_index"] for s in stats_rows) == [r["episode_index"] for r in rows]
    data_mode = (root / next(iter(named_files(root)))).stat().st_mode & 0o777
    for name in ("info.json", "episodes.jsonl", "episodes_stats.jsonl", "tasks.jsonl", "stats.json"):
        assert (root / "meta" / name).stat().st_mode & 0o777 == data_mode, name
    assert check_dataset(root) == []
    if not committed:
        assert not (root / ".orphans").exists() or not any((root / ".orphans").rglob("*.parquet"))
