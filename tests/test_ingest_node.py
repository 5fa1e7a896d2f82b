"""Bag ingest through the real capture node (separate process): ~/ingest answers at once, the job
is read through ~/get_job, the episodes through ~/list_episodes; refusals carry their reason."""

from __future__ import annotations

import json
import time

import pytest
from bag_helpers import offline, write_bag, write_config
from capture_helpers import DDS_ENV
from eva_export_interfaces.srv import CancelCapture, GetJob, IngestBag, ListEpisodes, StartCapture

pytestmark = pytest.mark.timeout(240)


def ingest(ros_client, cap, bag_path: str, dataset: str = "bag", episodes: str = "") -> IngestBag.Response:
    req = IngestBag.Request()
    req.bag_path, req.dataset_name, req.episodes = bag_path, dataset, episodes
    return ros_client.call(IngestBag, cap.service("ingest"), req, timeout=30)


def wait_job(ros_client, cap, job_id: str, timeout: float = 120.0) -> GetJob.Response:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        req = GetJob.Request()
        req.job_id = job_id
        r = ros_client.call(GetJob, cap.service("get_job"), req)
        assert r.success, r.message
        if r.job.state in ("completed", "failed", "interrupted"):
            return r
        time.sleep(0.3)
    raise TimeoutError(f"ingest job {job_id} not finished\n{cap.log_tail()}")


def test_ingest_through_the_capture_node(tmp_path, node_factory, ros_client):
    cfg = write_config(tmp_path)
    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    bag = write_bag(log_dir / "bags" / "take1", offline(3.0))
    outside = write_bag(tmp_path / "elsewhere", offline(1.0))
    cap = node_factory("capture_node", env=DDS_ENV, params={"config_file": str(cfg)})
    ros_client.wait_for_services([cap.service("ingest"), cap.service("get_job")], procs=[cap])

    r = ingest(ros_client, cap, str(outside))
    assert not r.success and "ingest roots" in r.message, r.message
    r = ingest(ros_client, cap, str(log_dir / "bags" / "nothing"))
    assert not r.success and "does not exist" in r.message, r.message
    from mcap.writer import Writer as McapWriter

    with open(log_dir / "export.mcap", "wb") as fh:  # the profile our MCAP export writes
        w = McapWriter(fh)
        w.start(profile="eva-client", library="eva_export")
        w.finish()
    r = ingest(ros_client, cap, str(log_dir / "export.mcap"))
    assert not r.success and "not a ROS 2 bag" in r.message, r.message

    # refused while recording (the streams are silent here: the episode starts after its grace)
    s = StartCapture.Request()
    s.dataset_name = "live"
    assert ros_client.call(StartCapture, cap.service("start"), s).success
    r = ingest(ros_client, cap, str(bag))
    assert not r.success and "recorded" in r.message, r.message
    assert ros_client.call(CancelCapture, cap.service("cancel")).success

    r = ingest(ros_client, cap, str(bag))
    assert r.success and r.job_id, r.message
    done = wait_job(ros_client, cap, r.job_id)
    job = done.job
    assert job.state == "completed", (job.error, cap.log_tail())
    assert job.kind == "ingest" and job.episodes_done == 1 and job.accepted_episodes == 1
    assert job.messages_done == 3 * (100 + 100 + 50 + 30 + 30) and job.bytes_done > 0 and job.bytes_total > 0
    latest = ros_client.call(GetJob, cap.service("get_job"), GetJob.Request())
    assert latest.job.job_id == r.job_id
    lr = ListEpisodes.Request()
    lr.dataset_name = "bag"
    eps = ros_client.call(ListEpisodes, cap.service("list_episodes"), lr)
    assert eps.success and [e.episode_index for e in eps.episodes] == [0]
    assert eps.episodes[0].quality == "green" and 85 <= eps.episodes[0].length <= 90
    # ingesting the same bag again resumes: nothing is written twice
    again = wait_job(ros_client, cap, ingest(ros_client, cap, str(bag)).job_id).job
    assert again.state == "completed" and again.episodes_done == 0 and again.reused_episodes == 1
    rows = [json.loads(x) for x in (log_dir / "bag" / "raw" / "meta" / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["ingest_source"]["bag"] == str(bag.resolve())
