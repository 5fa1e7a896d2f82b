"""The export node on a full disk (a real tmpfs), as a real process: a StartExport refused for
lack of space leaves no phantom queued job, an hdf5 export that runs out of space fails naming the
path and the free space, and the node survives both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from diskfull import fill, tmpfs, unfill
from dsfactory import Ep, make_dataset
from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import StartExport
from node_jobs import wait_job

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", 16) as root:
        yield root


def test_export_node_on_a_full_disk(node_factory, ros_client, fs: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log_dir = fs / "datasets"
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=30), Ep(frames=30, quality="red")], cameras=2,
                       width=64, height=48)
    config = tmp_path / "config.yaml"
    config.write_text(f'collection:\n  log_dir: "{log_dir}"\n  fps: 30\nexport:\n  workers: 1\n')
    node = node_factory("export_node", params={"config_file": str(config), "status_period": 0.2})
    ros_client.wait_for_services([node.service("start"), node.service("get_job")], procs=[node])
    start = StartExport.Request(source_dir=str(src), format="hdf5")

    fill(fs, leave=0)
    r = ros_client.call(StartExport, node.service("start"), start)
    assert not r.success and "free there" in r.message and r.job_id == "", r.message
    status = ros_client.wait_for_message(JobQueueStatus, node.topic("status"), timeout=10)
    assert status.queued == 0 and status.state == "IDLE"
    unfill(fs)

    fill(fs, leave=400 * 1024)  # the job record and the native split fit, the embedded frames do not
    r = ros_client.call(StartExport, node.service("start"), start)  # not "already has export ... queued"
    assert r.success, r.message
    job = wait_job(ros_client, node, r.job_id, timeout=120.0)
    assert job.state == "failed" and "free there" in job.error and str(fs) in job.error, job.error
    assert not (log_dir / "demo" / "export" / "hdf5" / "accepted").exists()
    unfill(fs)

    r = ros_client.call(StartExport, node.service("start"), start)
    assert r.success, r.message
    job = wait_job(ros_client, node, r.job_id, timeout=120.0)
    assert job.state == "completed", job.error
    assert node.stop() == 0, node.log_tail()
