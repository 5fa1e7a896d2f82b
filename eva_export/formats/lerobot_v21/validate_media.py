"""Source validation of the media a reader decodes: camera MP4s (frame count, size, and frame
timing against the table) and images embedded in Parquet (each decodes to its declared shape).
Every message names the raw file and the raw episode index."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq

from ...errors import DatasetError, VideoError
from ..common import mp4_index, video_facts
from ..common.facts_index import FileKey
from ..common.meta import INFO, DatasetMeta
from ..common.video import (
    StreamTiming,
    container_timing,
    image_row_problem,
    mp4_truncation,
    mp4_truncation_of,
    stream_frames,
    stream_timing,
    timing_problems,
)
from .read_ahead import Planned


def check_video(meta: DatasetMeta, e: int, rows: int, data_path: Path, key: str, path: Path,
                seen: Planned[video_facts.VideoFacts] | None = None) -> None:
    """Frame count against the rows, frame size against info.json, and every frame's decode and
    presentation time (demuxed, not decoded) against the table's frame i at i / fps.

    The count comes from the container index (the MP4 sample table, exact) when present, else
    from demuxing the packets; a truncated or garbage file is refused from its box structure.
    A file already demuxed in this process, unchanged since (video_facts), is not read again.
    ``seen``: the file as validation's read-ahead looked it up (and maybe read it), unchanged since.
    """
    feat = meta.info.features[key]
    if seen is not None and seen.started():  # its key and lookup from before the read ahead
        fkey, facts = seen.key, seen.known
    else:  # read here, if at all: the identity taken now, just before the read
        fkey = video_facts.file_key(path)
        facts = seen.known if seen is not None and fkey == seen.key else video_facts.lookup(fkey)
    timing: StreamTiming | Exception | None = None
    if facts is not None and facts.fps == meta.info.fps:
        width, height, frames = facts.width, facts.height, facts.frames
    else:
        facts = None
        width, height, frames, timing = demux_size(e, key, path, fkey, seen)
    if frames != rows:
        raise DatasetError(f"episode {e}: {path} ({key}) has {frames} frames but {data_path} has "
                           f"{rows} rows")
    if (height, width) != tuple(feat.shape[:2]):
        raise DatasetError(f"episode {e}: {path} ({key}) is {width}x{height}, but {meta.root / INFO} "
                           f"declares {feat.shape[1]}x{feat.shape[0]}")
    # The table says frame i is shown at i / fps (checked above); a reader seeks the MP4 there.
    if facts is None:
        try:
            if isinstance(timing, Exception):
                raise timing
            timing = stream_timing(path) if timing is None else timing
            problems = tuple(timing_problems(timing, meta.info.fps, rows, check_duration=False))
        except Exception as exc:  # noqa: BLE001 - any demuxer error means an unreadable file
            raise DatasetError(f"episode {e}: {path} ({key}) is not a readable MP4: {exc}") from exc
        facts = video_facts.VideoFacts(width, height, frames, meta.info.fps, problems)
        video_facts.remember(fkey, facts)
    if facts.timing:
        raise DatasetError(f"episode {e}: {path} ({key}): its frame timing disagrees with {data_path} "
                           f"(frame i at i / {meta.info.fps} s from 0): {'; '.join(facts.timing)}")


def demux_size(e: int, key: str, path: Path, fkey: FileKey | None = None,
               seen: Planned[video_facts.VideoFacts] | None = None
               ) -> tuple[int, int, int, StreamTiming | Exception | None]:
    """(width, height, frames, timing) of the file's first video stream; DatasetError naming it
    if unreadable. When the frames come from the index (no packet demuxed yet) the packet timing
    is read in the same open: its failure is returned, for check_video to raise in its turn."""
    return demux_parse(e, key, path, fkey, seen)[0]


def demux_parse(e: int, key: str, path: Path, fkey: FileKey | None = None,
                seen: Planned[video_facts.VideoFacts] | None = None
                ) -> tuple[tuple[int, int, int, StreamTiming | Exception | None], mp4_index.Mp4Samples | None]:
    """``demux_size``, and the box parse it was read from (None: PyAV's path)."""
    # a small file read once for both the box tiling and the index (two opens an MP4 were
    # a tenth of a short episode's validation)
    ahead = seen.read() if seen is not None else None  # read ahead: whole, at the size looked up
    data = ahead.data if ahead is not None else mp4_index.file_bytes(path)
    why = mp4_truncation(path) if data is None else mp4_truncation_of(data)
    if why:
        raise DatasetError(f"episode {e}: {path} ({key}) is not a complete MP4 (truncated, empty or "
                           f"garbage: {why})")
    if ahead is not None and ahead.sha256 is not None:  # hashed by the thread that read it
        video_facts.digest_known(fkey, ahead.sha256)
    elif data is not None:  # its digest too, for a job that links the file (fkey: before the read)
        video_facts.digest_read(fkey, data)
    found = mp4_index.samples(data) if data is not None else None  # None: over mp4_index's bound
    if found is not None:  # the writer's plain shape, read from its boxes: no PyAV open
        # integer ticks as the demux gives them; no composition offsets: pts == dts. The stated
        # duration is not read: check_video does not check it
        plain = found.facts
        timing = StreamTiming(plain.dts, plain.dts, Fraction(1, plain.timescale), None)
        return (plain.width, plain.height, plain.frames, timing), found
    return _pyav_size(e, key, path), None


def _pyav_size(e: int, key: str, path: Path) -> tuple[int, int, int, StreamTiming | Exception | None]:
    """``demux_size`` by PyAV's open and demux (any MP4 a box reading does not answer)."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DatasetError(f"episode {e}: {path} ({key}) has no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            frames = stream_frames(container, stream)
            timing: StreamTiming | Exception | None = None  # None: read later, in its own open
            if int(stream.frames or 0) > 0:  # stream_frames read the index: the packets are unread
                try:
                    timing = container_timing(container, path)
                except av.FFmpegError as exc:  # worded as stream_timing words it
                    timing = VideoError(f"cannot read {path}: {exc}")
                except Exception as exc:  # noqa: BLE001 - raised later, in check_video's order
                    timing = exc
            return width, height, frames, timing
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - any demuxer error means an unreadable file
        raise DatasetError(f"episode {e}: {path} ({key}) is not a readable MP4 (truncated, empty or "
                           f"garbage): {exc}") from exc


def check_images(meta: DatasetMeta, ep: int, data: Path) -> None:
    """Every embedded image decodes to its declared shape: a reader decodes each one it serves,
    and a null, garbage or wrong-size row fails there, long after the export was published."""
    keys = [k for k, f in meta.info.features.items() if f.dtype == "image"]
    if not keys:
        return
    try:
        with pq.ParquetFile(data) as pf:
            t = pf.read(columns=keys)
    except Exception as exc:  # noqa: BLE001 - any Arrow error means an unreadable table
        raise DatasetError(f"episode {ep}: cannot read {data}: {exc}") from exc
    for key in keys:
        shape = meta.info.features[key].shape
        for i, value in enumerate(t.column(key).to_pylist()):
            why = image_row_problem(value, shape)
            if why:
                raise DatasetError(f"episode {ep}: {data}: {key} at frame {i} {why}")
