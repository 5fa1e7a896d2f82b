"""A plain camera MP4's stream timing from its moov box alone: no PyAV, no sample read.

The lerobot_v3 verifier checks each camera shard's timing as a consumer's frame lookup reads
it (lerobot_v3/timing.py). PyAV's demux of a shard of 6000 packets takes about 25 ms; the same
times are in the moov box (the decode times of stts; in the plain shape, mp4_index, there are no
composition offsets and the edit list is the identity, so presentation times equal them), a
few KB at the start of a shard written with faststart. The top-level boxes are walked by their
headers, the moov box alone is read and parsed by mp4_index, every sample's place checked inside
the mdat box as a demuxer reads it (not the sample bytes); anything outside the plain shape
(or a moov past ``MAX_MOOV``, or a 64-bit box size) gives None and the caller asks PyAV.
"""

from __future__ import annotations

import os
import struct
from fractions import Fraction
from pathlib import Path

from . import mp4_index
from .video import StreamTiming

MAX_MOOV = 16 << 20  # a moov this large holds millions of samples: PyAV's path
MAX_FTYP = 64


def moov_of(path: Path) -> tuple[bytes, tuple[int, int]] | None:
    """The moov box (header included) and the mdat payload's (start, end) in the file, of a file
    whose top-level boxes are of the plain shape: an ftyp of the plain brand first, one moov,
    one mdat, free boxes, tiling the file."""
    kinds: list[bytes] = []
    moov: bytes | None = None
    mdat = (0, 0)
    try:
        with open(path, "rb") as fh:
            size, pos = os.fstat(fh.fileno()).st_size, 0
            while pos < size:
                head = fh.read(8)
                if len(head) < 8:
                    return None
                n, kind = struct.unpack(">I4s", head)
                if n < 8 or pos + n > size or kind not in mp4_index.TOP_BOXES:
                    return None
                if not kinds and (kind != b"ftyp" or n - 8 > MAX_FTYP or not mp4_index.plain_brand(fh.read(n - 8))):
                    return None
                if kind == b"moov":
                    if moov is not None or n > MAX_MOOV:
                        return None
                    moov = head + fh.read(n - 8)
                elif kind == b"mdat":
                    mdat = (pos + 8, pos + n)
                kinds.append(kind)
                pos += n
                fh.seek(pos)
    except OSError:
        return None
    ok = moov is not None and kinds.count(b"mdat") == 1 and kinds.count(b"ftyp") == 1
    return (moov, mdat) if ok and moov is not None else None


def stream_timing(path: Path) -> StreamTiming | None:
    """What video.stream_timing reads through PyAV, for a file of the plain shape; else None."""
    found = moov_of(path)
    got = mp4_index.moov_timing(*found) if found is not None else None
    if got is None:
        return None
    facts, total = got
    tb = Fraction(1, facts.timescale)
    return StreamTiming(facts.dts, facts.dts, tb, total * tb)
