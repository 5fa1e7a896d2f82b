"""eva_export: quality split + export jobs of raw LeRobot v2.1 datasets.

Services (private names): ``~/start`` StartExport, ``~/get_job`` GetJob.
Topic: ``~/status`` JobQueueStatus. Parameters: ``config_file`` (string), ``status_period``.

The node is a thin wrapper: every request goes to ``eva_export.export.runner.ExportService``
(no ROS imports), which checks it, queues it on one worker thread and records the job on disk.
``~/start`` answers at once with the job id and the accepted/rejected directories.
"""

from __future__ import annotations

import sys
from typing import Any

from eva_export_interfaces.msg import Job as JobMsg
from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import GetJob, StartExport
from rclpy.node import Node

from eva_export import confine
from eva_export.config import load_config
from eva_export.errors import EvaError
from eva_export.export.runner import ExportService
from eva_export.jobs import Job
from eva_export.nodes.common import (
    STATUS_QOS_DEPTH,
    create_guarded_service,
    create_status_timer,
    declare_common_parameters,
    run_node,
    service_group,
)

NODE_NAME = "eva_export"

_CASTS: dict[str, Any] = {"string": str, "double": float, "float": float, "boolean": bool}


def job_to_msg(job: Job, msg: JobMsg) -> JobMsg:
    """Copy a Job record into a Job message, field by field (the names are the same)."""
    for name, idl in msg.get_fields_and_field_types().items():
        value = getattr(job, name)
        if "int" in idl:
            value = max(0, int(value))
        else:
            value = _CASTS.get(idl, str)(value)
        setattr(msg, name, value)
    return msg


class ExportNode(Node):
    """Thin ROS wrapper around the export job queue."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config_file, status_period = declare_common_parameters(self)
        group = service_group()
        create_guarded_service(self, StartExport, "~/start", self._on_start, group)
        create_guarded_service(self, GetJob, "~/get_job", self._on_get_job, group)
        self.status_pub = self.create_publisher(JobQueueStatus, "~/status", STATUS_QOS_DEPTH)
        self.status_timer = create_status_timer(
            self, self.status_pub, self.build_status, status_period
        )
        self.get_logger().info(f"config_file={self.config_file!r}")
        self.service = ExportService(load_config(self.config_file))  # fails interrupted jobs

    def close(self) -> None:
        self.service.close()

    def build_status(self) -> JobQueueStatus:
        state, queued, current = self.service.status()
        msg = JobQueueStatus()
        msg.state = state
        msg.queued = queued
        if current is not None:
            job_to_msg(current, msg.current)
        else:
            msg.current.kind = "export"
        return msg

    def _on_start(
        self, request: StartExport.Request, response: StartExport.Response
    ) -> StartExport.Response:
        try:
            job = self.service.start(request.source_dir, request.format)
        except EvaError as exc:
            response.success = False
            response.message = f"refused: {exc}"
            self.get_logger().warning(response.message)
            return response
        response.success = True
        response.message = f"queued {job.job_id}"
        response.job_id = job.job_id
        response.accepted_dir = job.accepted_dir
        response.rejected_dir = job.rejected_dir
        self.get_logger().info(f"export {job.job_id}: {job.source_dir} as {job.format}")
        return response

    def _on_get_job(self, request: GetJob.Request, response: GetJob.Response) -> GetJob.Response:
        job = self.service.get(request.job_id) if request.job_id else self.service.latest()
        if job is None:
            response.success = False
            # An invalid id (traversal, 256+ chars) is just not a job: no path is ever read for it.
            response.message = f"no job {confine.short_repr(request.job_id)}" if request.job_id else "no job yet"
            response.job.kind = "export"
            return response
        response.success = True
        response.message = job.state
        job_to_msg(job, response.job)
        return response


def main(args: list[str] | None = None) -> int:
    """Console script ``export_node``."""
    return run_node(ExportNode, args)


if __name__ == "__main__":
    sys.exit(main())
