"""The export node as a real process: start an export over ROS, poll it, check the pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset
from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import GetJob, StartExport
from node_jobs import wait_job

from eva_export.export.records import QualitySplit
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.jobs import JobStore

pytestmark = pytest.mark.timeout(180)


def test_export_through_the_node(node_factory, ros_client, config_file: Path, tmp_path: Path) -> None:
    log_dir = tmp_path / "datasets"
    src = make_dataset(log_dir / "demo" / "raw", [
        Ep(frames=10, quality="green"), Ep(frames=11, quality="red"),
        Ep(frames=12, quality="red", verdict="pass"), Ep(frames=13, quality="green", verdict="fail"),
        Ep(frames=14, quality="green", note="note only"),
    ], cameras=1, width=32, height=24)
    outside = make_dataset(tmp_path / "elsewhere" / "raw", [Ep(frames=5)], cameras=1, width=32, height=24)
    node = node_factory("export_node", params={"config_file": str(config_file), "status_period": 0.2})
    ros_client.wait_for_services([node.service("start"), node.service("get_job")], procs=[node])

    # Refused: outside the data roots (nothing written), unknown format.
    r = ros_client.call(StartExport, node.service("start"),
                        StartExport.Request(source_dir=str(outside), format="lerobot_v21"))
    assert not r.success and "outside the export data roots" in r.message and r.job_id == ""
    assert not (tmp_path / "elsewhere" / "export").exists()
    r = ros_client.call(StartExport, node.service("start"), StartExport.Request(source_dir=str(src), format="zip"))
    assert not r.success and "unknown export format" in r.message
    empty = ros_client.call(GetJob, node.service("get_job"), GetJob.Request(job_id=""))
    assert not empty.success and empty.message

    r = ros_client.call(StartExport, node.service("start"),
                        StartExport.Request(source_dir=str(src), format="lerobot_v21"))
    assert r.success, r.message
    assert r.job_id and r.accepted_dir == str(log_dir / "demo/export/lerobot_v21/accepted")
    assert r.rejected_dir == str(log_dir / "demo/export/lerobot_v21/rejected")
    job = wait_job(ros_client, node, r.job_id)
    assert job.state == "completed", job.error
    assert (job.accepted_episodes, job.accepted_frames) == (3, 10 + 12 + 14)
    assert (job.rejected_episodes, job.rejected_frames) == (2, 11 + 13)
    assert job.episodes_done == job.episodes_total == 5 and job.files_done == 10 and job.bytes_done > 0
    assert job.finished_at >= job.created_at > 0 and job.kind == "export" and job.format == "lerobot_v21"
    assert QualitySplit.read(Path(job.accepted_dir)).source_episode_indices == [0, 2, 4]
    assert QualitySplit.read(Path(job.rejected_dir)).source_episode_indices == [1, 3]
    assert verify_v21(Path(job.accepted_dir)).ok and verify_v21(Path(job.rejected_dir)).ok

    latest = ros_client.call(GetJob, node.service("get_job"), GetJob.Request(job_id=""))
    assert latest.success and latest.job.job_id == r.job_id
    status = ros_client.wait_for_message(JobQueueStatus, node.topic("status"), timeout=10)
    assert status.state == "IDLE" and status.queued == 0 and status.current.job_id == r.job_id

    assert node.stop() == 0, node.log_tail()
    # The job record survives the node (the upload gate reads it).
    store = JobStore(log_dir / ".jobs" / "export")
    done = store.latest_completed("export", str(src), "lerobot_v21")
    assert done is not None and done.job_id == r.job_id
