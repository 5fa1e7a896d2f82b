"""An H.264 MP4 of the plain shape written without FFmpeg: samples copied, one clock.

What ``mp4_index`` reads is what this writes: an ftyp of the isom brand, then the moov box
(faststart: a reader over HTTP finds the index in the first bytes), then one mdat. One video
track, every sample one frame long (``tick`` ticks), decode time = presentation time (no
composition offsets: the samples must be in presentation order), an identity edit list, the
avc1 sample entry built from the stream's avcC record, key frames in stss (none when every
sample is one). The lerobot_v3 camera shards of episodes without frame reordering are written
this way: PyAV's muxer cost a packet object per frame, a second pass over the whole file for
faststart, and its import.

The samples go to a payload file beside the output while the shard is open (only their sizes
and key flags stay in memory); ``close`` writes the boxes and moves the payload behind them
with ``os.copy_file_range`` (kernel-side, no bytes through Python).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

MOVIE_SCALE = 1000  # mvhd/tkhd/elst clock, as FFmpeg writes it
_IDENTITY = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)  # unity matrix
_FTYP = b"isom" + struct.pack(">I", 512) + b"isomiso2avc1mp41"
_DINF = b"\0\0\0\x1cdref" + bytes(7) + b"\x01\0\0\0\x0curl \0\0\0\x01"
_HANDLER = b"VideoHandler\0"


def box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return box(kind, struct.pack(">I", version << 24 | flags), *payload)


class PlainMp4:
    """One MP4 being written at ``path`` (payload beside it until ``close``)."""

    def __init__(self, path: Path, avcc: bytes, width: int, height: int, timescale: int, tick: int) -> None:
        if not (0 < width < 1 << 16 and 0 < height < 1 << 16 and 0 < tick < 1 << 24 and timescale < 1 << 31):
            raise ValueError(f"{path}: {width}x{height}, {tick}/{timescale} s per frame cannot be written")
        self.path, self.avcc = path, avcc
        self.width, self.height, self.timescale, self.tick = width, height, timescale, tick
        self.sizes: list[int] = []
        self.keys: list[int] = []  # 1-based sample numbers of the key frames
        self.chunks: list[tuple[int, int]] = []  # (payload offset, samples) of each chunk
        self.payload = path.with_name(path.name + ".mdat")
        self._fh = open(self.payload, "wb")  # noqa: SIM115 - held until close()/abort()
        self._at = 0

    def add(self, samples: list[bytes], keyframes: list[bool]) -> None:
        """Append samples in decode (= presentation) order as one chunk."""
        if not samples:
            return
        base = len(self.sizes)
        self.sizes.extend(len(s) for s in samples)
        self.keys.extend(base + i + 1 for i, k in enumerate(keyframes) if k)
        self.chunks.append((self._at, len(samples)))
        data = b"".join(samples)
        try:
            self._fh.write(data)
        except OSError as exc:  # a full disk among them: the message names the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.payload)) from exc
        self._at += len(data)

    @property
    def frames(self) -> int:
        return len(self.sizes)

    def close(self) -> None:
        """Write the boxes, then the payload behind them; the payload file is removed."""
        try:
            self._fh.close()
            with open(self.path, "wb") as out, open(self.payload, "rb") as src:
                out.write(self.header())
                _copy(src, out, self._at)
        except OSError as exc:  # a full disk among them: the message names the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.path)) from exc
        self.payload.unlink()

    def header(self) -> bytes:
        """ftyp, moov and the mdat box's header: what goes ahead of the payload. The chunk
        offsets depend on the moov's size, and its size on whether they need 64 bits (co64):
        32-bit offsets first, 64-bit ones when the last chunk lands past 4 GiB behind them."""
        head = box(b"ftyp", _FTYP)
        wide_mdat = self._at + 8 > 0xFFFFFFFF
        mdat_head = (struct.pack(">I4sQ", 1, b"mdat", self._at + 16) if wide_mdat
                     else struct.pack(">I4s", self._at + 8, b"mdat"))
        last = self.chunks[-1][0] if self.chunks else 0
        wide = False
        start = len(head) + len(self._moov(0, wide)) + len(mdat_head)
        if start + last > 0xFFFFFFFF:
            wide = True
            start = len(head) + len(self._moov(0, wide)) + len(mdat_head)
        return head + self._moov(start, wide) + mdat_head

    def abort(self) -> None:
        self._fh.close()
        self.payload.unlink(missing_ok=True)

    def _moov(self, start: int, wide: bool | None = None) -> bytes:
        """The moov box, chunks at ``start`` + their payload offset (``wide``: co64; None: as
        the offsets need)."""
        total = len(self.sizes) * self.tick
        movie = -(-total * MOVIE_SCALE // self.timescale)  # rounded up, as FFmpeg: never short of the frames
        v = 1 if max(total, movie) > 0xFFFFFFFF else 0
        times = struct.pack(">QQIQ" if v else ">IIII", 0, 0, MOVIE_SCALE, movie)
        mvhd = full_box(b"mvhd", v, 0, times, struct.pack(">IH10x", 0x10000, 0x100), _IDENTITY, bytes(24),
                        struct.pack(">I", 2))
        tkhd = full_box(b"tkhd", v, 3, struct.pack(">QQI4xQ" if v else ">III4xI", 0, 0, 1, movie),
                        bytes(8), struct.pack(">hhh2x", 0, 0, 0), _IDENTITY,
                        struct.pack(">II", self.width << 16, self.height << 16))
        elst = full_box(b"elst", v, 0, struct.pack(">I", 1), struct.pack(">Qq" if v else ">Ii", movie, 0),
                        struct.pack(">I", 0x10000))
        mdhd = full_box(b"mdhd", v, 0, struct.pack(">QQIQ" if v else ">IIII", 0, 0, self.timescale, total),
                        struct.pack(">HH", 0x55C4, 0))  # language "und"
        hdlr = full_box(b"hdlr", 0, 0, bytes(4), b"vide", bytes(12), _HANDLER)
        minf = box(b"minf", full_box(b"vmhd", 0, 1, bytes(8)), box(b"dinf", _DINF), self._stbl(start, wide))
        trak = box(b"trak", tkhd, box(b"edts", elst), box(b"mdia", mdhd, hdlr, minf))
        return box(b"moov", mvhd, trak)

    def _stbl(self, start: int, wide: bool | None) -> bytes:
        avc1 = box(b"avc1", bytes(6), struct.pack(">H", 1), bytes(16),
                   struct.pack(">HHIIIH", self.width, self.height, 0x480000, 0x480000, 0, 1), bytes(32),
                   struct.pack(">Hh", 0x18, -1), box(b"avcC", self.avcc))
        stsd = full_box(b"stsd", 0, 0, struct.pack(">I", 1), avc1)
        stts = full_box(b"stts", 0, 0, struct.pack(">III", 1, len(self.sizes), self.tick))
        runs: list[tuple[int, int]] = []  # (first chunk, samples per chunk), run-length
        for i, (_, n) in enumerate(self.chunks):
            if not runs or runs[-1][1] != n:
                runs.append((i + 1, n))
        stsc = full_box(b"stsc", 0, 0, struct.pack(">I", len(runs)), *(struct.pack(">III", c, n, 1) for c, n in runs))
        stsz = full_box(b"stsz", 0, 0, struct.pack(f">II{len(self.sizes)}I", 0, len(self.sizes), *self.sizes))
        offsets = [start + at for at, _ in self.chunks]
        if wide is None:
            wide = bool(offsets) and offsets[-1] > 0xFFFFFFFF
        co = full_box(b"co64" if wide else b"stco", 0, 0,
                      struct.pack(f">I{len(offsets)}{'Q' if wide else 'I'}", len(offsets), *offsets))
        parts = [stsd, stts]
        if len(self.keys) < len(self.sizes):
            parts.append(full_box(b"stss", 0, 0, struct.pack(f">I{len(self.keys)}I", len(self.keys), *self.keys)))
        return box(b"stbl", *parts, stsc, stsz, co)


def _copy(src: BinaryIO, out: BinaryIO, n: int) -> None:
    """``n`` bytes of ``src`` appended to ``out`` (kernel copy; a plain copy where not supported)."""
    fi, fo = src.fileno(), out.fileno()
    out.flush()
    pos = os.lseek(fo, 0, os.SEEK_END)
    done = 0
    try:
        while done < n:
            k = os.copy_file_range(fi, fo, n - done, done, pos + done)
            if k == 0:
                raise OSError(f"the payload file ended {n - done} bytes early")
            done += k
    except OSError as exc:
        if exc.errno is None or done:  # short payload, or a failure after a partial copy
            raise
        os.lseek(fi, 0, os.SEEK_SET)
        while chunk := os.read(fi, 1 << 20):
            done += os.write(fo, chunk)
        if done != n:
            raise OSError(f"copied {done} of {n} payload bytes") from exc
