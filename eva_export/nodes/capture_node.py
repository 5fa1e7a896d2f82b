"""eva_capture: records teleoperation episodes into a raw LeRobot v2.1 dataset.

Services (private names): ``~/start`` StartCapture, ``~/stop`` StopCapture,
``~/cancel`` CancelCapture, ``~/list_episodes`` ListEpisodes, ``~/review`` ReviewEpisode,
``~/ingest`` IngestBag (a rosbag2 MCAP bag through the live-capture path, in the background;
refused while recording; bag_path inside ``collection.capture.ingest_roots``, default log_dir),
``~/get_job`` GetJob (ingest jobs).
Topic: ``~/status`` CaptureStatus (about 2 Hz). Parameters: ``config_file`` (string),
``status_period`` (the shared default of 1.0 s becomes 0.5 s here), ``stats_file`` (optional
JSON-lines file: per-episode diagnostics such as callback latency, STOP-to-durable time and
encoding speed).

The node is thin: subscription callbacks stamp the receive time, take a zero-copy view of the
message (ros_convert) and hand it to ``eva_export.capture.Recorder``, which aligns, checks,
encodes and saves in its own threads. Unless FASTDDS_DEFAULT_PROFILES_FILE is set, the shipped
shared-memory DDS profile (config/fastdds_shm.xml) is used.

After a crash (kill -9) Fast DDS leaves the dead process's shared-memory port in /dev/shm
and the publishers keep it open. ``SILENT_CHECK_S`` seconds after start the node warns about
each configured stream that received nothing while a publisher of its topic is on the graph
(the "deaf restart"; see config/fastdds_shm.xml) and, unless an episode is recording or
saving, restarts itself on a further DDS participant id (nodes/intake.py). The node
deliberately does NOT run ``fastdds shm clean`` at start: measured in
tests/test_capture_kill.py, removing the dead port while the publishers still hold it made the
restarted node fail to open its port ("Failed init_port ... open_and_lock_file failed") and
stay deaf.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from eva_export_interfaces.msg import CaptureStatus, EpisodeInfo, StreamStatus  # type: ignore[import-untyped]  # no py.typed
from eva_export_interfaces.srv import (  # type: ignore[import-untyped]  # no py.typed
    CancelCapture,
    GetJob,
    IngestBag,
    ListEpisodes,
    ReviewEpisode,
    StartCapture,
    StopCapture,
)
from rclpy.node import Node

from eva_export.capture.recorder import Recorder
from eva_export import confine
from eva_export.config import load_config
from eva_export.formats.common.records import EpisodeRow
from eva_export.errors import EvaError
from eva_export.nodes import intake, ros_convert
from eva_export.nodes.common import (
    DEFAULT_STATUS_PERIOD,
    STATUS_QOS_DEPTH,
    create_guarded_service,
    create_status_timer,
    declare_common_parameters,
    run_node,
    service_group,
)

NODE_NAME = "eva_capture"
#: Seconds after start-up when silent streams with a publisher on the graph are reported.
SILENT_CHECK_S = 5.0
CAPTURE_STATUS_PERIOD = 0.5


def episode_info(row: EpisodeRow) -> EpisodeInfo:
    info = EpisodeInfo()
    info.episode_index = row.episode_index
    info.length = row.length
    info.task = row.tasks[0] if row.tasks else ""
    info.quality = row.quality
    info.quality_codes = [i.code for i in row.quality_issues]
    info.qc_verdict = row.qc_verdict
    info.note = row.note
    info.take_id = row.take_id
    return info


class CaptureNode(Node):
    """Thin ROS wrapper around the capture core."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config_file, status_period = declare_common_parameters(self)
        if status_period == DEFAULT_STATUS_PERIOD:
            status_period = CAPTURE_STATUS_PERIOD
        stats_file = str(self.declare_parameter("stats_file", "").value or "")
        self.recorder: Recorder | None = None
        self.config_error = ""
        try:
            col = load_config(self.config_file).collection
            self.recorder = Recorder(col, stats_file=stats_file or None)
            for name, actions in self.recorder.recovered.items():
                self.get_logger().warning(f"dataset {name!r} recovered at start-up: {'; '.join(actions)}")
        except EvaError as exc:
            self.config_error = f"capture is unavailable: {exc}"
            self.get_logger().error(self.config_error)
        self.intake = (intake.Intake(self, self.recorder, col.capture.reliable_qos, deaf=intake.deaf_hook())
                       if self.recorder else None)
        self.restart = False  # set when a deaf start-up asks main() to exec a new incarnation
        self.silent_warning = ""
        self._started = time.monotonic()
        self._status_period = status_period
        self._serve()
        if self.recorder is not None:
            self._silent_timer = self.create_timer(SILENT_CHECK_S, self._check_silent_streams)
        self.get_logger().info(f"config_file={self.config_file!r} dds_profile="
                               f"{os.environ.get(ros_convert.DDS_PROFILE_ENV, '')!r}")

    def _serve(self) -> None:
        """The services and the status topic (by full name; the test hook renames them)."""
        base, group = self.get_fully_qualified_name(), service_group()
        deaf = intake.DEAF_SUFFIX if intake.deaf_hook() else ""
        for srv, name, handler in (
                (StartCapture, "start", self._on_start), (StopCapture, "stop", self._on_stop),
                (CancelCapture, "cancel", self._on_cancel), (ListEpisodes, "list_episodes", self._on_list_episodes),
                (ReviewEpisode, "review", self._on_review), (IngestBag, "ingest", self._on_ingest),
                (GetJob, "get_job", self._on_get_job)):
            create_guarded_service(self, srv, f"{base}/{name}{deaf}", handler, group)
        self.status_pub = self.create_publisher(CaptureStatus, f"{base}/status", STATUS_QOS_DEPTH)
        self.status_timer = create_status_timer(self, self.status_pub, self.build_status, self._status_period)

    def close(self) -> None:
        if self.intake is not None:
            self.intake.close()
        if self.recorder is not None:
            self.recorder.close()

    def _check_silent_streams(self) -> None:
        """SILENT_CHECK_S after start-up: a stream with a publisher but no message is a transport
        fault (see nodes/intake.py); the node restarts itself on a further participant id."""
        assert self.intake is not None and self.recorder is not None
        self._silent_timer.cancel()
        deaf, held = self.intake.deaf_streams(), intake.held_count()
        if not deaf:
            if held:
                self.get_logger().info(f"receiving on every stream with a publisher after {held} restart(s) "
                                       "on a further DDS participant")
            return
        st = self.recorder.status()
        busy = st.state != "IDLE" or st.save_queue_depth > 0
        give_up = held >= intake.MAX_RESTARTS or busy
        self.silent_warning = (
            f"receiving nothing although publishers are on the graph: {intake.describe(deaf)} "
            f"after {time.monotonic() - self._started:.0f} s; "
            + ("stale shared memory of a crashed capture process is the known cause; restarting on a "
               "further DDS participant" if not give_up else
               "not restarting while an episode is recording or saving" if busy else
               f"gave up after {held} restarts on further participants; restart the publishing process"))
        self.get_logger().warning(self.silent_warning)
        if not give_up:
            self.restart = True
            self.context.try_shutdown()  # run_node tears down as for SIGINT; main() then execs

    # ---- status ---------------------------------------------------------------------------------
    def build_status(self) -> CaptureStatus:
        msg = CaptureStatus()
        msg.last_episode_index = -1
        if self.recorder is None:
            msg.state = "IDLE"
            msg.last_message = self.config_error
            return msg
        st = self.recorder.status()
        msg.state = st.state
        msg.dataset_name, msg.dataset_dir, msg.task = st.dataset_name, st.dataset_dir, st.task
        msg.frames = st.frames
        msg.save_queue_depth = st.save_queue_depth
        msg.save_queue_capacity = st.save_queue_capacity
        for s in st.streams:
            ss = StreamStatus()
            ss.name, ss.topic, ss.received, ss.dropped, ss.rate_hz = s.name, s.topic, s.received, s.dropped, s.rate_hz
            ss.late = s.late
            ss.jitter_p50_ms, ss.jitter_p99_ms, ss.max_gap_ms = s.jitter_p50_ms, s.jitter_p99_ms, s.max_gap_ms
            msg.streams.append(ss)
        msg.last_episode_index = st.last_episode_index
        msg.last_episode_quality = st.last_episode_quality
        msg.last_take_id = st.last_take_id
        msg.last_message = st.last_message or self.silent_warning
        return msg

    # ---- services -------------------------------------------------------------------------------
    def _on_start(self, request: StartCapture.Request, response: StartCapture.Response) -> StartCapture.Response:
        response.dataset_name, response.task = request.dataset_name, request.task
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        r = self.recorder.start(request.dataset_name, request.task)
        response.success, response.message = r.ok, r.message
        response.dataset_name, response.dataset_dir, response.task = r.dataset_name, r.dataset_dir, r.task
        return response

    def _on_stop(self, request: StopCapture.Request, response: StopCapture.Response) -> StopCapture.Response:
        response.episode_index = -1
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        r = self.recorder.stop()
        response.success, response.message = r.ok, r.message
        response.episode_index, response.frames, response.save_queue_depth = r.episode_index, r.frames, r.save_queue_depth
        response.take_id = r.take_id
        return response

    def _on_cancel(self, request: CancelCapture.Request, response: CancelCapture.Response) -> CancelCapture.Response:
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        r = self.recorder.cancel()
        response.success, response.message, response.frames_discarded = r.ok, r.message, r.frames_discarded
        return response

    def _on_list_episodes(self, request: ListEpisodes.Request,
                          response: ListEpisodes.Response) -> ListEpisodes.Response:
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        try:
            root, rows = self.recorder.list_episodes(request.dataset_name)
        except EvaError as exc:
            response.success, response.message = False, f"refused: {exc}"
            return response
        response.success = True
        response.dataset_dir = str(root)
        response.episodes = [episode_info(r) for r in rows]
        response.message = f"{len(rows)} episodes"
        return response

    def _on_review(self, request: ReviewEpisode.Request, response: ReviewEpisode.Response) -> ReviewEpisode.Response:
        response.episode.episode_index = request.episode_index
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        if request.set_note:
            confine.check_note(request.note)  # refused over 4 KiB (the reply says so)
        try:
            row = self.recorder.review(request.dataset_name, request.episode_index, request.verdict,
                                       request.note if request.set_note else None, request.take_id)
        except EvaError as exc:
            response.success, response.message = False, f"refused: {exc}"
            return response
        response.success = True
        response.message = f"episode {row.episode_index} reviewed"
        response.episode = episode_info(row)
        return response


    def _on_ingest(self, request: IngestBag.Request, response: IngestBag.Response) -> IngestBag.Response:
        """Check the request and the bag, answer at once; the ingest runs in the background."""
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        job = self.recorder.ingest(request.bag_path, request.dataset_name, request.task, request.episodes)
        response.success, response.job_id = True, job.job_id
        response.message = f"ingesting {job.source_dir} into {job.accepted_dir} (job {job.job_id})"
        self.get_logger().info(response.message)
        return response

    def _on_get_job(self, request: GetJob.Request, response: GetJob.Response) -> GetJob.Response:
        from eva_export.nodes.common import job_to_msg

        response.job.kind = "ingest"
        if self.recorder is None:
            response.success, response.message = False, self.config_error
            return response
        jobs = self.recorder.jobs
        job = jobs.get(request.job_id) if request.job_id else jobs.latest()
        if job is None:
            response.success = False
            response.message = f"no job {confine.short_repr(request.job_id)}" if request.job_id else "no job yet"
            return response
        response.success, response.message = True, str(job.state)
        response.job = job_to_msg(job, "ingest")
        return response


def main(args: list[str] | None = None) -> int:
    """Console script ``capture_node``."""
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")
    ros_convert.use_shipped_dds_profile()
    held = intake.hold_participants(intake.held_count())
    nodes: list[CaptureNode] = []

    def make() -> CaptureNode:
        nodes.append(CaptureNode())
        return nodes[-1]

    try:
        rc = run_node(make, args)
    finally:
        intake.release(held)
    if rc == 0 and nodes and nodes[0].restart:
        intake.restart_with(len(held) + 1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
