"""The frames of a small plain-shape camera MP4, decoded from its sample table without a container.

``av.open`` probes a file before the first frame (its boxes parsed, frames decoded ahead to
learn the stream's parameters), and a frame-threaded decoder starts a thread pool: on a
four-frame camera file those cost more than decoding its frames. A file of the plain shape
``mp4_index`` reads (H.264 from its avcC, no composition offsets, an identity edit list, the
parameter sets in the avcC only) holds one frame per sample, in decode order, all of them
shown; its samples go straight to an H.264 decoder made from the avcC, one thread. The frames
are pixel-equal to ``av.open``'s (tests/test_plain_decode.py). Anything else, and a file
larger than ``SMALL_FILE`` (whose frame threads pay off), is left to ``av.open``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from . import mp4_index

if TYPE_CHECKING:
    import av

#: Files up to this size are decoded here; larger ones through av.open and its frame threads
#: (a 300-frame 640x480 episode decodes faster on them).
SMALL_FILE = 1 << 20


def read_small(path: Path) -> tuple[bytes, mp4_index.Mp4Samples] | None:
    """The bytes and sample table of a small plain-shape MP4 at ``path``; None otherwise.

    Read by ``mp4_index.whole_file``, not ``mp4_index.file_bytes``: a box parse a job keeps for
    its v3 probe (reuse.py) stays kept for it."""
    data = mp4_index.whole_file(path, SMALL_FILE)  # None: larger, unreadable or not a regular file
    found = mp4_index.samples(data) if data is not None else None
    return None if data is None or found is None else (data, found)


def frames(data: bytes, found: mp4_index.Mp4Samples) -> Iterator[av.VideoFrame]:
    """Every frame of the file ``data`` in display order (raises av.FFmpegError as av.open's
    decode does on a damaged sample)."""
    import av

    cc = av.CodecContext.create("h264", "r")
    cc.extradata = found.avcc
    cc.thread_count = 1
    for at, size in found.spans:
        yield from cc.decode(av.Packet(data[at:at + size]))
    yield from cc.decode(None)
