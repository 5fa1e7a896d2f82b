"""A camera MP4's size, frame count and frame timing read from its box structure (no PyAV).

Source validation needs, per MP4, what PyAV's open and demux give (validate_media): the first
video stream's width and height, its frame count and each packet's decode/presentation time.
Opening a container costs PyAV ~0.4 ms even for a four-frame file: most of a short episode's
media check. Files of the one plain shape the project's writer makes are read here
from their boxes; anything else (a fragmented file, more than one track, a box or field value
not listed below, a codec other than H.264 avc1, an edit list that is not the identity, a
composition offset table, parameter sets inside the samples) gives None, and the caller takes
PyAV's path as before. Every check here keeps the answer PyAV would give for the shapes let
through (tests/test_mp4_index.py compares both on mutated files): a table must fill its box
exactly, since FFmpeg reads past a short box into the next one.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import BinaryIO, NamedTuple

from . import reuse
from .mp4_boxes import Box
from .mp4_boxes import Unusual as _Unusual
from .mp4_boxes import boxes as _boxes
from .mp4_boxes import full as _full
from .mp4_boxes import need as _need
from .mp4_boxes import one as _one
from .mp4_boxes import only as _only
from .mp4_boxes import table as _table
from .mp4_boxes import text as _text
from .mp4_boxes import u32 as _u32
from .mp4_samples import check_nals, sample_spans
from .mp4_sps import avcc_size

#: Larger files take PyAV's path (this one reads the whole file into memory).
MAX_BYTES = 64 << 20
TOP_BOXES = frozenset((b"ftyp", b"free", b"mdat", b"moov"))
_STBL = frozenset((b"stsd", b"stts", b"stss", b"stsc", b"stsz", b"stco", b"co64"))


@dataclass(frozen=True)
class Mp4Facts:
    """What validate_media reads of a plain MP4: sizes, frames, and each sample's decode time
    in ``timescale`` units (presentation times are the same: no composition offsets)."""

    width: int
    height: int
    frames: int
    timescale: int
    dts: tuple[int, ...]


@dataclass(frozen=True)
class Mp4Samples:
    """What a demux of a plain MP4 gives besides its facts (v3_probe copies the packets)."""

    facts: Mp4Facts
    avcc: bytes  # the avcC payload: the stream's extradata as FFmpeg reports it
    spans: tuple[tuple[int, int], ...]  # each sample's (file offset, size), in decode order
    keyframes: frozenset[int] | None  # 0-based samples stss names; None: no stss, every one is


def read(path: Path) -> Mp4Facts | None:
    """The file's facts, or None when it is not of the plain shape (or unreadable here)."""
    data = file_bytes(path)
    return parse(data) if data is not None else None


def file_bytes(path: Path) -> bytes | None:
    """Every byte of the file, or None when it is over MAX_BYTES (or unreadable here)."""
    try:
        st = os.stat(path)
        if st.st_size > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            data = _read_to_end(fh, st.st_size, MAX_BYTES)
    except OSError:
        return None
    reuse.read_done(st, data)  # a second reader of the unchanged file may reuse its parse
    return data if len(data) <= MAX_BYTES else None  # grown past the bound since the stat


def whole_file(path: Path, bound: int) -> bytes | None:
    """Every byte of a regular file of at most ``bound`` bytes, else None (also when unreadable):
    validation's read-ahead of a small table, a small camera file decoded from its samples
    (plain_decode). Opened without blocking and checked regular by its descriptor (a FIFO
    swapped in for the file cannot hang a reading thread); read into a bytes object of the
    file's own size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        with open(fd, "rb", closefd=True) as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > bound:
                return None
            data = _read_to_end(fh, st.st_size, bound)
    except OSError:
        return None
    return data if len(data) <= bound else None


def _read_to_end(fh: BinaryIO, size: int, bound: int) -> bytes:
    """The rest of a file stated to hold ``size`` bytes, at most ``bound`` + 1 of them. read(n)
    allocates n bytes first: the stated size, then anything the file grew by since its stat."""
    data = fh.read(size + 1)
    if len(data) > size:
        data += fh.read(bound + 1 - len(data))
    return data


def parse(data: bytes) -> Mp4Facts | None:
    """The facts of a file whose every byte is ``data``, or None when not of the plain shape."""
    found = samples(data)
    return found.facts if found is not None else None


def samples(data: bytes) -> Mp4Samples | None:
    """``parse`` with the samples' places and key frames and the avcC, or None."""
    key, kept = reuse.taken(data)
    if isinstance(kept, Mp4Samples):
        return kept
    try:
        found = _parse(data)
    except (_Unusual, struct.error, IndexError, ValueError):
        return None
    reuse.keep(key, found, found.facts.frames)
    return found


