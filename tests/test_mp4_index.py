"""formats/common/mp4_index.py: an MP4's size, frames and frame timing read from its boxes give the
same verdict as PyAV's open and demux (validate_media's other path), on the writer's files
and on seeded random mutations of them (bit flips, bytes, cuts); anything unusual is left to
PyAV (None)."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest
from short_videos import encode_bframes, textured

from eva_export.errors import DatasetError
from eva_export.formats.common import mp4_index
from eva_export.formats.common.video import VideoEncoder, VideoSettings, timing_problems
from eva_export.formats.lerobot_v21.validate_media import _pyav_size, demux_size

SHAPES = [(64, 48, 4, 30), (64, 48, 30, 30), (50, 30, 7, 15), (320, 240, 3, 30)]


def write(path: Path, width: int, height: int, frames: int, fps: int) -> Path:
    with VideoEncoder(path, width, height, fps, VideoSettings(crf=10)) as enc:
        for i in range(frames):
            enc.add(textured(1, i, width, height))
    return path


def verdict(sizer: Any, path: Path, fps: int, rows: int) -> Any:
    """What check_video concludes from a sizer's answer: refused, or (w, h, frames, timing)."""
    try:
        w, h, n, timing = sizer(0, "cam", path)
    except DatasetError:
        return "refused"
    if isinstance(timing, Exception) or timing is None:
        return ("timing unreadable", w, h, n)
    return (w, h, n, tuple(timing_problems(timing, fps, rows, check_duration=False)))


def without_edit_list(data: bytes) -> bytes:
    """The file with its edts box cut out of moov/trak (their sizes shrunk; chunk offsets point
    before moov, unchanged)."""
    at = data.index(b"edts") - 4
    size = int.from_bytes(data[at:at + 4], "big")
    out = bytearray(data[:at] + data[at + size:])
    for kind in (b"moov", b"trak"):
        k = out.index(kind) - 4
        out[k:k + 4] = (int.from_bytes(out[k:k + 4], "big") - size).to_bytes(4, "big")
    return bytes(out)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[bytes, int, int]]:
    root = tmp_path_factory.mktemp("mp4")
    out = []
    for i, (w, h, n, fps) in enumerate(SHAPES):
        out.append((write(root / f"v{i}.mp4", w, h, n, fps).read_bytes(), fps, n))
    out.append((without_edit_list(out[0][0]), out[0][1], out[0][2]))  # no edit list: read too
    return out


def test_the_writers_files_are_read_from_their_boxes(originals: list[tuple[bytes, int, int]], tmp_path: Path) -> None:
    for i, (data, fps, n) in enumerate(originals):
        path = tmp_path / f"o{i}.mp4"
        path.write_bytes(data)
        facts = mp4_index.read(path)
        assert facts is not None, i
        assert verdict(demux_size, path, fps, n) == verdict(_pyav_size, path, fps, n)
        w, h, _, _ = SHAPES[i % len(SHAPES)]
        assert (facts.width, facts.height, facts.frames) == (w, h, n)


def moov_range(data: bytes) -> tuple[int, int]:
    pos = 0
    while pos < len(data):
        size, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"moov":
            return pos, pos + size
        pos += size
    raise AssertionError("no moov")


def mdat_start(data: bytes) -> int:
    return data.index(b"mdat") + 4


def mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    lo, hi = moov_range(data)
    first = mdat_start(data)
    out = []
    for k in range(count):
        b = bytearray(data)
        how = k % 5
        if how == 4:  # a bit flip in the first sample's NAL lengths and headers (an SPS in-band...)
            pos = first + rng.randrange(16)
            b[pos] ^= 1 << rng.randrange(8)
        elif how == 0:  # a bit flip in the index
            pos = rng.randrange(lo, hi)
            b[pos] ^= 1 << rng.randrange(8)
        elif how == 1:  # a random byte in the index
            b[rng.randrange(lo, hi)] = rng.randrange(256)
        elif how == 2:  # a bit flip anywhere (the samples too)
            pos = rng.randrange(len(b))
            b[pos] ^= 1 << rng.randrange(8)
        else:  # a small value in a 32-bit field of the index (counts, deltas, sizes)
            pos = lo + 4 * rng.randrange((hi - lo) // 4)
            b[pos:pos + 4] = rng.choice([0, 1, 2, 3, 511, 513, 1024, 1 << 31, 0xFFFFFFFF]).to_bytes(4, "big")
        out.append(bytes(b))
    return out


def test_mutated_files_get_pyavs_verdict_or_go_to_pyav(originals: list[tuple[bytes, int, int]], tmp_path: Path) -> None:
    rng = random.Random(28)
    answered = disagreed = 0
    bad: list[str] = []
    path = tmp_path / "m.mp4"
    for i, (data, fps, n) in enumerate(originals):
        for j, mutated in enumerate(mutations(data, rng, 500)):
            path.write_bytes(mutated)
            if mp4_index.read(path) is None:
                continue
            answered += 1
            mine, theirs = verdict(demux_size, path, fps, n), verdict(_pyav_size, path, fps, n)
            if mine != theirs:
                disagreed += 1
                bad.append(f"shape {i} mutation {j}: {mine} != {theirs}")
    assert not bad, bad[:5]
    assert answered > 200  # the mutations that keep the plain shape were compared, not all sent to PyAV


def test_unusual_files_go_to_pyav(tmp_path: Path) -> None:
    frames = [textured(2, i, 64, 48) for i in range(6)]
    encode_bframes(tmp_path / "b.mp4", frames, 30, "libx264")  # B-frames: a composition offset table
    assert mp4_index.read(tmp_path / "b.mp4") is None
    (tmp_path / "g.mp4").write_bytes(b"\0\0\0\x08free" * 4)
    assert mp4_index.read(tmp_path / "g.mp4") is None
    assert mp4_index.read(tmp_path / "absent.mp4") is None
