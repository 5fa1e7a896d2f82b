"""eva_export: quality split + export jobs of raw LeRobot v2.1 datasets.

Services (private names): ``~/start`` StartExport, ``~/get_job`` GetJob.
Topic: ``~/status`` JobQueueStatus. Parameters: ``config_file`` (string), ``status_period``.

The node is a thin wrapper: every request goes to ``eva_export.export.runner.ExportService``
(no ROS imports), which checks it, queues it on one worker thread and records the job on disk.
``~/start`` answers at once with the job id and the accepted/rejected directories.
"""

from __future__ import annotations

import sys

from eva_export_interfaces.srv import StartExport  # type: ignore[import-untyped]  # no py.typed

from eva_export.config import Config
from eva_export.errors import EvaError
from eva_export.export.runner import ExportService
from eva_export.jobs import Job, JobKind, ServiceStatus
from eva_export.nodes.common import JobServiceNode, run_node

NODE_NAME = "eva_export"


class ExportNode(JobServiceNode):
    """Thin ROS wrapper around the export job queue."""

    KIND = JobKind.EXPORT

    def __init__(self) -> None:
        super().__init__(NODE_NAME, StartExport)

    def make_service(self, config: Config) -> None:
        self.service = ExportService(config)  # fails interrupted jobs

    def close(self) -> None:
        self.service.close()

    def service_status(self) -> ServiceStatus:
        return self.service.status()

    def find_job(self, job_id: str) -> Job | None:
        return self.service.get(job_id) if job_id else self.service.latest()

    def on_start(self, request: StartExport.Request, response: StartExport.Response) -> StartExport.Response:
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


def main(args: list[str] | None = None) -> int:
    """Console script ``export_node``."""
    return run_node(ExportNode, args)


if __name__ == "__main__":
    sys.exit(main())
