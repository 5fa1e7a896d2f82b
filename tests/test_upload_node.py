"""The upload node as a real process (tests/rosharness.py), against a throwaway sshd."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import yaml
from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import GetJob, StartUpload
from sshd import SshServer
from test_upload_core import make_export, remote_root, same_tree

from eva_export.config import SftpSettings
from eva_export.jobs import JobStore

pytestmark = pytest.mark.timeout(180)


def write_config(tmp_path: Path, sftp: SftpSettings | None) -> Path:
    collection: dict[str, object] = {"log_dir": str(tmp_path / "log")}
    if sftp is not None:
        collection["storage"] = {"sftp": dataclasses.asdict(sftp)}
    path = tmp_path / "upload_config.yaml"
    path.write_text(yaml.safe_dump({
        "collection": collection,
        "export": {"jobs_dir": str(tmp_path / "jobs" / "export")},
        "upload": {"jobs_dir": str(tmp_path / "jobs" / "upload")},
    }))
    return path


def start_node(node_factory, ros_client, config: Path):  # type: ignore[no-untyped-def]
    node = node_factory("upload_node", params={"config_file": str(config), "status_period": 0.2})
    ros_client.wait_for_services([node.service("start"), node.service("get_job")], procs=[node])
    return node


def request(source: Path, fmt: str, accepted: Path) -> StartUpload.Request:
    req = StartUpload.Request()
    req.source_dir, req.format, req.accepted_dir = str(source), fmt, str(accepted)
    return req


def test_upload_through_the_node(tmp_path, node_factory, ros_client):  # type: ignore[no-untyped-def]
    server = SshServer.start(tmp_path / "sshd")
    try:
        config = write_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
        exp = make_export(tmp_path, JobStore(tmp_path / "jobs" / "export"))
        node = start_node(node_factory, ros_client, config)

        # a refusal: the rejected directory is never uploaded, and no job is created
        refused = ros_client.call(StartUpload, node.service("start"),
                                  request(exp.source, "hdf5", exp.rejected))
        assert not refused.success and not refused.job_id
        assert "rejected subset" in refused.message
        assert list((tmp_path / "jobs" / "upload").glob("*.json")) == []

        reply = ros_client.call(StartUpload, node.service("start"), request(exp.source, "hdf5", exp.accepted))
        assert reply.success, reply.message
        assert reply.job_id.startswith("upload-")
        deadline = time.monotonic() + 60
        while True:
            got = ros_client.call(GetJob, node.service("get_job"), GetJob.Request(job_id=reply.job_id))
            assert got.success, got.message
            if got.job.state in ("completed", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        job = got.job
        assert job.state == "completed", job.error
        assert job.kind == "upload" and job.format == "hdf5"
        assert job.remote_path == str(remote_root(tmp_path) / "pick_hdf5_accepted")
        assert job.files_done == job.files_total > 0 and job.bytes_done == job.bytes_total > 0
        assert job.attempts == 1 and job.last_error == ""  # the retry fields reach the message
        same_tree(exp.accepted, Path(job.remote_path))

        latest = ros_client.call(GetJob, node.service("get_job"), GetJob.Request())
        assert latest.success and latest.job.job_id == reply.job_id
        status = ros_client.wait_for_message(JobQueueStatus, node.topic("status"))
        assert status.state == "IDLE" and status.current.job_id == reply.job_id
        assert status.current.state == "completed"
        assert node.stop() == 0, node.log_tail()
    finally:
        server.stop()


def test_no_backend_configured(tmp_path, node_factory, ros_client):  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, None)
    exp = make_export(tmp_path, JobStore(tmp_path / "jobs" / "export"))
    node = start_node(node_factory, ros_client, config)
    reply = ros_client.call(StartUpload, node.service("start"), request(exp.source, "hdf5", exp.accepted))
    assert not reply.success and not reply.job_id
    assert "no upload backend is configured" in reply.message
    got = ros_client.call(GetJob, node.service("get_job"), GetJob.Request())
    assert not got.success and got.message == "no upload job yet"
    status = ros_client.wait_for_message(JobQueueStatus, node.topic("status"))
    assert status.state == "IDLE" and status.current.job_id == ""
    assert list((tmp_path / "jobs" / "upload").glob("*.json")) == []
    assert node.stop() == 0, node.log_tail()
