"""eva_upload: uploads of the current accepted export over SFTP.

Services (private names): ``~/start`` StartUpload, ``~/get_job`` GetJob.
Topic: ``~/status`` JobQueueStatus. Parameters: ``config_file`` (string), ``status_period``.

The node is thin: the gate, the SFTP transfer and the job records live in
``eva_export.upload`` (no ROS imports); a refusal is a reply with success=false and the
gate's message, never a started job.
"""

from __future__ import annotations

import sys

from eva_export_interfaces.msg import Job as JobMsg
from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import GetJob, StartUpload
from rclpy.node import Node

from eva_export import confine
from eva_export.config import load_config
from eva_export.errors import EvaError
from eva_export.jobs import Job
from eva_export.nodes.common import (
    STATUS_QOS_DEPTH,
    create_guarded_service,
    create_status_timer,
    declare_common_parameters,
    run_node,
    service_group,
)
from eva_export.upload import UploadService

NODE_NAME = "eva_upload"
#: Seconds ``close()`` waits for cancelled uploads to remove their staging directories.
CLOSE_TIMEOUT_S = 5.0


def job_to_msg(job: Job | None) -> JobMsg:
    """The ``eva_export_interfaces/msg/Job`` of a core Job record (empty job_id for None)."""
    msg = JobMsg()
    msg.kind = "upload"
    if job is None:
        return msg
    for name, idl_type in JobMsg.get_fields_and_field_types().items():
        value = getattr(job, name)
        if idl_type == "double":
            value = float(value)
        elif idl_type.startswith("uint"):
            value = max(0, int(value))
        setattr(msg, name, value)
    return msg


class UploadNode(Node):
    """Thin ROS wrapper around ``eva_export.upload.UploadService``."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config_file, status_period = declare_common_parameters(self)
        config = load_config(self.config_file)
        self.uploads = UploadService(config)
        sftp = config.collection.sftp
        self.secrets = [] if sftp is None else [
            f"{sftp.user}@{sftp.host}:{sftp.port}", f"{sftp.user}@{sftp.host}", f"{sftp.host}:{sftp.port}",
            sftp.host, sftp.identity_file, sftp.known_hosts, sftp.remote_dir]
        for job in self.uploads.interrupted:
            self.get_logger().warning(f"upload {job.job_id} was left unfinished; marked failed")
        if config.collection.sftp is None:
            self.get_logger().warning(
                "no upload backend configured (collection.storage.sftp); every upload is refused"
            )
        group = service_group()
        create_guarded_service(self, StartUpload, "~/start", self._on_start, group)
        create_guarded_service(self, GetJob, "~/get_job", self._on_get_job, group)
        self.status_pub = self.create_publisher(JobQueueStatus, "~/status", STATUS_QOS_DEPTH)
        self.status_timer = create_status_timer(
            self, self.status_pub, self.build_status, status_period
        )
        self.get_logger().info(f"config_file={self.config_file!r}")

    def build_status(self) -> JobQueueStatus:
        status = self.uploads.status()
        msg = JobQueueStatus()
        msg.state = status.state
        msg.queued = status.queued
        msg.current = job_to_msg(status.current)
        return msg

    def _on_start(
        self, request: StartUpload.Request, response: StartUpload.Response
    ) -> StartUpload.Response:
        try:
            job = self.uploads.start(request.source_dir, request.format, request.accepted_dir)
        except EvaError as exc:  # UploadRefused: the gate said no; no job was created
            response.success = False
            response.message = confine.redact(str(exc), self.secrets)
            self.get_logger().warning(f"upload refused: {exc}")
            return response
        response.success = True
        response.job_id = job.job_id
        response.message = f"upload {job.job_id} started: {job.accepted_dir}"
        self.get_logger().info(response.message)
        return response

    def _on_get_job(self, request: GetJob.Request, response: GetJob.Response) -> GetJob.Response:
        job = self.uploads.get(request.job_id)
        if job is None:
            response.success = False
            response.message = (f"no upload job {confine.short_repr(request.job_id)}" if request.job_id
                                else "no upload job yet")
            response.job = job_to_msg(None)
            return response
        response.success = True
        response.message = job.state
        response.job = job_to_msg(job)
        # Anyone on the graph may ask: errors keep their reason but not user@host:port, the
        # remote directory or key file paths (the node log has the full text).
        response.job.error = confine.redact(job.error, self.secrets)
        response.job.last_error = confine.redact(job.last_error, self.secrets)
        return response

    def close(self) -> None:
        """Cancel running uploads (staging removed, nothing published), then stop."""
        self.uploads.close(cancel=True, timeout=CLOSE_TIMEOUT_S)


def main(args: list[str] | None = None) -> int:
    """Console script ``upload_node``."""
    return run_node(UploadNode, args)


if __name__ == "__main__":
    sys.exit(main())
