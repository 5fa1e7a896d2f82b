"""MCAP (eva-client profile): one message log per episode, images embedded as MessagePack.

(Named ``mcap_eva`` so it does not shadow the ``mcap`` package.)

``data/chunk-XXX/episode_NNNNNN.mcap``:

* Header: profile "eva-client", library "eva-client". Not a ROS 2 bag: no ros2msg schemas,
  no CDR; ROS 2 bag readers refuse it.
* Schemas: "eva_client.episode" and "eva_client.image", encoding "jsonschema", data = a JSON
  Schema of the MessagePack-decoded payload. The schema is a descriptor for consumers; the
  payloads themselves are MessagePack (channel message_encoding "messagepack").
* Channel "episode" (metadata {"fps", "dataset_format"}): one message, log_time 0, sequence 0::

      {"columns":  {name: list, one value per frame},      # every non-image table column
       "images":   {name: [frame, ...]},                   # inline image columns; {} for video datasets
       "metadata": {...episode row, "fps": fps}}

* Channel "episode/image/<video_key>" per camera (metadata {"key", "height", "width",
  "encoding"}): one message per frame::

      {"frame_index": i, "timestamp": i / fps (the table's timestamp), "height": H, "width": W,
       "encoding": "rgb8", "step": W * 3, "data": H*W*3 bytes, row-major RGB}

  sequence = i, log_time = publish_time = (i + 1) * 1_000_000_000 // fps ns (integer math; the
  first frame at one frame period), identical for every camera at frame i; messages are
  written in time order, cameras interleaved frame by frame.

Chunked (4 MiB chunks) with message indexes, summary and CRCs; chunk compression lz4 by
default (``McapOptions.compression``, config ``export.formats.mcap.compression``: "lz4" | "zstd" | "none";
the eva-client profile fixes the records, not the chunk compression). lz4 is the fastest of
the compressions that still shrinks raw RGB, but it binds the export to the CPU (about 3.4
CPU-s per GB of frames here): "none" writes the frames at the disk's speed. Written by
``mcap_chunks.ChunkWriter`` (chunks compressed on a small pool off the writer's thread, in
order, a bounded number in flight; frames written or compressed from the decoder's own
buffers, never copied), read back with mcap's own reader.

Each file is written as ``.episode_NNNNNN.mcap.partial`` and renamed when closed (resumable,
like the HDF5 exporter). A camera that ends before the table's rows, or has frames after
them, fails the export with ExportError.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from mcap.exceptions import McapError
from mcap.reader import make_reader
from numpy.typing import NDArray

from ...errors import ExportError, VideoError
from ..common.checks import check_sample, check_totals, read_episode_rows, start_report
from ..common.exporter import Progress, VerifyReport
from ..common.images import Prefetch, camera_frames
from ..common.mcap_summary import channel_counts
from ..common.meta import DatasetMeta
from ..common.records import DatasetInfo, EpisodeRow
from ..common.train_checks import ValueCheck, check_stats
from ..lerobot_v21.episode_files import episode_file, export_episode_files, to_plain
from ..lerobot_v21.subset import column_numpy, state_action_keys
from .chunks import ChunkWriter
from .options import McapOptions

FORMAT = "mcap"
PROFILE = "eva-client"
LIBRARY = "eva-client"
MESSAGE_ENCODING = "messagepack"
SCHEMA_ENCODING = "jsonschema"
EPISODE_SCHEMA = "eva_client.episode"
IMAGE_SCHEMA = "eva_client.image"
EPISODE_TOPIC = "episode"
IMAGE_TOPIC = "episode/image/{key}"
CHUNK_SIZE = 4 * 1024 * 1024
_COMPRESSION = {"lz4": "lz4", "zstd": "zstd", "none": ""}  # option -> the chunk record's compression

EPISODE_JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": EPISODE_SCHEMA,
    "description": "MessagePack payload: one episode's non-image columns, inline image columns and metadata",
    "type": "object",
    "properties": {
        "columns": {"type": "object", "additionalProperties": {"type": "array"}},
        "images": {"type": "object", "additionalProperties": {"type": "array"}},
        "metadata": {"type": "object", "properties": {"episode_index": {"type": "integer"},
                                                      "length": {"type": "integer"},
                                                      "fps": {"type": "integer"}}},
    },
    "required": ["columns", "images", "metadata"],
}
IMAGE_JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": IMAGE_SCHEMA,
    "description": "MessagePack payload: one camera frame, raw row-major RGB (data is MessagePack bin)",
    "type": "object",
    "properties": {
        "frame_index": {"type": "integer"}, "timestamp": {"type": "number"},
        "height": {"type": "integer"}, "width": {"type": "integer"},
        "encoding": {"const": "rgb8"}, "step": {"type": "integer"},
        "data": {"description": "height*step bytes"},
    },
    "required": ["frame_index", "timestamp", "height", "width", "encoding", "step", "data"],
}


def frame_time_ns(frame_index: int, fps: int) -> int:
    """log_time / publish_time of frame ``frame_index``: one frame period after the previous."""
    return (frame_index + 1) * 1_000_000_000 // fps


def image_topic(key: str) -> str:
    return IMAGE_TOPIC.format(key=key)


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return struct.pack(">BB", 0xC4, n)
    if n < 1 << 16:
        return struct.pack(">BH", 0xC5, n)
    return struct.pack(">BI", 0xC6, n)


def image_head(frame_index: int, fps: int, frame: NDArray[Any]) -> bytes:
    """The MessagePack image payload up to the pixels: head + the frame's bytes is the payload."""
    h, w = frame.shape[:2]
    packer = msgpack.Packer(use_bin_type=True)
    head = packer.pack_map_header(7)
    for key, value in (("frame_index", frame_index), ("timestamp", frame_index / fps), ("height", h),
                       ("width", w), ("encoding", "rgb8"), ("step", w * 3)):
        head += packer.pack(key) + packer.pack(value)
    return b"".join((head, packer.pack("data"), _bin_header(frame.nbytes)))


