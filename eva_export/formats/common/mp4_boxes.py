"""The box-level reading the plain-shape MP4 parsers share (mp4_index: a whole file;
mp4_timing: a file's moov box alone): boxes tiling a span exactly, 32-bit sizes only, each
deviation an ``Unusual`` that sends the caller to PyAV."""

from __future__ import annotations

import struct


class Unusual(Exception):
    """Outside the plain shape: PyAV decides."""


Box = tuple[bytes, int, int]  # (kind, payload start, box end)


def boxes(data: bytes, start: int, end: int) -> list[Box]:
    """The boxes tiling data[start:end] exactly (32-bit sizes only)."""
    out: list[Box] = []
    pos = start
    while pos < end:
        if end - pos < 8:
            raise Unusual("cut box header")
        size, kind = struct.unpack_from(">I4s", data, pos)
        if size < 8 or pos + size > end:
            raise Unusual("box size")
        out.append((kind, pos + 8, pos + size))
        pos += size
    return out


def one(boxes: list[Box], kind: bytes, optional: bool = False) -> Box | None:
    found = [b for b in boxes if b[0] == kind]
    if len(found) > 1 or (not found and not optional):
        raise Unusual(f"{kind!r} count")
    return found[0] if found else None


def need(boxes: list[Box], kind: bytes) -> Box:
    box = one(boxes, kind)
    assert box is not None
    return box


def only(boxes: list[Box], allowed: frozenset[bytes]) -> None:
    if any(b[0] not in allowed for b in boxes):
        raise Unusual("unknown box")


def full(data: bytes, box: Box, sizes: tuple[int, ...], any_flags: bool = False) -> int:
    """A full box of version 0 or 1 (flags 0 unless ``any_flags``) whose payload has
    sizes[version] bytes."""
    _, start, end = box
    version, flags = data[start], int.from_bytes(data[start + 1:start + 4], "big")
    if (flags != 0 and not any_flags) or version >= len(sizes) or end - start != sizes[version]:
        raise Unusual("full box")
    return version


def u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "big")


def table(data: bytes, box: Box, entry: int, head: int = 0) -> tuple[int, int]:
    """(first entry's offset, count) of a version-0 table box that fills its box exactly."""
    _, start, end = box
    if data[start:start + 4] != bytes(4):
        raise Unusual("table version")
    count = u32(data, start + 4 + head)
    first = start + 8 + head
    if first + count * entry != end:
        raise Unusual("table size")
    return first, count


def text(raw: bytes) -> bool:
    """Printable ASCII: a metadata string PyAV decodes as it stands."""
    return all(0x20 <= c < 0x7F for c in raw)