def _parse(data: bytes) -> Mp4Samples:
    top = _boxes(data, 0, len(data))
    _only(top, TOP_BOXES)
    if top[0][0] != b"ftyp" or not plain_brand(data[top[0][1]:top[0][2]]):
        raise _Unusual("brand")
    mdat = _need(top, b"mdat")
    t = _track(data, _need(top, b"moov"))
    sizes = _sample_sizes(data, t.stbl, len(t.dts))
    spans, keys = _check_samples(data, t.stbl, sizes, mdat)
    return Mp4Samples(Mp4Facts(t.width, t.height, len(t.dts), t.scale, t.dts), t.avcc, spans, keys)


def plain_brand(ftyp: bytes) -> bool:
    """An ftyp payload of the plain shape (its brands are container metadata strings)."""
    return ftyp[:4] == b"isom" and not len(ftyp) % 4 and _text(ftyp[:4] + ftyp[8:])


class _Track(NamedTuple):
    width: int
    height: int
    avcc: bytes
    dts: tuple[int, ...]
    total: int  # the samples' summed durations (ticks)
    scale: int
    stated: int  # mdhd's duration (ticks)
    stbl: list[Box]


def _track(data: bytes, moov: Box) -> _Track:
    """The one video track of the moov box ``moov`` of ``data``, checked (not its samples)."""
    children = _boxes(data, moov[1], moov[2])
    _only(children, frozenset((b"mvhd", b"trak", b"udta")))
    mvhd = _need(children, b"mvhd")
    movie_scale = _u32(data, mvhd[1] + (20 if _full(data, mvhd, (100, 112)) else 12))
    udta = _one(children, b"udta", optional=True)
    if udta is not None:
        _check_udta(data, udta)
    trak = _boxes(data, *_need(children, b"trak")[1:])
    _only(trak, frozenset((b"tkhd", b"edts", b"mdia")))
    _full(data, _need(trak, b"tkhd"), (84, 96), any_flags=True)  # enabled/in-movie: no size
    mdia = _boxes(data, *_need(trak, b"mdia")[1:])
    _only(mdia, frozenset((b"mdhd", b"hdlr", b"minf")))
    mdhd = _need(mdia, b"mdhd")
    wide = _full(data, mdhd, (24, 36))
    scale = _u32(data, mdhd[1] + (20 if wide else 12))
    stated = int.from_bytes(data[mdhd[1] + 24:mdhd[1] + 32], "big") if wide else _u32(data, mdhd[1] + 16)
    hdlr = _need(mdia, b"hdlr")
    name = data[hdlr[1] + 24:hdlr[2]]  # a stream metadata string: PyAV decodes it as UTF-8
    if data[hdlr[1]:hdlr[1] + 12] != bytes(8) + b"vide" or not _text(name[:-1]) or name[-1:] != b"\0":
        raise _Unusual("handler")
    minf = _boxes(data, *_need(mdia, b"minf")[1:])
    _only(minf, frozenset((b"vmhd", b"dinf", b"stbl")))
    _one(minf, b"vmhd", optional=True)
    _check_dinf(data, _need(minf, b"dinf"))
    stbl = _boxes(data, *_need(minf, b"stbl")[1:])
    width, height, avcc = _sample_entry(data, _need(stbl, b"stsd"))
    dts, total = _decode_times(data, stbl)
    if not (0 < scale < 1 << 31 and 0 < movie_scale < 1 << 31):  # FFmpeg: a signed int, else 1
        raise _Unusual("timescale")
    edts = _one(trak, b"edts", optional=True)
    if edts is not None:
        _check_edit(data, edts, movie_scale, scale, total)
    return _Track(width, height, avcc, dts, total, scale, stated, stbl)


