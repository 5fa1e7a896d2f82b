"""Several sources merged through the export node's StartExport (source_dirs + name)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset
from eva_export_interfaces.srv import StartExport
from node_jobs import wait_job

from eva_export.export.records import QualitySplit
from eva_export.formats.lerobot_v21.exporter import verify_v21

pytestmark = pytest.mark.timeout(180)


def test_merge_through_the_node(node_factory, ros_client, config_file: Path, tmp_path: Path) -> None:
    log_dir = tmp_path / "datasets"
    kw = {"cameras": 1, "width": 32, "height": 24}
    a = make_dataset(log_dir / "robot_a" / "raw", [Ep(frames=10), Ep(frames=11, quality="red")], **kw)
    b = make_dataset(log_dir / "robot_b" / "raw", [Ep(frames=12, task="place"), Ep(frames=13)], **kw)
    odd = make_dataset(log_dir / "robot_c" / "raw", [Ep(frames=14)], cameras=2, width=32, height=24)
    node = node_factory("export_node", params={"config_file": str(config_file), "status_period": 0.2})
    ros_client.wait_for_services([node.service("start"), node.service("get_job")], procs=[node])

    def start(**kw: object) -> StartExport.Response:
        return ros_client.call(StartExport, node.service("start"), StartExport.Request(format="lerobot_v21", **kw))

    r = start(source_dirs=[str(a), str(b)])
    assert not r.success and "a name is required" in r.message and r.job_id == ""
    r = start(source_dirs=[str(a), str(odd)], name="fleet")
    assert not r.success and str(odd / "meta/info.json") in r.message and "observation.images.cam1" in r.message
    assert not (log_dir / "fleet").exists()

    r = start(source_dir=str(a), source_dirs=[str(b)], name="fleet")  # source_dir goes first
    assert r.success, r.message
    assert r.accepted_dir == str(log_dir / "fleet/export/lerobot_v21/accepted")
    job = wait_job(ros_client, node, r.job_id)
    assert job.state == "completed", job.error
    assert (job.accepted_episodes, job.rejected_episodes) == (3, 1)
    assert job.source_dir == str(log_dir / "fleet")
    marker = QualitySplit.read(Path(job.accepted_dir))
    assert [(o["source_dataset"], o["source_episode_index"]) for o in marker.extra["source_episodes"]] == [
        (str(a), 0), (str(b), 0), (str(b), 1)]
    assert verify_v21(Path(job.accepted_dir)).ok and verify_v21(Path(job.rejected_dir)).ok
    assert node.stop() == 0, node.log_tail()