def pack_image(frame_index: int, fps: int, frame: NDArray[Any]) -> bytearray:
    """The MessagePack image payload, built with a single copy of the pixels."""
    head = image_head(frame_index, fps, frame)
    out = bytearray(len(head) + frame.nbytes)
    out[:len(head)] = head
    np.copyto(np.frombuffer(out, np.uint8, offset=len(head)).reshape(frame.shape), frame)
    return out


def decode_image(payload: bytes) -> tuple[dict[str, Any], NDArray[Any]]:
    msg = msgpack.unpackb(payload, raw=False)
    img = np.frombuffer(msg["data"], np.uint8).reshape(msg["height"], msg["width"], 3)
    return msg, img


class McapExporter:
    """Write a native v2.1 subset as one eva-client MCAP file per episode."""

    name = FORMAT

    def __init__(self, options: McapOptions = McapOptions(), *, chunk_size: int = CHUNK_SIZE, prefetch: int = 4) -> None:
        compression = options.compression
        if compression not in _COMPRESSION:
            raise ValueError(f"mcap compression {compression!r}: choose one of {sorted(_COMPRESSION)}")
        self.compression = compression
        self.chunk_size = chunk_size
        self.prefetch = prefetch  # frames decoded ahead per camera in a background thread
        self.resumed: list[int] = []

    def export(self, native_subset: Path, out_dir: Path, progress: Progress | None = None) -> None:
        self.resumed = export_episode_files(
            Path(native_subset), Path(out_dir), progress or Progress(), self.name, "mcap",
            write_episode=self._write_episode,
            is_complete=lambda path, meta, ep: _complete(path, ep.length, meta.info.visual_keys))

    def _write_episode(self, tmp: Path, meta: DatasetMeta, ep: EpisodeRow, table: Any) -> str | None:
        """Write one episode file; return the SHA-256 of its bytes (hashed as they were written)."""
        fps = meta.info.fps
        keys = meta.info.visual_keys  # MP4 cameras and images stored in Parquet alike
        with open(tmp, "wb", buffering=0) as fh:  # ChunkWriter writes whole records: no second buffer
            w = ChunkWriter(fh, self.chunk_size, _COMPRESSION[self.compression])
            try:
                w.start(profile=PROFILE, library=LIBRARY)
                ep_schema = w.register_schema(EPISODE_SCHEMA, SCHEMA_ENCODING, json.dumps(EPISODE_JSON_SCHEMA).encode())
                img_schema = w.register_schema(IMAGE_SCHEMA, SCHEMA_ENCODING, json.dumps(IMAGE_JSON_SCHEMA).encode())
                ep_channel = w.register_channel(EPISODE_TOPIC, MESSAGE_ENCODING, ep_schema,
                                                {"fps": str(fps), "dataset_format": FORMAT})
                channels = {}
                for k in keys:
                    h, wd = meta.info.features[k].shape[:2]
                    channels[k] = w.register_channel(image_topic(k), MESSAGE_ENCODING, img_schema,
                                                     {"key": k, "height": str(h), "width": str(wd), "encoding": "rgb8"})
                payload = {
                    "columns": {name: to_plain(column_numpy(table, name)) for name in table.column_names
                                if name not in keys},  # images travel on episode/image/<key>
                    "images": {},
                    "metadata": {**to_plain(ep.to_dict()), "fps": fps},
                }
                w.add_message(ep_channel, 0, 0, 0, msgpack.packb(payload, use_bin_type=True))
                self._write_frames(w, channels, meta, ep, table)
                w.finish()
            finally:
                w.close()
        return w.sha256

    def _write_frames(self, w: ChunkWriter, channels: dict[str, int], meta: DatasetMeta, ep: EpisodeRow,
                      table: Any) -> None:
        """Every camera's frames in time order, interleaved frame by frame."""
        fps, rows = meta.info.fps, table.num_rows
        iters = {k: Prefetch(camera_frames(meta, ep.episode_index, table, k), self.prefetch) for k in channels}
        try:
            for i in range(rows + 1):
                t = frame_time_ns(i, fps)
                for k, it in iters.items():
                    frame = next(it, None)
                    if i == rows:
                        if frame is not None:
                            raise ExportError(f"episode {ep.episode_index}: camera {k} has frames after the "
                                              f"table's {rows} rows")
                        continue
                    if frame is None:
                        raise ExportError(f"episode {ep.episode_index}: camera {k} ends early at frame {i} of {rows}")
                    h, wd = meta.info.features[k].shape[:2]
                    if frame.shape != (h, wd, 3):
                        raise ExportError(f"episode {ep.episode_index}: camera {k} frame {i} has shape "
                                          f"{frame.shape}, the feature is {(h, wd, 3)}")
                    frame = np.ascontiguousarray(frame)
                    # head and pixels go into the chunk as they are: the frame is referenced, not copied
                    w.add_message(channels[k], t, t, i, image_head(i, fps, frame), frame)
        except VideoError as exc:
            raise ExportError(f"episode {ep.episode_index}: {exc}") from exc
        finally:
            for it in iters.values():
                it.close()

    def verify(self, out_dir: Path) -> VerifyReport:
        return verify_mcap(Path(out_dir))


