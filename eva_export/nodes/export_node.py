"""eva_export: quality split + export jobs of raw LeRobot v2.1 datasets.

Services (private names): ``~/start`` StartExport, ``~/get_job`` GetJob, ``~/check``
CheckDataset. Topic: ``~/status`` JobQueueStatus. Parameters: ``config_file`` (string),
``status_period``, ``check_max_bytes`` / ``check_max_frames`` (the largest dataset ``~/check``
takes).

The node is a thin wrapper: every request goes to ``eva_export.export.runner.ExportService``
(no ROS imports), which checks it, queues it on one worker thread and records the job on disk.
``~/start`` answers at once with the job id and the accepted/rejected directories.
``~/check`` runs the quality rules in the call (eva_export.quality.service: why synchronous).
"""

from __future__ import annotations

import sys
from pathlib import Path

from eva_export_interfaces.msg import EpisodeQuality  # type: ignore[import-untyped]  # no py.typed
from eva_export_interfaces.srv import CheckDataset, StartExport  # type: ignore[import-untyped]

from eva_export.config import Config
from eva_export.errors import EvaError
from eva_export import faults
from eva_export.export.runner import ExportService
from eva_export.jobs import Job, JobKind, ServiceStatus
from eva_export.nodes.common import JobServiceNode, create_guarded_service, run_node, service_group
from eva_export.quality.service import DEFAULT_MAX_BYTES, DEFAULT_MAX_FRAMES, CheckService, Hook

NODE_NAME = "eva_export"
EXECUTOR_THREADS = 4


def _hold_hook() -> Hook | None:
    # fault injection (eva_export/faults.py): a check held at a point it surely reaches
    hold = faults.from_env("check_hold")
    if not hold:
        return None

    held: list[bool] = []

    def hook(_root: Path) -> None:
        if held:
            return  # only the first check is held
        held.append(True)
        (Path(hold) / "started").write_text("1")
        with open(Path(hold) / "release", "rb"):
            pass

    return hook


class ExportNode(JobServiceNode):
    """Thin ROS wrapper around the export job queue."""

    KIND = JobKind.EXPORT

    def __init__(self) -> None:
        super().__init__(NODE_NAME, StartExport)
        max_bytes = int(self.declare_parameter("check_max_bytes", DEFAULT_MAX_BYTES).value)
        max_frames = int(self.declare_parameter("check_max_frames", DEFAULT_MAX_FRAMES).value)
        self.checker = CheckService(self.service.config, max_bytes, max_frames, hook=_hold_hook())
        create_guarded_service(self, CheckDataset, "~/check", self.on_check, service_group())

    def make_service(self, config: Config) -> None:
        self.service = ExportService(config)  # fails interrupted jobs

    def close(self) -> None:
        self.service.close()

    def service_status(self) -> ServiceStatus:
        return self.service.status()

    def find_job(self, job_id: str) -> Job | None:
        return self.service.get(job_id) if job_id else self.service.latest()

    def on_start(self, request: StartExport.Request, response: StartExport.Response) -> StartExport.Response:
        # source_dir alone (one source), source_dirs (several, merged into the pair named name), or
        # both (source_dir first)
        sources = ([request.source_dir] if request.source_dir else []) + list(request.source_dirs)
        try:
            job = self.service.start(sources, request.format, request.name)
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

    def on_check(self, request: CheckDataset.Request, response: CheckDataset.Response) -> CheckDataset.Response:
        try:
            result = self.checker.check(request.dataset, bool(request.write), bool(request.sidecar))
        except (EvaError, OSError, ValueError) as exc:  # a damaged file: a reason, not a crash
            response.success = False
            response.message = f"refused: {exc}"
            self.get_logger().warning(response.message)
            return response
        response.success = True
        response.message = result.summary()
        response.dataset_dir = str(result.root)
        response.source_kind = result.source_kind
        response.rule_version = result.rule_version
        response.red, response.green = result.red, len(result.episodes) - result.red
        response.written = result.written
        response.episodes = [EpisodeQuality(episode_index=e.episode_index, quality=e.quality,
                                            reason_codes=list(e.reason_codes), warning_codes=list(e.warning_codes))
                             for e in result.episodes]
        self.get_logger().info(f"check {result.root}: {response.message}")
        return response


def main(args: list[str] | None = None) -> int:
    """Console script ``export_node``."""
    # a check holds its executor thread until it answers: enough threads that ~/start,
    # ~/get_job and the status timer still have one whatever the core count
    return run_node(ExportNode, args, num_threads=EXECUTOR_THREADS)


if __name__ == "__main__":
    sys.exit(main())
