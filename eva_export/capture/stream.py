"""Per-stream state of one capture engine, as one object per configured stream.

Recorder-wide counters (received, in flight, overflow, callback latency), the stream's clock
offset (learnt from every message, also between episodes, so it is settled when START comes),
its image decoder (an H.264 stream: its ``VideoFeed``), the value held for the current episode's
repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .clock import ClockOffset
from .intake import ImageDecoder, StreamSpec
from .video_feed import VideoFeed


@dataclass
class StreamState:
    spec: StreamSpec
    received: int = 0
    inflight: int = 0  # camera frames queued for the worker
    overflow: int = 0  # messages not taken because the intake was full (this episode)
    latency: list[float] = field(default_factory=list)  # callback durations (this episode)
    offset: ClockOffset = field(default_factory=ClockOffset)
    decoder: ImageDecoder = field(default_factory=ImageDecoder)
    held: Any = None  # the last value written (repeated on drops)
    held_seq: int = -1  # arrival number of the held message
    video: VideoFeed | None = None  # CompressedVideo streams: decodes every message in arrival order

    def __post_init__(self) -> None:
        if self.spec.msg_type == "CompressedVideo" and self.video is None:
            self.video = VideoFeed()

    def begin_episode(self) -> None:
        self.overflow = 0
        self.latency = []
        self.held = None
        self.held_seq = -1

    def placeholder(self) -> NDArray[np.generic]:
        """What a row holds before the stream delivered anything."""
        s = self.spec
        if s.is_camera:
            return np.zeros((s.height, s.width, 3), np.uint8)
        return np.zeros(s.width_values, np.float32)


def states_for(specs: list[StreamSpec]) -> list[StreamState]:
    return [StreamState(s) for s in specs]
