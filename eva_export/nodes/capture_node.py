"""eva_capture: records teleoperation episodes into a raw LeRobot v2.1 dataset.

Services (private names): ``~/start`` StartCapture, ``~/stop`` StopCapture,
``~/cancel`` CancelCapture, ``~/list_episodes`` ListEpisodes, ``~/review`` ReviewEpisode.
Topic: ``~/status`` CaptureStatus. Parameters: ``config_file`` (string), ``status_period``.

The bodies below are placeholders with well-formed replies; the recording work lives in
``eva_export.capture`` (no ROS imports) and is wired in here.
"""

from __future__ import annotations

import sys

from eva_export_interfaces.msg import CaptureStatus
from eva_export_interfaces.srv import (
    CancelCapture,
    ListEpisodes,
    ReviewEpisode,
    StartCapture,
    StopCapture,
)
from rclpy.node import Node

from eva_export.nodes.common import (
    STATUS_QOS_DEPTH,
    create_status_timer,
    declare_common_parameters,
    run_node,
    service_group,
)

NODE_NAME = "eva_capture"
NOT_IMPLEMENTED = "not implemented yet"


class CaptureNode(Node):
    """Thin ROS wrapper around the capture core."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config_file, status_period = declare_common_parameters(self)
        group = service_group()
        self.create_service(StartCapture, "~/start", self._on_start, callback_group=group)
        self.create_service(StopCapture, "~/stop", self._on_stop, callback_group=group)
        self.create_service(CancelCapture, "~/cancel", self._on_cancel, callback_group=group)
        self.create_service(
            ListEpisodes, "~/list_episodes", self._on_list_episodes, callback_group=group
        )
        self.create_service(ReviewEpisode, "~/review", self._on_review, callback_group=group)
        self.status_pub = self.create_publisher(CaptureStatus, "~/status", STATUS_QOS_DEPTH)
        self.status_timer = create_status_timer(
            self, self.status_pub, self.build_status, status_period
        )
        self.get_logger().info(f"config_file={self.config_file!r}")

    def build_status(self) -> CaptureStatus:
        msg = CaptureStatus()
        msg.state = "IDLE"
        msg.last_episode_index = -1
        return msg

    def _on_start(
        self, request: StartCapture.Request, response: StartCapture.Response
    ) -> StartCapture.Response:
        response.success = False
        response.message = NOT_IMPLEMENTED
        response.dataset_name = request.dataset_name
        response.task = request.task
        return response

    def _on_stop(
        self, request: StopCapture.Request, response: StopCapture.Response
    ) -> StopCapture.Response:
        response.success = False
        response.message = NOT_IMPLEMENTED
        response.episode_index = -1
        return response

    def _on_cancel(
        self, request: CancelCapture.Request, response: CancelCapture.Response
    ) -> CancelCapture.Response:
        response.success = False
        response.message = NOT_IMPLEMENTED
        return response

    def _on_list_episodes(
        self, request: ListEpisodes.Request, response: ListEpisodes.Response
    ) -> ListEpisodes.Response:
        response.success = False
        response.message = NOT_IMPLEMENTED
        return response

    def _on_review(
        self, request: ReviewEpisode.Request, response: ReviewEpisode.Response
    ) -> ReviewEpisode.Response:
        response.success = False
        response.message = NOT_IMPLEMENTED
        response.episode.episode_index = request.episode_index
        return response


def main(args: list[str] | None = None) -> int:
    """Console script ``capture_node``."""
    return run_node(CaptureNode, args)


if __name__ == "__main__":
    sys.exit(main())
