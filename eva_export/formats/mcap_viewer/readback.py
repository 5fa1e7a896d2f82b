"""Every episode file read back before it is renamed into place: each message decoded by the
viewers' own decoder libraries (mcap-protobuf-support, mcap-ros2-support) with CRCs checked,
and compared with the source episode it was written from. Joint values must be equal (NaN
included), copied H.264 packets and Parquet images byte for byte, JPEG frames within
``JPEG_TOLERANCE`` of the decoded source frame. Any difference fails the export naming the
episode and the channel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from mcap.exceptions import McapError
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoders
from mcap_ros2.decoder import DecoderFactory as Ros2Decoders

from ...errors import ExportError
from ..common.images import camera_frames, decode_png
from ..common.meta import DatasetMeta
from ..common.records import EpisodeRow
from ..lerobot_v21.subset import column_numpy
from .cameras import CameraPlan, camera_payloads
from .layout import EPISODE_TOPIC, numeric_keys

# Mean absolute difference per pixel (0-255) between a JPEG frame and its source frame. JPEG
# quality 90 stays near 1-3 on camera content; a wrong or shifted frame is far above.
JPEG_TOLERANCE = 8.0


def check_episode_file(path: Path, meta: DatasetMeta, ep: EpisodeRow, table: pa.Table,
                       plans: list[CameraPlan], text: str) -> None:
    rows = table.num_rows
    values = {k: column_numpy(table, k).reshape(rows, -1).astype(np.float64)
              for k in numeric_keys(meta.info.features)}
    cams = {p.key: p for p in plans}
    sources: dict[str, Iterator[Any]] = {
        p.key: (camera_frames(meta, ep.episode_index, table, p.key) if p.carrier == "jpeg encode"
                else camera_payloads(meta, ep.episode_index, table, p)) for p in plans}
    counts = dict.fromkeys([*values, *cams, EPISODE_TOPIC.removeprefix("/")], 0)
    name = path.name.removeprefix(".").removesuffix(".partial")  # the file it becomes
    where = f"episode {ep.episode_index}: {name} read back"
    try:
        with open(path, "rb") as fh:
            reader = make_reader(fh, validate_crcs=True, decoder_factories=[ProtobufDecoders(), Ros2Decoders()])
            for _schema, channel, message, decoded in reader.iter_decoded_messages(log_time_order=False):
                key = channel.topic.removeprefix("/")
                if key not in counts or message.sequence != counts[key]:
                    raise ExportError(f"{where}: unexpected {channel.topic} message {message.sequence}")
                counts[key] += 1
                if channel.topic == EPISODE_TOPIC:
                    if decoded.data != text:
                        raise ExportError(f"{where}: {EPISODE_TOPIC} does not hold the episode's record")
                elif key in values:
                    _same_values(np.asarray(decoded.position, np.float64), values[key][message.sequence],
                                 f"{where}: {channel.topic} frame {message.sequence}")
                else:
                    _same_frame(cams[key], decoded, next(sources[key], None),
                                f"{where}: {channel.topic} frame {message.sequence}")
    except (OSError, McapError, ValueError, KeyError) as exc:
        raise ExportError(f"{where}: unreadable ({type(exc).__name__}: {exc})") from exc
    finally:
        for it in sources.values():
            getattr(it, "close", lambda: None)()
    short = {k: n for k, n in counts.items() if n != (1 if "/" + k == EPISODE_TOPIC else rows)}
    if short:
        raise ExportError(f"{where}: message counts {short}, the table has {rows} rows")


def _same_values(got: Any, want: Any, where: str) -> None:
    if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
        raise ExportError(f"{where}: values {got[:4].tolist()} differ from the source's {want[:4].tolist()}")


def _same_frame(plan: CameraPlan, msg: Any, source: Any, where: str) -> None:
    if source is None:
        raise ExportError(f"{where}: the source has no such frame")
    if plan.carrier == "jpeg encode":
        diff = float(np.abs(decode_png(msg.data, where).astype(np.int16) - np.asarray(source, np.int16)).mean())
        if diff > JPEG_TOLERANCE:
            raise ExportError(f"{where}: JPEG frame differs from the source frame by {diff:.1f} per pixel "
                              f"(tolerance {JPEG_TOLERANCE})")
    elif (msg.format, msg.data) != source:
        raise ExportError(f"{where}: {msg.format} bytes differ from the source's {source[0]} bytes")
