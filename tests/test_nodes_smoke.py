"""Each node as a real process: every service answers with a well-formed reply and the
status topic publishes."""

from __future__ import annotations

import pytest
from eva_export_interfaces.msg import CaptureStatus, EpisodeInfo, Job, JobQueueStatus
from eva_export_interfaces.srv import (
    CancelCapture,
    CheckDataset,
    GetJob,
    ListEpisodes,
    ReviewEpisode,
    StartCapture,
    StartExport,
    StartUpload,
    StopCapture,
)

pytestmark = pytest.mark.timeout(120)

# executable -> {private service name: type}, status type
NODES = {
    "capture_node": (
        {
            "start": StartCapture,
            "stop": StopCapture,
            "cancel": CancelCapture,
            "list_episodes": ListEpisodes,
            "review": ReviewEpisode,
        },
        CaptureStatus,
    ),
    "export_node": ({"start": StartExport, "get_job": GetJob, "check": CheckDataset}, JobQueueStatus),
    "upload_node": ({"start": StartUpload, "get_job": GetJob}, JobQueueStatus),
}

FIELD_TYPES = {
    "boolean": bool,
    "string": str,
    "double": float,
    "float": float,
    **{f"{s}int{b}": int for s in ("", "u") for b in (8, 16, 32, 64)},
}


def assert_well_formed(msg: object) -> None:
    """Every field is present and has the Python type its IDL type says."""
    fields = msg.get_fields_and_field_types()  # type: ignore[attr-defined]
    assert fields, f"{type(msg).__name__} has no fields"
    for name, idl_type in fields.items():
        assert hasattr(msg, name), f"{type(msg).__name__}.{name} missing"
        value = getattr(msg, name)
        if idl_type in FIELD_TYPES:
            assert isinstance(value, FIELD_TYPES[idl_type]), (name, idl_type, value)
        elif idl_type.startswith("sequence<"):
            for item in value:
                if hasattr(item, "get_fields_and_field_types"):
                    assert_well_formed(item)
        elif "/" in idl_type:  # nested message
            assert_well_formed(value)
        else:
            raise AssertionError(f"unexpected field type {idl_type} of {name}")


def test_node_names_and_domain(ros_client):
    import os

    assert os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    assert os.environ["ROS_DOMAIN_ID"] not in ("", "0")


@pytest.mark.parametrize("executable", sorted(NODES))
def test_node_services_answer(executable, node_factory, ros_client, config_file):
    services, status_type = NODES[executable]
    node = node_factory(executable, params={"config_file": str(config_file), "status_period": 0.2})
    ros_client.wait_for_services([node.service(s) for s in services], procs=[node])

    for name, srv_type in services.items():
        reply = ros_client.call(srv_type, node.service(name), srv_type.Request(), timeout=10)
        assert isinstance(reply, srv_type.Response), (name, reply)
        assert_well_formed(reply)
        assert isinstance(reply.success, bool) and isinstance(reply.message, str)
        if not reply.success:
            assert reply.message, f"{name}: a failed reply must say why"

    status = ros_client.wait_for_message(status_type, node.topic("status"), timeout=10)
    assert_well_formed(status)
    assert status.state in ("IDLE", "RECORDING", "SAVING", "BUSY")

    assert node.alive(), node.log_tail()
    assert node.stop() == 0, f"node did not exit cleanly on SIGINT:\n{node.log_tail()}"


def test_types_are_generated_from_repo_files():
    """The generated types carry the fields of the repo's .srv/.msg files."""
    assert "episode_index" in StopCapture.Response.get_fields_and_field_types()
    assert EpisodeInfo.get_fields_and_field_types()["quality_codes"] == "sequence<string>"
    assert "job" in GetJob.Response.get_fields_and_field_types()
    assert Job.get_fields_and_field_types()["created_at"] == "double"