def _complete(path: Path, rows: int, keys: list[str]) -> bool:
    counts = channel_counts(path)
    return counts is not None and counts.get(EPISODE_TOPIC) == 1 and all(counts.get(image_topic(k)) == rows for k in keys)


@dataclass
class _FileScan:
    """What one episode's MCAP file holds (read by ``_scan_file`` for ``verify_mcap``)."""

    seqs: dict[str, list[int]]
    times: dict[str, list[int]]
    sample: tuple[Any, Any, Any]  # (state, action, frame) of the first episode that has them
    meta_msgs: int = 0
    rows: int | None = None
    values: ValueCheck | None = None  # the subset's value checks (train_checks), fed each episode's columns
    episode: int = 0


def verify_mcap(root: Path) -> VerifyReport:
    report, info = start_report(root, FORMAT, embedded_images=True)
    if info is None:
        return report
    fps = int(info["fps"])
    image_keys = [k for k, f in info["features"].items() if f["dtype"] == "image"]
    feats = DatasetInfo.from_dict(info)
    state_key, action_key = state_action_keys(feats)
    episodes = read_episode_rows(root, report)
    n_err = len(report.errors)
    rows_total = 0
    sample: tuple[Any, Any, Any] = (None, None, None)
    values = ValueCheck(root, info)
    for ep in episodes:
        path = root / episode_file(info, ep.episode_index)
        scan = _FileScan({k: [] for k in image_keys}, {k: [] for k in image_keys}, sample)
        scan.values, scan.episode = values, ep.episode_index
        try:
            _scan_file(path, scan, image_keys, fps, state_key, action_key, report)
        except (OSError, McapError, ValueError, KeyError) as exc:
            report.errors.append(f"{path}: unreadable or CRC mismatch ({type(exc).__name__}: {exc})")
            continue
        finally:
            sample = scan.sample  # what was read before a damage counts, as in one pass
        if scan.meta_msgs != 1 or scan.rows is None:
            report.errors.append(f"{path.name}: {scan.meta_msgs} episode metadata messages, expected 1")
            continue
        rows_total += scan.rows
        _check_file(path, scan, scan.rows, ep.length, image_keys, fps, report)
    if len(report.errors) == n_err:
        report.checks.append(f"{len(episodes)} MCAP files: CRCs valid, one episode message each, every "
                             f"camera {image_keys} with sequences 0..n-1 and shared timestamps")
    check_totals(report, info, len(episodes), rows_total, "the MCAP files")
    values.finish(report)
    check_stats(report, root, info, empty=not episodes)
    check_sample(report, *sample, where="episode 0 (mcap reader, validate_crcs=True)", empty=not episodes)
    return report