def moov_timing(moov: bytes, mdat: tuple[int, int]) -> tuple[Mp4Facts, int] | None:
    """The facts of a plain file's track from its moov box alone (``moov``: the whole box; every
    sample placed inside ``mdat``, the file's (payload start, end)), and its duration in ticks;
    None when not of the plain shape, or when mdhd states a duration other than its samples'
    (which one FFmpeg reports would then depend on its edit handling)."""
    try:
        box = _boxes(moov, 0, len(moov))
        if [b[0] for b in box] != [b"moov"]:
            return None
        t = _track(moov, box[0])
        _check_samples(moov, t.stbl, _sample_sizes(moov, t.stbl, len(t.dts)), (b"mdat", *mdat), nals=False)
    except (_Unusual, struct.error, IndexError, ValueError):
        return None
    if t.stated != t.total:
        return None
    return Mp4Facts(t.width, t.height, len(t.dts), t.scale, t.dts), t.total


def _check_udta(data: bytes, udta: Box) -> None:
    """Only the muxer's encoder tag (udta/meta/hdlr mdir + ilst/\xa9too/data, UTF-8)."""
    meta = _boxes(data, udta[1], udta[2])
    if [b[0] for b in meta] != [b"meta"] or data[meta[0][1]:meta[0][1] + 4] != bytes(4):
        raise _Unusual("udta")
    inner = _boxes(data, meta[0][1] + 4, meta[0][2])
    if [b[0] for b in inner] != [b"hdlr", b"ilst"]:
        raise _Unusual("meta")
    if data[inner[0][1]:inner[0][2]] != bytes(8) + b"mdirappl" + bytes(9):
        raise _Unusual("meta hdlr")
    items = _boxes(data, inner[1][1], inner[1][2])
    if [b[0] for b in items] != [b"\xa9too"]:
        raise _Unusual("ilst")
    value = _boxes(data, items[0][1], items[0][2])
    if [b[0] for b in value] != [b"data"] or data[value[0][1]:value[0][1] + 8] != b"\0\0\0\x01\0\0\0\0":
        raise _Unusual("ilst data")
    if not _text(data[value[0][1] + 8:value[0][2]]):
        raise _Unusual("ilst text")


def _check_dinf(data: bytes, dinf: Box) -> None:
    """One self-contained data reference (else FFmpeg reads the samples from another file)."""
    if data[dinf[1]:dinf[2]] != b"\0\0\0\x1cdref" + bytes(7) + b"\x01\0\0\0\x0curl \0\0\0\x01":
        raise _Unusual("dref")


def _sample_entry(data: bytes, stsd: Box) -> tuple[int, int, bytes]:
    """(width, height, avcC payload) of the one avc1 entry, whose SPS must state that size."""
    if data[stsd[1]:stsd[1] + 8] != b"\0\0\0\0\0\0\0\x01":  # version 0, one entry
        raise _Unusual("stsd")
    entries = _boxes(data, stsd[1] + 8, stsd[2])
    if len(entries) != 1 or entries[0][0] != b"avc1":
        raise _Unusual("sample entry")
    _, start, end = entries[0]
    if data[start:start + 8] != b"\0\0\0\0\0\0\0\x01" or end - start < 78:
        raise _Unusual("avc1 reference")
    width, height = struct.unpack_from(">HH", data, start + 24)
    depth, table = struct.unpack_from(">Hh", data, start + 74)
    # no compressor name (FFmpeg makes it stream metadata) and no palette (read from the entry)
    if depth != 0x18 or table != -1 or data[start + 42:start + 74] != bytes(32):
        raise _Unusual("avc1 depth")
    children = _boxes(data, start + 78, end)
    _only(children, frozenset((b"avcC", b"btrt")))
    _one(children, b"btrt", optional=True)
    avcc = data[_need(children, b"avcC")[1]:_need(children, b"avcC")[2]]
    if avcc_size(avcc) != (width, height):
        raise _Unusual("SPS size")
    return width, height, avcc


