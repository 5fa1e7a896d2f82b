"""Camera messages of the viewer profile: the source's H.264 packets copied into
``foxglove.CompressedVideo``, or still images in ``foxglove.CompressedImage``.

Viewers play CompressedVideo only for streams without B-frames (Foxglove decodes frame by frame,
with no lookahead), so a camera is copied only when its MP4 is H.264 and its packets come in
presentation order; any other camera (AV1, B-frames, PNG columns) becomes CompressedImage:
PNG or JPEG bytes of a Parquet image column copied as they are, other video decoded and
encoded to JPEG.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import simplejpeg
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from mcap_protobuf.schema import build_file_descriptor_set

from ...errors import ExportError, VideoError
from ..common.images import camera_frames
from ..common.meta import DatasetMeta
from .layout import IMAGE_SCHEMA, VIDEO_SCHEMA

JPEG_QUALITY = 90  # the still-image fallback: about 45 dB PSNR on camera frames, 1/10 of PNG's size
_MAGIC = {b"\x89PNG": "png", b"\xff\xd8": "jpeg"}


@dataclass(frozen=True)
class CameraPlan:
    """How one camera of one episode is carried."""

    key: str
    schema: str  # VIDEO_SCHEMA or IMAGE_SCHEMA
    carrier: str  # "h264 copy", "image copy" or "jpeg encode"
    source: Path | None  # the MP4, when the frames come from one


def schema_data(schema: str) -> bytes:
    """The FileDescriptorSet embedded in the file for ``schema``."""
    cls = CompressedVideo if schema == VIDEO_SCHEMA else CompressedImage
    data: bytes = build_file_descriptor_set(cls).SerializeToString()
    return data


def plan_camera(meta: DatasetMeta, episode_index: int, key: str) -> CameraPlan:
    if meta.info.features[key].dtype == "image":
        return CameraPlan(key, IMAGE_SCHEMA, "image copy", None)
    path = meta.video_path(key, episode_index)
    if _h264_in_order(path):
        return CameraPlan(key, VIDEO_SCHEMA, "h264 copy", path)
    return CameraPlan(key, IMAGE_SCHEMA, "jpeg encode", path)


def _h264_in_order(path: Path) -> bool:
    """H.264 without B-frames or a reorder delay: each packet decodes to its own frame at once."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if stream.codec_context.codec.name != "h264" or stream.codec_context.has_b_frames:
                return False
            last = None
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                if packet.pts is None or (last is not None and packet.pts <= last):
                    return False
                last = packet.pts
    except (av.FFmpegError, IndexError) as exc:
        raise ExportError(f"{path}: cannot read the camera file ({exc})") from exc
    return True


def annexb_packets(path: Path) -> Iterator[bytes]:
    """The MP4's H.264 packets in Annex B (``h264_mp4toannexb``: start codes, SPS/PPS before
    each keyframe), one access unit each: the bitstream copied, never decoded."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            bsf = av.BitStreamFilterContext("h264_mp4toannexb", stream)
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                for out in bsf.filter(packet):
                    yield bytes(out)
            for out in bsf.filter(None):
                yield bytes(out)
    except av.FFmpegError as exc:
        raise VideoError(f"cannot read the H.264 packets of {path}: {exc}") from exc


def _table_images(table: pa.Table, key: str, episode_index: int) -> Iterator[tuple[str, bytes]]:
    col = table.column(key)
    for i in range(table.num_rows):
        value = col[i].as_py()
        data = value.get("bytes") if isinstance(value, dict) else value
        fmt = next((f for m, f in _MAGIC.items() if isinstance(data, bytes) and data.startswith(m)), None)
        if fmt is None or not isinstance(data, bytes):
            raise ExportError(f"episode {episode_index}: {key} row {i} holds no PNG or JPEG image bytes")
        yield fmt, data


def camera_payloads(meta: DatasetMeta, episode_index: int, table: pa.Table,
                    plan: CameraPlan) -> Iterator[tuple[str, bytes]]:
    """(format, data) of every frame of one camera, in frame order."""
    if plan.carrier == "image copy":
        return _table_images(table, plan.key, episode_index)
    if plan.carrier == "h264 copy" and plan.source is not None:
        return (("h264", p) for p in annexb_packets(plan.source))
    frames = camera_frames(meta, episode_index, table, plan.key)
    return (("jpeg", _jpeg(f)) for f in frames)


def _jpeg(frame: Any) -> bytes:
    data: bytes = simplejpeg.encode_jpeg(np.ascontiguousarray(frame), quality=JPEG_QUALITY, colorspace="RGB")
    return data


def camera_message(schema: str, frame_id: str, stamp_ns: int, fmt: str, data: bytes) -> bytes:
    msg: Any = (CompressedVideo if schema == VIDEO_SCHEMA else CompressedImage)(
        frame_id=frame_id, data=data, format=fmt)
    msg.timestamp.FromNanoseconds(stamp_ns)
    out: bytes = msg.SerializeToString()
    return out