def _scan_file(path: Path, scan: _FileScan, image_keys: list[str], fps: int, state_key: str | None,
               action_key: str | None, report: VerifyReport) -> None:
    """One pass over an episode file with CRCs checked: its metadata message and camera channels."""
    with open(path, "rb") as fh:
        reader = make_reader(fh, validate_crcs=True)
        header = reader.get_header()
        if header.profile != PROFILE:
            report.errors.append(f"{path.name}: profile {header.profile!r}, expected {PROFILE!r}")
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            if channel.message_encoding != MESSAGE_ENCODING:
                report.errors.append(f"{path.name}: channel {channel.topic} encoding "
                                     f"{channel.message_encoding!r}")
                break
            if channel.topic == EPISODE_TOPIC:
                scan.meta_msgs += 1
                if schema is None or schema.name != EPISODE_SCHEMA:
                    report.errors.append(f"{path.name}: episode channel schema is not {EPISODE_SCHEMA}")
                payload = msgpack.unpackb(message.data, raw=False)
                scan.rows = len(payload["columns"]["index"])
                if scan.values is not None:
                    cols = payload["columns"]
                    scan.values.episode(path.name, scan.episode, {
                        k: cols[k] for k in (*scan.values.floats, "timestamp") if k in cols and cols[k] is not None})
                if payload["metadata"].get("fps") != fps:
                    report.errors.append(f"{path.name}: metadata fps {payload['metadata'].get('fps')}")
                if scan.sample[0] is None and state_key and action_key:
                    scan.sample = (payload["columns"].get(state_key, [None])[0],
                                   payload["columns"].get(action_key, [None])[0], None)
                continue
            key = channel.topic.removeprefix("episode/image/")
            if key not in scan.seqs:
                report.errors.append(f"{path.name}: unexpected channel {channel.topic}")
                continue
            scan.seqs[key].append(message.sequence)
            scan.times[key].append(message.log_time)
            if scan.sample[2] is None and key == image_keys[0]:
                _, img = decode_image(message.data)
                scan.sample = (scan.sample[0], scan.sample[1], img)


def _check_file(path: Path, scan: _FileScan, rows: int, length: int, image_keys: list[str], fps: int,
                report: VerifyReport) -> None:
    """Rows against episodes.jsonl; every camera's sequences 0..n-1 at the shared frame times."""
    if rows != length:
        report.errors.append(f"{path.name}: {rows} rows, episodes.jsonl length {length}")
    want_t = [frame_time_ns(i, fps) for i in range(rows)]
    for key in image_keys:
        if len(scan.seqs[key]) != rows:
            report.errors.append(f"{path.name}: {key} has {len(scan.seqs[key])} messages, {rows} rows")
        elif scan.seqs[key] != list(range(rows)):
            report.errors.append(f"{path.name}: {key} sequences are not 0..{rows - 1}")
        elif scan.times[key] != want_t:
            report.errors.append(f"{path.name}: {key} timestamps are not (i+1)*1e9/fps shared by all cameras")