def _decode_times(data: bytes, stbl: list[Box]) -> tuple[tuple[int, ...], int]:
    """Each sample's decode time from stts, and their total duration."""
    _only(stbl, _STBL)
    first, count = _table(data, _need(stbl, b"stts"), 8)
    dts: list[int] = []
    t = 0
    for n, delta in struct.iter_unpack(">II", data[first:first + 8 * count]):
        if n == 0 or not 0 < delta < 1 << 24 or len(dts) + n > 1 << 20:
            raise _Unusual("stts entry")
        dts.extend(range(t, t + n * delta, delta))
        t += n * delta
    if not dts:
        raise _Unusual("no samples")
    return tuple(dts), t


def _check_edit(data: bytes, edts: Box, movie_scale: int, scale: int, total: int) -> None:
    """An identity edit list: one edit from media time 0 at rate 1 spanning every sample."""
    elst = _boxes(data, edts[1], edts[2])
    if [b[0] for b in elst] != [b"elst"]:
        raise _Unusual("edts")
    first, count = _table(data, elst[0], 12)
    if count != 1:
        raise _Unusual("edits")
    duration, media_time, rate = struct.unpack_from(">Iii", data, first)
    if media_time != 0 or rate != 0x10000 or duration * scale < total * movie_scale:
        raise _Unusual("edit")


def _sample_sizes(data: bytes, stbl: list[Box], frames: int) -> list[int]:
    box = _need(stbl, b"stsz")
    if data[box[1]:box[1] + 4] != bytes(4) or box[2] - box[1] < 12:
        raise _Unusual("stsz")
    uniform, count = struct.unpack_from(">II", data, box[1] + 4)
    if count != frames:
        raise _Unusual("stsz count")
    sizes = [uniform] * count if uniform else [v for (v,) in struct.iter_unpack(">I", data[box[1] + 12:box[2]])]
    if count != frames or len(sizes) != count or (uniform and box[2] != box[1] + 12) or 0 in sizes:
        raise _Unusual("stsz table")
    return sizes


def _chunk_offsets(data: bytes, stbl: list[Box]) -> list[int]:
    stco, co64 = _one(stbl, b"stco", optional=True), _one(stbl, b"co64", optional=True)
    if (stco is None) == (co64 is None):
        raise _Unusual("chunk offsets")
    wide = stco is None
    box = co64 if wide else stco
    assert box is not None
    first, _count = _table(data, box, 8 if wide else 4)
    return [v for (v,) in struct.iter_unpack(">Q" if wide else ">I", data[first:box[2]])]


def _check_samples(data: bytes, stbl: list[Box], sizes: list[int], mdat: Box, nals: bool = True
                   ) -> tuple[tuple[tuple[int, int], ...], frozenset[int] | None]:
    """Every sample inside the mdat payload (stsc/stco), its NAL units tiling it, none a
    parameter set (``nals``: the samples are in ``data``); and stss naming samples that exist,
    in order. Returns each sample's (offset, size) and the 0-based key frames (None: no stss)."""
    chunks = _chunk_offsets(data, stbl)
    first, count = _table(data, _need(stbl, b"stsc"), 12)
    runs = list(struct.iter_unpack(">III", data[first:first + 12 * count]))
    if not runs or runs[0][0] != 1 or any(b[0] <= a[0] for a, b in pairwise(runs)) \
            or any(spc == 0 or sdi != 1 for _, spc, sdi in runs) or runs[-1][0] > len(chunks):
        raise _Unusual("stsc")
    spans = sample_spans(chunks, runs, sizes, mdat)
    if nals:
        check_nals(data, spans)
    stss = _one(stbl, b"stss", optional=True)
    if stss is None:
        return tuple(spans), None
    first, count = _table(data, stss, 4)
    keys = [v for (v,) in struct.iter_unpack(">I", data[first:stss[2]])]
    if not keys or keys[0] < 1 or keys[-1] > len(sizes) or any(b <= a for a, b in pairwise(keys)):
        raise _Unusual("stss")
    return tuple(spans), frozenset(k - 1 for k in keys)
