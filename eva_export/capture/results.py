"""The replies and status values of the capture engine (Recorder), as the node serves them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StartResult:
    ok: bool
    message: str
    dataset_name: str = ""
    dataset_dir: str = ""
    task: str = ""


@dataclass(frozen=True)
class StopResult:
    ok: bool
    message: str
    episode_index: int = -1
    frames: int = 0
    save_queue_depth: int = 0
    take_id: str = ""  # the take's id (its row's take_id): a review naming it lands on it or is refused


@dataclass(frozen=True)
class CancelResult:
    ok: bool
    message: str
    frames_discarded: int = 0


@dataclass
class StreamStatus:
    name: str
    topic: str
    received: int
    dropped: int
    rate_hz: float
    late: int = 0
    jitter_p50_ms: float = 0.0
    jitter_p99_ms: float = 0.0
    max_gap_ms: float = 0.0


@dataclass
class Status:
    state: str
    dataset_name: str
    dataset_dir: str
    task: str
    frames: int
    save_queue_depth: int
    save_queue_capacity: int
    streams: list[StreamStatus]
    last_episode_index: int
    last_episode_quality: str
    last_message: str
    last_take_id: str = ""
