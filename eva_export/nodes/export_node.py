"""eva_export: quality split + export jobs of raw LeRobot v2.1 datasets.

Services (private names): ``~/start`` StartExport, ``~/get_job`` GetJob.
Topic: ``~/status`` JobQueueStatus. Parameters: ``config_file`` (string), ``status_period``.

The bodies below are placeholders with well-formed replies; the job work lives in
``eva_export.export`` / ``eva_export.jobs`` (no ROS imports) and is wired in here.
"""

from __future__ import annotations

import sys

from eva_export_interfaces.msg import JobQueueStatus
from eva_export_interfaces.srv import GetJob, StartExport
from rclpy.node import Node

from eva_export.nodes.common import (
    STATUS_QOS_DEPTH,
    create_status_timer,
    declare_common_parameters,
    run_node,
    service_group,
)

NODE_NAME = "eva_export"
NOT_IMPLEMENTED = "not implemented yet"


class ExportNode(Node):
    """Thin ROS wrapper around the export job queue."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config_file, status_period = declare_common_parameters(self)
        group = service_group()
        self.create_service(StartExport, "~/start", self._on_start, callback_group=group)
        self.create_service(GetJob, "~/get_job", self._on_get_job, callback_group=group)
        self.status_pub = self.create_publisher(JobQueueStatus, "~/status", STATUS_QOS_DEPTH)
        self.status_timer = create_status_timer(
            self, self.status_pub, self.build_status, status_period
        )
        self.get_logger().info(f"config_file={self.config_file!r}")

    def build_status(self) -> JobQueueStatus:
        msg = JobQueueStatus()
        msg.state = "IDLE"
        msg.queued = 0
        msg.current.kind = "export"
        return msg

    def _on_start(
        self, request: StartExport.Request, response: StartExport.Response
    ) -> StartExport.Response:
        response.success = False
        response.message = NOT_IMPLEMENTED
        return response

    def _on_get_job(self, request: GetJob.Request, response: GetJob.Response) -> GetJob.Response:
        response.success = False
        response.message = (
            f"no job {request.job_id!r}" if request.job_id else "no job yet"
        ) + f" ({NOT_IMPLEMENTED})"
        response.job.job_id = request.job_id
        response.job.kind = "export"
        return response


def main(args: list[str] | None = None) -> int:
    """Console script ``export_node``."""
    return run_node(ExportNode, args)


if __name__ == "__main__":
    sys.exit(main())
