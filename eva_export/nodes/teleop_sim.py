"""teleop_sim: a simulated teleoperation publisher for trying a capture config.

Publishes exactly the streams the config's ``collection.streams`` lists (same topics, types,
joint names and image sizes): state and action at ``state_rate`` / ``action_rate`` (100 Hz),
an optional PoseStamped ee_pose, and every camera at ``camera_rate`` (30 Hz) with moving
content.

Timing like a real sensor: sample k of a stream is *scheduled* at ``k / rate`` after the node
started and its header stamp is that scheduled time on the node clock (as a camera driver
stamps the exposure), not the moment its publish call happened to run. A tick publishes every
sample that is due, so a starved simulator delivers late, in a burst, but loses nothing.

Deterministic signals, so a recording can be checked against what was sent:

* state message n (n = 0, 1, ...): ``value[j] = n + 0.25 * j`` (action: ``-n - 0.25 * j``);
* camera frame m: a gradient that moves with m, and m written as 16 bits into 16 black/white
  blocks across the top of the image (``decode_counter`` reads it back, also after H.264).
  All cameras publish frame m from the same timer tick.

Fault injection (parameters; times in seconds since the node started, < 0 = off):
``freeze_camera`` + ``freeze_after_s`` (repeat one frame), ``drop_camera`` + ``drop_every``
(skip every k-th frame), ``stop_stream`` + ``stop_after_s`` (state, action, ee_pose or a camera
name goes silent), ``nan_after_s`` (NaN in state; with ``nan_every_s`` > 0 only a burst of
``nan_for_s`` at the start of every period from then on), ``shape_camera`` + ``shape_after_s`` +
``shape_width`` / ``shape_height`` (publish another image size), ``compress_jpeg`` (publish
CompressedImage cameras as JPEG; automatic for cameras configured as CompressedImage).
Delivery faults (no sample is lost, only published late, in order): ``jitter_s`` (each sample
of every stream released a random 0..jitter_s after its scheduled time, seeded by
``jitter_seed``), ``delay_every`` + ``delay_s`` (every k-th sample of every stream held back
``delay_s``, and the ones behind it with it).
"""

from __future__ import annotations

import io
import math
import sys
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from eva_export.capture.intake import StreamSpec, streams_from_config
from eva_export.config import load_config
from eva_export.nodes import ros_convert
from eva_export.nodes.common import run_node
from eva_export.nodes.intake import camera_depth

NODE_NAME = "teleop_sim"
COUNTER_BITS = 16


