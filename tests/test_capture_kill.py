"""Receiving after a crash: the capture node is killed (SIGKILL) near STOP again and again while
teleop_sim keeps publishing over the shipped shared-memory profile; every restarted node must
receive data on every stream within a few seconds of answering its services, and the dataset
stays consistent. EVA_CAPTURE_KILLS sets the number of restarts (default 10 on the shared
2-core machine; the issue asks for 50+: EVA_CAPTURE_KILLS=50)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from capture_helpers import DDS_ENV, check_dataset, episode_rows, start_pair, write_config

KILLS = int(os.environ.get("EVA_CAPTURE_KILLS", "10"))
#: Seconds from "services answer" to "a message on every stream" allowed after a restart (DDS
#: discovery of the publishers on a loaded 2-core machine; measured times are printed).
DATA_WITHIN_S = 15.0

pytestmark = pytest.mark.timeout(120 + 40 * KILLS)


def test_capture_node_killed_near_stop_receives_again_after_every_restart(tmp_path, node_factory, ros_client):
    from eva_export_interfaces.msg import CaptureStatus
    from eva_export_interfaces.srv import StartCapture, StopCapture

    cfg = write_config(tmp_path, width=160, height=120)
    root = tmp_path / "datasets" / "pick" / "raw"
    cap, sim = start_pair(node_factory, ros_client, cfg)
    got: list = []  # one status subscription for every incarnation (same topic name)
    ros_client.node.create_subscription(CaptureStatus, cap.topic("status"), got.append, 10)

    def wait_data(k: int) -> float:
        got.clear()
        t = time.monotonic()
        while time.monotonic() - t < DATA_WITHIN_S + 20:
            ros_client.spin_for(0.05)
            if got and got[-1].streams and all(s.received > 0 for s in got[-1].streams):
                return time.monotonic() - t
        last = {s.name: s.received for s in got[-1].streams} if got else "no status message"
        raise AssertionError(f"restart {k}: no data on every stream: {last} "
                             f"{got[-1].last_message if got else ''}\n{cap.log_tail()}")

    fresh_clients: list[int] = []  # restarts whose START needed a new client (printed)

    def start_recording(k: int) -> None:
        """START; unanswered, retry with a new client: right after a SIGKILL, Fast DDS may still
        route a request to the dead incarnation's shared-memory port (the "Failed init_port"
        lines) and the reply never comes, while a new client's endpoints are matched afresh.
        A START that did arrive shows as RECORDING on the status topic (only its reply was lost)."""
        name = cap.service("start")
        for _ in range(3):
            try:
                r = ros_client.call(StartCapture, name, StartCapture.Request(), timeout=20)
                assert r.success, r.message
                return
            except TimeoutError:
                fresh_clients.append(k)
                ros_client.forget_client(StartCapture, name)
                got.clear()
                ros_client.spin_for(1.0)
                if got and got[-1].state == "RECORDING":
                    return
        raise AssertionError(f"restart {k}: START unanswered 3 times; shm errors per restart {shm_errors}"
                             f"\n{cap.log_tail()}")

    waits: list[float] = []
    shm_errors: list[int] = []  # Fast DDS "Failed init_port" lines per incarnation
    old: tuple[set[bytes], set[bytes]] = (set(), set())
    for k in range(KILLS + 1):
        if k:
            cap = node_factory("capture_node", namespace=cap.namespace, env=DDS_ENV,
                               params={"config_file": str(cfg)})
            ros_client.wait_for_services([cap.service("start")], procs=[cap, sim])
            # the killed incarnation's endpoints linger until their lease ends: a request sent
            # while only they are matched goes nowhere, so wait for this incarnation's own
            ros_client.wait_for_new_server(cap.service("start"), old, timeout=60, procs=[cap, sim])
        waits.append(wait_data(k))
        shm_errors.append(cap.log_text().count("Failed init_port"))
        assert waits[-1] <= DATA_WITHIN_S, f"restart {k}: data on every stream only after {waits[-1]:.1f} s"
        if k == KILLS:
            break
        old = ros_client.service_endpoints(cap.service("start"))
        start_recording(k)
        ros_client.spin_for(0.4 + 0.1 * (k % 5))
        if k % 2:  # killed while recording, just before STOP
            os.killpg(cap.pid, signal.SIGKILL)
        else:  # killed right after STOP, while the episode is being saved
            stop = ros_client.call(StopCapture, cap.service("stop"), timeout=30)
            assert stop.success, stop.message
            os.killpg(cap.pid, signal.SIGKILL)
        cap.stop()
    assert sim.alive()
    print(f"{KILLS} kills; seconds to data on every stream after services: max {max(waits):.2f}, "
          f"mean {sum(waits) / len(waits):.2f}, all {[round(w, 1) for w in waits]}; "
          f"Fast DDS 'Failed init_port' lines per incarnation {shm_errors}; "
          f"START retried with a new client after restarts {fresh_clients}")
    rows = episode_rows(root) if (root / "meta" / "episodes.jsonl").exists() else []
    assert [r["episode_index"] for r in rows] == list(range(len(rows)))
    if rows:
        assert check_dataset(root) == []
