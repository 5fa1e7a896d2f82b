"""eva_upload: uploads of the current accepted export over SFTP.

Services (private names): ``~/start`` StartUpload, ``~/get_job`` GetJob.
Topic: ``~/status`` JobQueueStatus. Parameters: ``config_file`` (string), ``status_period``.

The node is thin: the gate, the SFTP transfer and the job records live in
``eva_export.upload`` (no ROS imports); a refusal is a reply with success=false and the
gate's message, never a started job.
"""

from __future__ import annotations

import sys

from eva_export_interfaces.msg import Job as JobMsg  # type: ignore[import-untyped]  # no py.typed
from eva_export_interfaces.srv import StartUpload  # type: ignore[import-untyped]  # no py.typed

from eva_export import confine
from eva_export.config import Config
from eva_export.errors import EvaError
from eva_export.jobs import Job, JobKind, ServiceStatus
from eva_export.nodes.common import JobServiceNode, run_node
from eva_export.upload import UploadService

NODE_NAME = "eva_upload"
#: Seconds ``close()`` waits for cancelled uploads to remove their staging directories.
CLOSE_TIMEOUT_S = 5.0


class UploadNode(JobServiceNode):
    """Thin ROS wrapper around ``eva_export.upload.UploadService``."""

    KIND = JobKind.UPLOAD
    NO_JOB = "upload job"

    def __init__(self) -> None:
        super().__init__(NODE_NAME, StartUpload)

    def make_service(self, config: Config) -> None:
        self.uploads = UploadService(config)
        sftp = config.collection.sftp
        self.secrets = [] if sftp is None else [
            f"{sftp.user}@{sftp.host}:{sftp.port}", f"{sftp.user}@{sftp.host}", f"{sftp.host}:{sftp.port}",
            sftp.host, sftp.identity_file, sftp.known_hosts, sftp.remote_dir]
        for job in self.uploads.interrupted:
            self.get_logger().warning(f"upload {job.job_id} was left unfinished; marked failed")
        if self.uploads.backend is None:
            self.get_logger().warning(
                "no upload backend configured (no section under collection.storage); every upload is refused"
            )

    def service_status(self) -> ServiceStatus:
        return self.uploads.status()

    def find_job(self, job_id: str) -> Job | None:
        return self.uploads.get(job_id)

    def job_msg(self, job: Job | None) -> JobMsg:
        # Anyone on the graph may ask: errors keep their reason but not user@host:port, the
        # remote directory or key file paths (the node log has the full text).
        msg = super().job_msg(job)
        msg.error = confine.redact(msg.error, self.secrets)
        msg.last_error = confine.redact(msg.last_error, self.secrets)
        return msg

    def on_start(self, request: StartUpload.Request, response: StartUpload.Response) -> StartUpload.Response:
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

    def close(self) -> None:
        """Cancel running uploads (staging removed, nothing published), then stop."""
        self.uploads.close(cancel=True, timeout=CLOSE_TIMEOUT_S)


def main(args: list[str] | None = None) -> int:
    """Console script ``upload_node``."""
    return run_node(UploadNode, args)


if __name__ == "__main__":
    sys.exit(main())
