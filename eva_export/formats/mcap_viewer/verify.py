"""Verifier of the ``mcap_foxglove`` format: every message of every file decoded by the viewers'
own decoder libraries (mcap-protobuf-support for the cameras, mcap-ros2-support for the
JointState channels), with CRCs checked, and every camera's frames decoded (PyAV for H.264,
PNG and JPEG). It compares counts, sequences, stamps, frame ids, joint names and frame sizes
with the subset's own metadata; a damaged or truncated file is refused."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
from mcap.exceptions import McapError
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoders
from mcap_ros2.decoder import DecoderFactory as Ros2Decoders

from ...errors import ExportError
from ..common.checks import check_sample, check_totals, read_episode_rows, start_report
from ..common.exporter import VerifyReport
from ..common.images import decode_png
from ..common.records import DatasetInfo, EpisodeRow
from ..lerobot_v21.episode_files import episode_file
from ..lerobot_v21.subset import state_action_keys
from .layout import (
    EPISODE_TOPIC,
    FORMAT,
    IMAGE_SCHEMA,
    JOINT_SCHEMA,
    METADATA_NAME,
    PROFILE,
    STRING_SCHEMA,
    VIDEO_SCHEMA,
    dimension_names,
    frame_time_ns,
    numeric_keys,
    topic,
)
from .record import record_of_text


@dataclass
class _Camera:
    """One camera channel while its file is read: counts, and an H.264 decoder when it is video."""

    key: str
    shape: tuple[int, int]
    messages: int = 0
    frames: int = 0
    first: Any = None
    codec: Any = None


@dataclass
class _Scan:
    """What one episode file holds."""

    cameras: dict[str, _Camera]
    joints: dict[str, list[str]]  # topic's feature -> expected names
    counts: dict[str, int] = field(default_factory=dict)
    first_values: dict[str, list[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def verify_viewer(root: Path) -> VerifyReport:
    report, info = start_report(root, FORMAT, embedded_images=True)
    if info is None:
        return report
    feats = DatasetInfo.from_dict(info)
    state_key, action_key = state_action_keys(feats)
    episodes = read_episode_rows(root, report)
    n_err, rows_total = len(report.errors), 0
    sample: list[Any] = [None, None, None]
    for ep in episodes:
        path = root / episode_file(info, ep.episode_index)
        scan = _Scan({k: _Camera(k, feats.features[k].shape[:2]) for k in feats.visual_keys},  # type: ignore[arg-type]
                     {k: dimension_names(k, feats.features[k]) for k in numeric_keys(feats.features)})
        try:
            _read_file(path, scan, ep, int(feats.fps))
        except (OSError, McapError, ValueError, KeyError, ExportError, av.FFmpegError) as exc:
            report.errors.append(f"{path}: unreadable, damaged or CRC mismatch ({type(exc).__name__}: {exc})")
            continue
        report.errors.extend(f"{path.name}: {p}" for p in scan.problems)
        rows_total += min((scan.counts.get(k, 0) for k in [*scan.cameras, *scan.joints]), default=0)
        if sample[0] is None and state_key in scan.first_values and action_key in scan.first_values:
            sample[:2] = scan.first_values[state_key], scan.first_values[action_key]
        if sample[2] is None and scan.cameras:
            sample[2] = next(iter(scan.cameras.values())).first
    if len(report.errors) == n_err:
        report.checks.append(
            f"{len(episodes)} MCAP files: CRCs valid, profile {PROFILE}, every message decoded by "
            f"mcap-protobuf-support / mcap-ros2-support; cameras {feats.visual_keys} decode to one frame per row; "
            f"JointState channels {numeric_keys(feats.features)} with their names; sequences and stamps on the fps grid")
    check_totals(report, info, len(episodes), rows_total, "the MCAP files")
    check_sample(report, sample[0], sample[1], sample[2], where="episode 0 (mcap reader with the protobuf and ROS 2 decoders)",
                 empty=not episodes)
    return report


def _read_file(path: Path, scan: _Scan, ep: EpisodeRow, fps: int) -> None:
    with open(path, "rb") as fh:
        reader = make_reader(fh, validate_crcs=True, decoder_factories=[ProtobufDecoders(), Ros2Decoders()])
        if reader.get_header().profile != PROFILE:
            scan.problems.append(f"profile {reader.get_header().profile!r}, expected {PROFILE!r}")
        _check_metadata(reader, scan, ep)
        for schema, channel, message, decoded in reader.iter_decoded_messages(log_time_order=False):
            key = channel.topic.removeprefix("/")
            n = scan.counts.get(key, 0)
            scan.counts[key] = n + 1
            want = 0 if channel.topic == EPISODE_TOPIC else frame_time_ns(n, fps)
            if message.sequence != n or message.log_time != want or message.publish_time != want:
                raise ExportError(f"{channel.topic} message {n}: sequence {message.sequence}, log_time "
                                  f"{message.log_time}; expected {n} at {want} ns")
            if channel.topic == EPISODE_TOPIC and schema is not None and schema.name == STRING_SCHEMA:
                _episode_message(scan, decoded.data, ep)
            elif key in scan.cameras and schema is not None and schema.name in (VIDEO_SCHEMA, IMAGE_SCHEMA):
                _camera_message(scan.cameras[key], schema.name, decoded, message.log_time)
            elif key in scan.joints and schema is not None and schema.name == JOINT_SCHEMA:
                _joint_message(scan, key, decoded, message.log_time)
            else:
                raise ExportError(f"unexpected channel {channel.topic} (schema {schema.name if schema else None})")
    _check_counts(scan, ep)


def _check_metadata(reader: Any, scan: _Scan, ep: EpisodeRow) -> None:
    records = [m for m in reader.iter_metadata() if m.name == METADATA_NAME]
    if len(records) != 1:
        scan.problems.append(f"{len(records)} {METADATA_NAME} metadata records, expected 1")
        return
    got = records[0].metadata
    if json.loads(got.get("episode_index", "null")) != ep.episode_index or json.loads(
            got.get("length", "null")) != ep.length:
        scan.problems.append(f"{METADATA_NAME} names episode {got.get('episode_index')} length "
                             f"{got.get('length')}, episodes.jsonl {ep.episode_index} length {ep.length}")
    if "subset" not in got or "tasks" not in got:
        scan.problems.append(f"{METADATA_NAME} lacks the subset or the tasks")


def _episode_message(scan: _Scan, text: str, ep: EpisodeRow) -> None:
    """The text of ``/eva_export/episode``: its JSON record names this episode."""
    try:
        record = record_of_text(text)
    except (IndexError, ValueError) as exc:
        raise ExportError(f"{EPISODE_TOPIC}: no episode record in its text ({exc})") from exc
    if record.get("episode_index") != ep.episode_index or record.get("length") != ep.length:
        scan.problems.append(f"{EPISODE_TOPIC} names episode {record.get('episode_index')} length "
                             f"{record.get('length')}, episodes.jsonl {ep.episode_index} length {ep.length}")


def _stamp_ns(msg: Any) -> int:
    if hasattr(msg, "header"):  # ROS 2 JointState
        return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
    return int(msg.timestamp.ToNanoseconds())


def _camera_message(cam: _Camera, schema: str, msg: Any, log_time: int) -> None:
    where = f"{topic(cam.key)} message {cam.messages}"
    cam.messages += 1
    if _stamp_ns(msg) != log_time or msg.frame_id != cam.key:
        raise ExportError(f"{where}: timestamp {_stamp_ns(msg)} / frame_id {msg.frame_id!r}, "
                          f"expected {log_time} / {cam.key!r}")
    if schema == VIDEO_SCHEMA:
        if msg.format != "h264":
            raise ExportError(f"{where}: video format {msg.format!r}, expected 'h264'")
        if cam.codec is None:
            cam.codec = av.CodecContext.create("h264", "r")
        for f in cam.codec.decode(av.Packet(msg.data)):
            _frame(cam, f, where)
    else:
        if msg.format not in ("png", "jpeg"):
            raise ExportError(f"{where}: image format {msg.format!r}, expected png or jpeg")
        _frame(cam, decode_png(msg.data, where), where)


def _frame(cam: _Camera, frame: Any, where: str) -> None:
    """One decoded frame (a PyAV frame, or RGB pixels): its size checked; the first kept as RGB
    for the real read (converting every frame would only cost time)."""
    h, w = (frame.height, frame.width) if isinstance(frame, av.VideoFrame) else frame.shape[:2]
    if (h, w) != tuple(cam.shape):
        raise ExportError(f"{where}: frame {w}x{h}, the feature is {cam.shape[1]}x{cam.shape[0]}")
    cam.frames += 1
    if cam.first is None:
        cam.first = frame.to_ndarray(format="rgb24") if isinstance(frame, av.VideoFrame) else np.asarray(frame)


def _joint_message(scan: _Scan, key: str, msg: Any, log_time: int) -> None:
    names = scan.joints[key]
    if _stamp_ns(msg) != log_time or list(msg.name) != names or len(msg.position) != len(names):
        raise ExportError(f"{topic(key)} message {scan.counts[key] - 1}: stamp {_stamp_ns(msg)}, names "
                          f"{list(msg.name)[:4]}, {len(msg.position)} positions; expected {log_time}, "
                          f"{names[:4]}, {len(names)}")
    if key not in scan.first_values:
        scan.first_values[key] = list(msg.position)


def _check_counts(scan: _Scan, ep: EpisodeRow) -> None:
    """One message per row on every channel, and every camera's messages decode to as many frames."""
    for cam in scan.cameras.values():
        if cam.codec is not None:
            for f in cam.codec.decode(None):  # frames the decoder still holds
                _frame(cam, f, f"{topic(cam.key)} (end)")
    if scan.counts.get(EPISODE_TOPIC.removeprefix("/"), 0) != 1:
        scan.problems.append(f"{EPISODE_TOPIC}: {scan.counts.get(EPISODE_TOPIC.removeprefix('/'), 0)} messages, expected 1")
    for key in [*scan.cameras, *scan.joints]:
        if scan.counts.get(key, 0) != ep.length:
            scan.problems.append(f"{topic(key)}: {scan.counts.get(key, 0)} messages, episode length {ep.length}")
    for cam in scan.cameras.values():
        if cam.frames != cam.messages:
            scan.problems.append(f"{topic(cam.key)}: {cam.messages} messages decode to {cam.frames} frames")
