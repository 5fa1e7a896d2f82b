"""A deaf start-up heals itself: the capture node restarts itself on a further DDS participant id.

The deaf restart after a kill -9 (Fast DDS's stale shared-memory port, about 1 restart in 100
here) cannot be produced on demand, so the fault point deaf_intake (eva_export/faults.py) makes the first
generation of subscriptions listen on topics nobody publishes and serve under names nobody
calls: the same state the node sees (publishers on the graph, nothing received, no request). Real nodes in separate processes, real service
calls; the heal is triggered by the node's own check, not by time in the test."""

from __future__ import annotations

import json
import re
import time

import rosharness
from capture_helpers import DDS_ENV, episode_rows, record, wait_episodes, wait_receiving, write_config

from eva_export import faults


def test_deaf_first_participant_is_replaced_and_records(tmp_path, node_factory, ros_client):
    cfg = write_config(tmp_path, cameras=("front",))
    ns = rosharness.unique_namespace()
    cap = node_factory("capture_node", namespace=ns, env={**DDS_ENV, **faults.env(deaf_intake="1")},
                       params={"config_file": str(cfg)})
    sim = node_factory("teleop_sim", namespace=ns, env=DDS_ENV, params={"config_file": str(cfg)})
    # services and subscriptions are deaf until the node's check (5 s after start) restarts it
    # (exec, same pid) behind a placeholder participant; the new one is discovered like a first start
    ros_client.wait_for_services([cap.service("start")], timeout=40, procs=[cap, sim])
    status = wait_receiving(ros_client, cap, timeout=40)
    assert all(s.received > 0 for s in status.streams)
    log = cap.log_text()
    assert "receiving nothing although publishers are on the graph" in log, cap.log_tail()
    assert "restarting on a further DDS participant" in log, cap.log_tail()
    # the new incarnation's check (5 s after its start) reports it
    healed = r"after 1 restart\(s\) on a further DDS participant"
    end = time.monotonic() + 30
    while not re.search(healed, cap.log_text()) and time.monotonic() < end:
        ros_client.spin_for(0.5)
    assert re.search(healed, cap.log_text()), cap.log_tail()
    stop = record(ros_client, cap, 1.5)
    eps = wait_episodes(ros_client, cap, 1)
    root = tmp_path / "datasets" / "pick" / "raw"
    row = episode_rows(root)[0]
    assert row["length"] == stop.frames > 0 and eps[0].length == stop.frames
    assert "missing_stream" not in json.dumps(row["quality_issues"])
    assert cap.alive() and cap.stop() == 0, cap.log_text()
    assert sim.stop() == 0, sim.log_tail()