def counter_blocks(width: int) -> int:
    return max(1, width // COUNTER_BITS)


class FrameMaker:
    """Frames of one camera, cheap enough for several 640x480 cameras at 30 Hz in Python.

    A pattern twice the period larger than the image is drawn once; frame m is a window of it
    shifted by (4 m, 2 m) pixels (a gradient moving right and down), plus the counter blocks.
    """

    def __init__(self, width: int, height: int, cam_index: int = 0) -> None:
        self.width, self.height = width, height
        x = (np.arange(width + 256, dtype=np.int32) + 40 * cam_index) % 256
        y = np.arange(height + 256, dtype=np.int32) % 256
        base = np.empty((height + 256, width + 256, 3), np.uint8)
        base[..., 0] = x[None, :]
        base[..., 1] = y[:, None]
        base[..., 2] = ((x[None, :] // 2 + y[:, None] // 2 + 64 * cam_index) % 256).astype(np.uint8)
        self.base = base

    def frame(self, m: int) -> NDArray[np.uint8]:
        x0, y0 = (4 * m) % 256, (2 * m) % 256
        img = np.ascontiguousarray(self.base[y0:y0 + self.height, x0:x0 + self.width])
        b = counter_blocks(self.width)
        for bit in range(COUNTER_BITS):
            img[:b, bit * b:(bit + 1) * b] = 255 if (m >> bit) & 1 else 0
        return img


def render_frame(m: int, width: int, height: int, cam_index: int = 0) -> NDArray[np.uint8]:
    """Frame m of a camera: moving gradient plus the counter blocks on top."""
    return FrameMaker(width, height, cam_index).frame(m)


def decode_counter(img: NDArray[np.uint8]) -> int:
    """Read back the frame counter written by ``render_frame`` (robust to lossy coding)."""
    width = img.shape[1]
    b = counter_blocks(width)
    m = 0
    for bit in range(COUNTER_BITS):
        block = img[b // 4: b - b // 4, bit * b + b // 4:(bit + 1) * b - b // 4]
        if block.mean() > 127:
            m |= 1 << bit
    return m


def jpeg_bytes(img: NDArray[np.uint8]) -> bytes:
    import av

    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height = img.shape[1], img.shape[0]
    ctx.pix_fmt = "yuvj420p"
    from fractions import Fraction

    ctx.time_base = Fraction(1, 30)
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24").reformat(format="yuvj420p")
    out = io.BytesIO()
    for p in ctx.encode(frame):
        out.write(bytes(p))
    for p in ctx.encode(None):
        out.write(bytes(p))
    return out.getvalue()


class Schedule:
    """Sample k of a stream: scheduled at t0 + k / rate, released (published) at or after it.

    ``due(now)`` returns the samples whose release time has come, in order; release times are
    kept monotonic, so a delayed sample delays the ones behind it (as one DDS writer does).
    """

    def __init__(self, rate: float, t0: float, *, jitter_s: float = 0.0, delay_every: int = 0,
                 delay_s: float = 0.0, seed: int = 0) -> None:
        self.rate, self.t0 = float(rate), t0
        self.jitter_s, self.delay_every, self.delay_s = jitter_s, delay_every, delay_s
        self.rng = np.random.default_rng(seed)
        self.k = 0
        self._prev_release = -math.inf
        self._release: float | None = None

    def scheduled(self, k: int) -> float:
        """Seconds after the start at which sample k is taken."""
        return k / self.rate

    def due(self, now: float) -> list[int]:
        out: list[int] = []
        while True:
            if self._release is None:
                delay = float(self.rng.uniform(0.0, self.jitter_s)) if self.jitter_s > 0 else 0.0
                if self.delay_every > 0 and self.k % self.delay_every == self.delay_every - 1:
                    delay += self.delay_s
                self._release = max(self._prev_release, self.t0 + self.scheduled(self.k) + delay)
            if self._release > now:
                return out
            out.append(self.k)
            self._prev_release, self._release = self._release, None
            self.k += 1


class TeleopSim(Node):
    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        p = self.declare_parameter
        config_file = str(p("config_file", "").value or "")
        self.state_rate = float(p("state_rate", 100.0).value)
        self.action_rate = float(p("action_rate", 100.0).value)
        self.camera_rate = float(p("camera_rate", 30.0).value)
        self.freeze_camera = str(p("freeze_camera", "").value)
        self.freeze_after = float(p("freeze_after_s", -1.0).value)
        self.drop_camera = str(p("drop_camera", "").value)
        self.drop_every = int(p("drop_every", 0).value)
        self.stop_stream = str(p("stop_stream", "").value)
        self.stop_after = float(p("stop_after_s", -1.0).value)
        self.nan_after = float(p("nan_after_s", -1.0).value)
        self.nan_every = float(p("nan_every_s", -1.0).value)
        self.nan_for = float(p("nan_for_s", 0.0).value)
        self.shape_camera = str(p("shape_camera", "").value)
        self.shape_after = float(p("shape_after_s", -1.0).value)
        self.shape_size = (int(p("shape_width", 0).value), int(p("shape_height", 0).value))
        self.compress = bool(p("compress_jpeg", False).value)
        jitter = float(p("jitter_s", 0.0).value)
        delay_every = int(p("delay_every", 0).value)
        delay_s = float(p("delay_s", 0.0).value)
        seed = int(p("jitter_seed", 0).value)
        self.col = load_config(config_file).collection
        self.streams = {s.name: s for s in streams_from_config(self.col)} if self._has_streams() else {}
        self.t_start = time.monotonic()
        # the node clock at the start: stamps are t_start_ns + scheduled time of the sample
        self.t_start_ns = self.get_clock().now().nanoseconds
        faults = {"jitter_s": jitter, "delay_every": delay_every, "delay_s": delay_s}
        self.sched = {name: Schedule(rate, self.t_start, seed=seed + i, **faults)  # type: ignore[arg-type]
                      for i, (name, rate) in enumerate((("state", self.state_rate), ("action", self.action_rate),
                                                        ("camera", self.camera_rate)))}
        # ticks a few times per period when deliveries are delayed, so release times are kept
        tick = 4.0 if (jitter > 0 or delay_s > 0) else 1.0
        # histories deep enough for a catch-up burst after a stall (no sample is lost by the sim)
        qos_cam = QoSProfile(depth=camera_depth(self.camera_rate), reliability=ReliabilityPolicy.RELIABLE)
        self.pubs: dict[str, Any] = {}
        for name, spec in self.streams.items():
            cls = ros_convert.MSG_TYPES[spec.msg_type]
            self.pubs[name] = self.create_publisher(cls, spec.topic, qos_cam if spec.is_camera else 200)
        self.frozen: dict[str, Any] = {}
        self.makers: dict[tuple[str, int, int], FrameMaker] = {}
        self.cam_specs = [s for s in self.streams.values() if s.is_camera]
        if "state" in self.streams or "ee_pose" in self.streams:
            self.create_timer(1.0 / self.state_rate / tick, self._tick_state)
        if "action" in self.streams:
            self.create_timer(1.0 / self.action_rate / tick, self._tick_action)
        if self.cam_specs:
            self.create_timer(1.0 / self.camera_rate / tick, self._tick_cameras)
        self.get_logger().info(f"publishing {sorted(self.streams)} from {config_file or 'defaults'}")

    def _has_streams(self) -> bool:
        c = self.col
        return bool(c.state or c.action or c.ee_pose or c.cameras)

    def _silent(self, name: str, t: float) -> bool:
        return self.stop_stream == name and 0 <= self.stop_after <= t

    def _stamp_of(self, sched: Schedule, k: int) -> tuple[int, int]:
        ns = self.t_start_ns + round(sched.scheduled(k) * 1e9)
        return ns // 1_000_000_000, ns % 1_000_000_000

    def _tick_state(self) -> None:
        sched = self.sched["state"]
        for n in sched.due(time.monotonic()):
            t, stamp = sched.scheduled(n), self._stamp_of(sched, n)
            if "state" in self.streams and not self._silent("state", t):
                spec = self.streams["state"]
                values = n + 0.25 * np.arange(len(spec.names))
                if 0 <= self.nan_after <= t and (self.nan_every <= 0
                                                 or (t - self.nan_after) % self.nan_every < self.nan_for):
                    values[0] = np.nan
                self.pubs["state"].publish(self._vector_msg(spec, values, stamp))
            if "ee_pose" in self.streams and not self._silent("ee_pose", t):
                msg = ros_convert.pose_msg([n * 0.001, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
                ros_convert.set_stamp(msg, stamp)
                self.pubs["ee_pose"].publish(msg)

    def _tick_action(self) -> None:
        sched = self.sched["action"]
        for n in sched.due(time.monotonic()):
            if self._silent("action", sched.scheduled(n)):
                continue
            spec = self.streams["action"]
            values = -(n + 0.25 * np.arange(len(spec.names)))
            self.pubs["action"].publish(self._vector_msg(spec, values, self._stamp_of(sched, n)))

    def _vector_msg(self, spec: StreamSpec, values: NDArray[np.generic], stamp: tuple[int, int]) -> Any:
        """A JointState (stamped, by joint name) or a Float64MultiArray, as the config says."""
        if spec.msg_type == "JointState":
            msg = ros_convert.joint_state_msg(spec.names, values, spec.field)
            ros_convert.set_stamp(msg, stamp)
            return msg
        return ros_convert.float_array_msg(values)

    def _tick_cameras(self) -> None:
        sched = self.sched["camera"]
        for m in sched.due(time.monotonic()):
            self._publish_frames(m, sched.scheduled(m), self._stamp_of(sched, m))

    def _publish_frames(self, m: int, t: float, now: tuple[int, int]) -> None:
        """Frame m of every camera (one sampling instant, one stamp)."""
        for k, spec in enumerate(self.cam_specs):
            name = spec.name
            if self._silent(name, t):
                continue
            if name == self.drop_camera and self.drop_every > 0 and m % self.drop_every == self.drop_every - 1:
                continue
            w, h = spec.width, spec.height
            if name == self.shape_camera and 0 <= self.shape_after <= t:
                w, h = self.shape_size
            maker = self.makers.get((name, w, h))
            if maker is None:
                maker = self.makers[(name, w, h)] = FrameMaker(w, h, k)
            if name == self.freeze_camera and 0 <= self.freeze_after <= t:
                if name not in self.frozen:
                    self.frozen[name] = maker.frame(m)
                img = self.frozen[name]
            else:
                img = maker.frame(m)
            if spec.msg_type == "CompressedImage" or self.compress:
                msg = ros_convert.compressed_msg(jpeg_bytes(img))
            else:
                msg = ros_convert.image_msg(img, frame_id=name)
            ros_convert.set_stamp(msg, now)
            self.pubs[name].publish(msg)


def main(args: list[str] | None = None) -> int:
    """Console script ``teleop_sim``.

    Spun by a SingleThreadedExecutor: rclpy's MultiThreadedExecutor made the 100 Hz timers
    fire in bursts here. SIGINT ends it with exit code 0.
    """
    ros_convert.use_shipped_dds_profile()
    return run_node(TeleopSim, args, executor_factory=SingleThreadedExecutor)


if __name__ == "__main__":
    sys.exit(main())
