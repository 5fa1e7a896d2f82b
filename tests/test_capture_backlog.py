"""A take is saved under the index its STOP reply promised, whatever the save backlog.

The save worker is held by the capture's save seam (the fault point ``save_hold`` set to a directory: before
each save it creates ``held-<index>`` and waits on the FIFO ``release``), so several takes queue
behind it for sure. Each test then checks the promise: every STOP reply's index is the index the
take is saved under (the row's length equals the reply's frame count), reviews by those indices
land on those takes, a failed save in the queue is retried while the takes behind it wait (no
index moves), and a node killed with takes queued reports every promised index it lost; a review
naming a lost take's id is then refused at its index, which the next take holds.
Real capture and teleop_sim processes, real service calls."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from capture_helpers import (
    episode_rows,
    read_table,
    relaunch,
    start_pair,
    video_path,
    wait_episodes,
    wait_receiving,
    write_config,
)

from eva_export import faults
from eva_export.formats.lerobot_v21.promises import LOST

pytestmark = pytest.mark.timeout(300)

# takes of different lengths, so a row's length tells which take it holds
SECONDS = (1.0, 1.6, 2.2, 2.8)


def hold_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hold"
    d.mkdir()
    os.mkfifo(d / "release")
    return d


def wait_held(hold: Path, index: int, attempt: int = 1, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not (hold / f"held-{index}-{attempt}").exists():
        assert time.monotonic() < end, f"the save of episode {index} (attempt {attempt}) was never held"
        time.sleep(0.05)


def release(hold: Path, index: int, word: str = "go", attempt: int = 1, timeout: float = 60.0) -> None:
    """Let a held save attempt go on (or fail): wait until the worker holds it, then answer."""
    wait_held(hold, index, attempt, timeout)
    end = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(hold / "release", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # no reader yet: the worker is between the marker and the FIFO
            assert exc.errno == errno.ENXIO and time.monotonic() < end, exc
            time.sleep(0.02)
    try:
        os.write(fd, word.encode())
    finally:
        os.close(fd)


def take(ros_client: Any, cap: Any, seconds: float) -> Any:
    from eva_export_interfaces.srv import StartCapture, StopCapture

    r = ros_client.call(StartCapture, cap.service("start"), StartCapture.Request(), timeout=15)
    assert r.success, r.message
    ros_client.spin_for(seconds)
    stop = ros_client.call(StopCapture, cap.service("stop"), timeout=30)
    assert stop.success and stop.episode_index >= 0 and stop.frames > 0, stop.message
    assert f"as episode {stop.episode_index}" in stop.message
    assert stop.take_id and f"(take {stop.take_id})" in stop.message, stop.message
    return stop


def review(ros_client: Any, cap: Any, index: int, verdict: str, note: str, take_id: str = "") -> Any:
    from eva_export_interfaces.srv import ReviewEpisode

    req = ReviewEpisode.Request(episode_index=index, verdict=verdict, note=note, set_note=True, take_id=take_id)
    return ros_client.call(ReviewEpisode, cap.service("review"), req, timeout=15)


def backlog(tmp_path: Path, node_factory: Any, ros_client: Any, monkeypatch: Any) -> tuple[Any, Any, Path, Path]:
    cfg = write_config(tmp_path, cameras=("front",))
    hold = hold_dir(tmp_path)
    monkeypatch.setenv(faults.ENV, faults.spec(save_hold=str(hold)))
    cap, sim = start_pair(node_factory, ros_client, cfg)
    monkeypatch.delenv(faults.ENV)
    wait_receiving(ros_client, cap)
    return cap, sim, hold, tmp_path / "datasets" / "pick" / "raw"


def assert_saved_as_promised(root: Path, stops: dict[int, Any]) -> None:
    """Every listed row is the take its index was promised to: same length, table and video."""
    rows = {r["episode_index"]: r for r in episode_rows(root)}
    assert sorted(rows) == sorted(stops), (sorted(rows), sorted(stops))
    for index, stop in stops.items():
        assert rows[index]["length"] == stop.frames, (index, rows[index]["length"], stop.frames)
        assert len(read_table(root, index)["episode_index"]) == stop.frames
        assert set(read_table(root, index)["episode_index"].tolist()) == {index}
        assert video_path(root, "observation.images.front", index).is_file()


def test_queued_takes_keep_the_index_stop_returned(tmp_path, node_factory, ros_client, monkeypatch):
    cap, sim, hold, root = backlog(tmp_path, node_factory, ros_client, monkeypatch)
    stops = [take(ros_client, cap, s) for s in SECONDS]  # the first save is held: three queue behind it
    assert [s.episode_index for s in stops] == [0, 1, 2, 3]
    assert [s.save_queue_depth for s in stops] == [1, 2, 3, 4]
    assert len({s.frames for s in stops}) == len(stops)
    # a review of a take still waiting is refused with the reason, and touches nothing
    early = review(ros_client, cap, 2, "fail", "too early")
    assert not early.success and "still being saved" in early.message, early.message
    for s in stops:
        release(hold, s.episode_index)
    wait_episodes(ros_client, cap, len(stops))
    assert_saved_as_promised(root, {s.episode_index: s for s in stops})
    verdicts = {stops[1].episode_index: ("fail", "operator dropped the cube"),
                stops[3].episode_index: ("pass", "fine")}
    for index, (verdict, note) in verdicts.items():
        r = review(ros_client, cap, index, verdict, note)
        assert r.success and r.episode.episode_index == index, r.message
    rows = {r["episode_index"]: r for r in episode_rows(root)}
    for index, row in rows.items():
        want = verdicts.get(index)
        assert row.get("qc_verdict") == (want[0] if want else None), row
        assert row.get("note", "") == (want[1] if want else ""), row
    assert rows[1]["length"] == stops[1].frames  # the failed take is the one the operator failed
    assert cap.stop() == 0, cap.log_tail()
    assert sim.alive()


def test_failed_save_is_retried_and_the_takes_behind_keep_their_indices(tmp_path, node_factory, ros_client,
                                                                         monkeypatch):
    from eva_export_interfaces.msg import CaptureStatus

    cap, sim, hold, root = backlog(tmp_path, node_factory, ros_client, monkeypatch)
    stops = [take(ros_client, cap, s) for s in SECONDS[:3]]
    assert [s.episode_index for s in stops] == [0, 1, 2]
    release(hold, 0, "fail")  # the disk is full for the first save: nothing behind it moves
    wait_held(hold, 0, attempt=2)  # held again: the take is kept and retried
    status = ros_client.wait_for_message(CaptureStatus, cap.topic("status"), timeout=10)
    assert "saving episode 0 failed, retrying" in status.last_message and "2 take(s) wait" in status.last_message, \
        status.last_message
    assert status.save_queue_depth == 3
    assert not (root / "meta" / "episodes.jsonl").exists() or episode_rows(root) == []
    refused = review(ros_client, cap, 1, "fail", "")
    assert not refused.success and "still being saved" in refused.message, refused.message
    release(hold, 0, attempt=2)  # space is back
    release(hold, 1)
    release(hold, 2)
    wait_episodes(ros_client, cap, 3)
    assert_saved_as_promised(root, {s.episode_index: s for s in stops})
    assert not (root / LOST).exists()
    assert review(ros_client, cap, 2, "fail", "wrong grasp").success
    assert [r.get("qc_verdict") for r in episode_rows(root)] == [None, None, "fail"]
    assert cap.stop() == 0, cap.log_tail()
    assert sim.alive()


def test_kill_with_queued_takes_reports_every_promised_index(tmp_path, node_factory, ros_client, monkeypatch):
    from eva_export_interfaces.msg import CaptureStatus

    cap, sim, hold, root = backlog(tmp_path, node_factory, ros_client, monkeypatch)
    first = take(ros_client, cap, SECONDS[0])
    release(hold, 0)
    wait_episodes(ros_client, cap, 1)
    stops = [take(ros_client, cap, s) for s in SECONDS[1:]]  # held at the first, two behind it
    assert [s.episode_index for s in stops] == [1, 2, 3]
    wait_held(hold, 1)
    os.killpg(cap.pid, signal.SIGKILL)
    cap.stop()
    cap2 = relaunch(node_factory, ros_client, cap, tmp_path / "capture.yaml")
    wait_receiving(ros_client, cap2)
    log = cap2.log_text()
    for index in (1, 2, 3):  # every promised index the kill lost is reported ...
        assert f"episode {index} (take " in log and "promised but lost" in log, cap2.log_tail()
    lost_lines = [json.loads(line) for line in (root / LOST).read_text().splitlines()]
    assert [d["episode_index"] for d in lost_lines] == [1, 2, 3]
    assert [d["take_id"] for d in lost_lines] == [s.take_id for s in stops]
    assert len({first.take_id, *(s.take_id for s in stops)}) == 4  # one id per take
    assert_saved_as_promised(root, {0: first})
    for index in (1, 2, 3):  # ... and a review aimed at one is refused, not applied elsewhere
        r = review(ros_client, cap2, index, "fail", "")
        assert not r.success and "process ended" in r.message, r.message
    assert review(ros_client, cap2, 0, "pass", "kept").success
    nxt = take(ros_client, cap2, 1.0)  # raw indices stay 0..n-1: the next take is episode 1
    assert nxt.episode_index == 1 and nxt.take_id not in {first.take_id, *(s.take_id for s in stops)}
    wait_episodes(ros_client, cap2, 2)
    assert_saved_as_promised(root, {0: first, 1: nxt})
    assert [r.get("take_id") for r in episode_rows(root)] == [first.take_id, nxt.take_id]
    for _ in range(20):  # the status names the saved take (published twice a second)
        status = ros_client.wait_for_message(CaptureStatus, cap2.topic("status"), timeout=10)
        if status.last_episode_index == 1:
            break
    assert (status.last_episode_index, status.last_take_id) == (1, nxt.take_id), status
    lost_take = stops[0].take_id  # STOP promised it episode 1 too: a verdict for it must not land on nxt
    before = episode_rows(root)[1]
    r = review(ros_client, cap2, 1, "fail", "meant for the lost take", lost_take)
    assert not r.success, r.message
    assert f"episode 1 holds take {nxt.take_id}, not {lost_take}: take {lost_take} was lost: the process " \
           f"ended" in r.message, r.message
    assert episode_rows(root)[1] == before and "reviewed_at" not in before  # untouched
    r = review(ros_client, cap2, 1, "", "the new take", nxt.take_id)
    assert r.success and (r.episode.episode_index, r.episode.take_id) == (1, nxt.take_id), r.message
    assert episode_rows(root)[1]["note"] == "the new take"
    assert [r.get("qc_verdict") for r in episode_rows(root)] == ["pass", None]
    assert cap2.stop() == 0, cap2.log_tail()
    # the CLI (no node running) names the lost take too, and rates nothing
    cli = subprocess.run([sys.executable, "-m", "eva_export.cli", "review", str(root), "--episodes", "3",
                          "--verdict", "fail"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "episode 3 was never saved: the process ended" in cli.stderr, cli.stderr
    cli = subprocess.run([sys.executable, "-m", "eva_export.cli", "review", str(root), "--episodes", "1",
                          "--verdict", "fail", "--take-id", lost_take], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and f"episode 1 holds take {nxt.take_id}, not {lost_take}" in cli.stderr, cli.stderr
    assert [r.get("qc_verdict") for r in episode_rows(root)] == ["pass", None]
    assert sim.alive()
