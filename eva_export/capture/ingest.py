"""Bag ingest: a rosbag2 (MCAP) recording becomes raw v2.1 episodes, without ROS.

The bag is streamed record by record (``mcap.stream_reader.StreamReader``: file order, which is
the order the recorder received the messages in; memory does not grow with the bag) and CDR is
decoded with the schemas stored in the bag (mcap-ros2-support). Every configured stream's
messages go through the same functions as live capture: ``intake.converter`` builds the payload,
the stream's ``ClockOffset`` places it, and ``EpisodeRun`` (episode.py) aligns, checks, writes
and commits it. Time: the bag's log time plays the capture node's receive clock; header stamps
are used where messages have them (the same rule as live capture).

Episodes: one per bag (default), explicit ranges (seconds from the first message), or a marker
topic (``capture.ingest_marker_topic``: std_msgs/String "start"/"stop", std_msgs/Bool, or the
capture node's own ``~/status`` CaptureStatus, found by its type when no topic is configured).

Resumable: every committed episode's row names its source (bag path and episode ordinal); a
re-run skips those. A partly written episode is never visible (the writer's staging + journal).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import CollectionConfig, check_name
from ..errors import EvaError
from ..formats.lerobot_v21.writer import DatasetWriter
from ..formats.rosbag2.files import IngestError, bag_channels, open_bag
from ..formats.rosbag2.reader import BagMessage, BagReader
from .align import STOP_BUDGET_S
from .episode import EpisodeRun
from .features import capture_features, video_settings
from .intake import Convert, converter, streams_from_config
from .save_worker import save_seam
from .stream import StreamState, states_for

__all__ = ["CAPTURE_STATUS_TYPE", "MARKER_TYPES", "SOURCE_KEY", "BagIngest", "BagMessage", "BagReader", "EpisodePlan",
           "IngestError", "IngestProgress", "open_bag"]

log = logging.getLogger(__name__)

CAPTURE_STATUS_TYPE = "eva_export_interfaces/msg/CaptureStatus"
MARKER_TYPES = ("std_msgs/msg/String", "std_msgs/msg/Bool", CAPTURE_STATUS_TYPE)
#: Row key naming where an ingested episode came from (also what makes a re-run resume).
SOURCE_KEY = "ingest_source"
_START_WORDS = {"start", "begin", "record", "recording"}
_STOP_WORDS = {"stop", "end", "idle", "cancel", "saving", "done"}


# ---- what to cut -------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodePlan:
    mode: str = "bag"  # "bag", "ranges" or "marker"
    ranges: tuple[tuple[float, float], ...] = ()  # seconds from the bag's first message

    @classmethod
    def parse(cls, spec: str) -> EpisodePlan:
        """``""``/``bag``: one episode; ``ranges:T0-T1,...``: seconds from bag start; ``marker``."""
        spec = (spec or "").strip()
        if spec in ("", "bag"):
            return cls()
        if spec == "marker":
            return cls("marker")
        if spec.startswith("ranges:"):
            out = []
            for part in spec[len("ranges:"):].split(","):
                try:
                    a, b = (float(x) for x in part.strip().split("-"))
                except ValueError:
                    raise IngestError(f"episode range {part!r} is not T0-T1 (seconds from bag start)") from None
                if not 0 <= a < b:
                    raise IngestError(f"episode range {part!r}: need 0 <= T0 < T1")
                out.append((a, b))
            out.sort()
            if any(out[k][0] < out[k - 1][1] for k in range(1, len(out))):
                raise IngestError(f"episode ranges overlap: {spec!r}")
            return cls("ranges", tuple(out))
        raise IngestError(f"episodes {spec!r}: use '' (one per bag), 'ranges:T0-T1,...' or 'marker'")


# ---- the run ----------------------------------------------------------------------------------
@dataclass
class IngestProgress:
    messages_done: int = 0
    episodes_done: int = 0
    episodes_skipped: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    episodes: list[dict[str, Any]] = field(default_factory=list)  # index, frames, quality, codes
    damage: str = ""
    message: str = ""


def _marker_state(type_name: str, msg: Any) -> bool | None:
    """True: recording, False: not, None: no opinion (an unknown String word)."""
    if type_name == CAPTURE_STATUS_TYPE:
        return str(msg.state) == "RECORDING"
    if type_name == "std_msgs/msg/Bool":
        return bool(msg.data)
    word = str(getattr(msg, "data", "")).strip().lower()
    return True if word in _START_WORDS else False if word in _STOP_WORDS else None


@dataclass
class _Cuts:
    """The episodes of one ingest run as the cuts open and close them."""

    states: list[StreamState]
    dw: DatasetWriter
    done: dict[int, int]  # episode ordinals committed by an earlier run of this ingest -> index
    run: EpisodeRun | None = None  # recording
    closing: EpisodeRun | None = None  # stopped, taking the messages still in flight
    ordinal: int = -1
    skipping: bool = False  # an episode already committed by an earlier run of this ingest
    first_t: float | None = None
    last_t: float = 0.0
    next_range: int = 0
    marker_on: bool = False


class BagIngest:
    """One ingest of one bag into one dataset (synchronous; run it in a thread if needed)."""

    def __init__(self, col: CollectionConfig, bag_path: Path | str, dataset_name: str = "", task: str = "",
                 episodes: str = "", *, writer_for: Callable[[str], DatasetWriter | None] | None = None,
                 progress: Callable[[IngestProgress], None] | None = None, roots: list[Path] | None = None) -> None:
        self.col = col
        spec = col.task_for(check_name(dataset_name) if dataset_name else "", "")
        self.dataset_name = dataset_name or spec.dataset_name
        self.task = task or next((t.task for t in col.tasks if t.dataset_name == self.dataset_name), spec.task)
        self.plan = EpisodePlan.parse(episodes)
        self.specs = streams_from_config(col)
        if not self.specs:
            raise IngestError("collection.streams configures no stream to ingest")
        self.bag = open_bag(bag_path, roots)  # every file inside the ingest roots (default: the bag's directory)
        self.source = os.path.realpath(self.bag.path)
        self.writer_for = writer_for or self._open_writer
        self.on_progress = progress
        self.progress = IngestProgress(bytes_total=self.bag.size)
        self.marker_topic = col.capture.ingest_marker_topic
        # diagnostic knob shared with live capture: slow every save down (tests kill the process
        # between episodes to show that a re-run resumes)
        self.save_delay_s = save_seam()[0]
        self._check_topics()

    def _open_writer(self, name: str) -> DatasetWriter:
        return DatasetWriter.open(self.col.dataset_dir(name), fps=self.col.fps, features=capture_features(self.col),
                                  robot_type=self.col.robot_type, settings=video_settings(self.col.capture))

    def _check_type(self, topic: str, type_name: str) -> None:
        for s in self.specs:
            if s.topic == topic and type_name != s.ros_type:
                raise IngestError(f"topic {topic} ({s.name}) is {type_name or 'untyped'} in the bag, "
                                  f"the config expects {s.ros_type}")
        if self.plan.mode == "marker" and topic == self.marker_topic and type_name not in MARKER_TYPES:
            raise IngestError(f"marker topic {topic} is {type_name}; expected one of {MARKER_TYPES}")

    def _check_topics(self) -> None:
        """Before anything is written: every configured topic is in the bag with its type."""
        channels = bag_channels(self.bag)
        if channels is None:
            return  # a damaged bag without summary: checked as messages come (missing -> red)
        for s in self.specs:
            if s.topic not in channels:
                raise IngestError(f"topic {s.topic} ({s.name}, {s.ros_type}) is not in the bag "
                                  f"{self.bag.path}; its topics: {sorted(channels)}")
            self._check_type(s.topic, channels[s.topic])
        if self.plan.mode == "marker":
            if not self.marker_topic:
                found = [t for t, ty in channels.items() if ty == CAPTURE_STATUS_TYPE]
                if not found:
                    raise IngestError("episodes=marker: collection.capture.ingest_marker_topic is not set and "
                                      "the bag has no capture node status topic (CaptureStatus)")
                self.marker_topic = found[0]
            elif self.marker_topic not in channels:
                raise IngestError(f"marker topic {self.marker_topic} is not in the bag; its topics: "
                                  f"{sorted(channels)}")
            self._check_type(self.marker_topic, channels[self.marker_topic])

    # ---- driving episodes --------------------------------------------------------------------
    def run(self) -> IngestProgress:
        col = self.col
        states = states_for(self.specs)
        convert = [converter(s) for s in self.specs]
        index = {s.topic: i for i, s in enumerate(self.specs)}
        topics = set(index) | ({self.marker_topic} if self.marker_topic else set())
        dw = self.writer_for(self.dataset_name)
        if dw is None:
            raise EvaError(f"dataset {self.dataset_name!r} cannot be opened for writing")
        with dw.lock:
            done = {int(e.extra[SOURCE_KEY]["episode"]): e.episode_index for e in dw.episodes
                    if isinstance(e.extra.get(SOURCE_KEY), dict) and e.extra[SOURCE_KEY].get("bag") == self.source}
        tol = col.capture.skew_tolerance_s or 0.5 / col.fps
        reader = BagReader(self.bag, topics, self._check_type)
        c = _Cuts(states, dw, done)
        p = self.progress
        try:
            self._drive(c, reader, convert, index, tol)
            p.damage = reader.damage
            if c.run is not None:
                self._stop(c, c.last_t if self.plan.mode != "ranges" else min(c.last_t, c.first_t + self.plan.ranges[c.next_range][1]))  # type: ignore[operator]
            if c.closing is not None:
                if reader.damage:
                    c.closing.checker.on_source_damage(reader.damage)
                self._finish(c.closing)
                c.closing = None
        except BaseException:
            for ep in (c.run, c.closing):
                if ep is not None:
                    ep.abort()  # never a partly written episode
            raise
        p.bytes_done = reader.bytes_read
        self._summarize(reader, c.first_t)
        if self.on_progress is not None:
            self.on_progress(p)
        return p

    def _drive(self, c: _Cuts, reader: BagReader, convert: list[Convert],
               index: dict[str, int], tol: float) -> None:
        """Every wanted message in log-time order: cut episodes, then the live path."""
        p = self.progress
        last_report = 0.0
        for m in reader:
            t = m.log_time
            p.messages_done += 1
            if c.closing is not None:
                # as the live worker: the clock (here: this message's arrival) emits what it made
                # final first; a finished episode takes no more messages
                c.closing.poll(t)
                if c.closing.aligner.done() or t > c.closing.t_stop + tol + STOP_BUDGET_S + 0.05:  # type: ignore[operator]
                    self._finish(c.closing)
                    c.closing = None
            i = index.get(m.topic)
            if c.first_t is None and i is not None:
                c.first_t = t
            self._cut(c, m, i, t)
            if i is None:
                continue
            c.last_t = t
            # ---- the live path: count, place on the stream's clock, push in receive order
            st = c.states[i]
            st.received += 1
            stamp, payload = convert[i](m.msg)
            if st.video is not None:
                payload = self._decode_video(st, m, reader, payload)
            t_src = st.offset.observe(t, stamp)
            for ep in (c.closing, c.run):
                if ep is not None:
                    ep.poll(t)
                    ep.push(i, t, stamp, payload, t_src)
            if self.on_progress is not None and time.monotonic() - last_report > 0.5:
                last_report = time.monotonic()
                p.bytes_done = reader.bytes_read
                self.on_progress(p)

    def _decode_video(self, st: StreamState, m: BagMessage, reader: BagReader, payload: Any) -> Any:
        """An H.264 message decoded (every one, in file order: inside an episode or not)."""
        assert st.video is not None
        try:
            return st.video.take(payload)
        except ValueError as exc:
            raise IngestError(f"bag file {reader.file_name}: topic {m.topic} ({st.spec.name}): {exc}") from exc

    def _cut(self, c: _Cuts, m: BagMessage, i: int | None, t: float) -> None:
        """Open and close episodes as the plan says (marker changes, the bag, the ranges)."""
        if self.plan.mode == "marker" and m.topic == self.marker_topic:
            on = _marker_state(m.type_name, m.msg)
            if on is not None and on != c.marker_on:
                c.marker_on = on
                if on:
                    self._start(c, t)
                else:
                    self._stop(c, t)
        elif self.plan.mode == "bag":
            if c.ordinal < 0 and i is not None:
                self._start(c, t)
        elif self.plan.mode == "ranges" and c.first_t is not None:
            while c.next_range < len(self.plan.ranges):
                a, b = (c.first_t + x for x in self.plan.ranges[c.next_range])
                if (c.run is not None or c.skipping) and t > b:
                    self._stop(c, b)
                    c.next_range += 1
                    continue
                if c.run is None and not c.skipping and a <= t <= b:
                    self._start(c, a)
                elif c.run is None and not c.skipping and t > b:
                    c.next_range += 1  # a range with no message at all
                    continue
                break

    def _start(self, c: _Cuts, t: float) -> None:
        if c.closing is not None:
            self._finish(c.closing)
            c.closing = None
        c.ordinal += 1
        if c.ordinal in c.done:
            c.skipping = True
            self.progress.episodes_skipped += 1
            return
        c.run = EpisodeRun.begin(self.col, c.states, c.dw, self.dataset_name, self.task, t, 0.0, epoch=c.ordinal)
        c.run.row_extra[SOURCE_KEY] = {"bag": self.source, "episode": c.ordinal, "start_time": t}

    def _stop(self, c: _Cuts, t: float) -> None:
        c.skipping = False
        if c.run is not None:
            c.run.stop(t)
            c.run.row_extra[SOURCE_KEY]["stop_time"] = t
            c.closing, c.run = c.run, None

    def _summarize(self, reader: BagReader, first_t: float | None) -> None:
        p = self.progress
        if reader.backwards and not p.episodes_done and not p.episodes_skipped:
            raise IngestError(f"bag {self.bag.path}: log times run backwards ({reader.backwards} messages earlier than "
                              f"the one before; first: {reader.first_backwards}): its messages are not in receive "
                              f"order, so no episode could be cut; nothing ingested")
        if first_t is None:
            p.message = "the bag holds no message on the configured topics; nothing written"
        else:
            p.message = (f"{p.episodes_done} episodes ingested from {self.bag.path} into {self.dataset_name!r}"
                         + (f", {p.episodes_skipped} already ingested before" if p.episodes_skipped else "")
                         + (f"; {reader.damage}" if reader.damage else "")
                         + (f"; warning: {reader.backwards} messages logged out of order" if reader.backwards else ""))

    def _finish(self, ep: EpisodeRun) -> None:
        ep.finish_slots()
        if ep.writer.rows == 0:
            ep.abort()
            self.progress.episodes.append({"index": -1, "frames": 0, "quality": "empty", "codes": []})
            return
        if self.save_delay_s > 0:
            time.sleep(self.save_delay_s)
        row, result = ep.save()
        if row is not None:
            self.progress.episodes_done += 1
            self.progress.episodes.append({"index": row.episode_index, "frames": row.length,
                                           "quality": result.quality, "codes": result.codes})
            log.info("ingested episode %d: %d frames, %s %s", row.episode_index, row.length, result.quality,
                     result.codes)
        if self.on_progress is not None:
            self.on_progress(self.progress)
