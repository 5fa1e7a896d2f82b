"""formats/common/mp4_write.py: the plain-shape MP4 written without FFmpeg is what PyAV decodes
(every frame, each at its own time, the duration the frames add up to), what mp4_index reads
back (sizes, places, key frames, avcC), with the payload copied whatever the kernel supports."""

from __future__ import annotations

import errno
import os
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from short_videos import textured

from eva_export.formats.common import mp4_index, mp4_timing
from eva_export.formats.common.mp4_write import PlainMp4
from eva_export.formats.common.video import VideoEncoder, VideoSettings, iter_frames, stream_timing
from eva_export.formats.lerobot_v3.probe import H264_NAME, codec_params

FPS, TIMESCALE = 30, 15360


def episode(path: Path, n: int, seed: int, gop: int = 2) -> Path:
    with VideoEncoder(path, 64, 48, FPS, VideoSettings(gop=gop)) as enc:
        for i in range(n):
            enc.add(textured(seed, i, 64, 48))
    return path


def joined(out: Path, files: list[Path]) -> PlainMp4:
    """The files' samples appended, one chunk each, as a v3 shard joins episodes."""
    first = mp4_index.samples(files[0].read_bytes())
    assert first is not None
    w = PlainMp4(out, first.avcc, 64, 48, TIMESCALE, TIMESCALE // FPS)
    for f in files:
        data = f.read_bytes()
        s = mp4_index.samples(data)
        assert s is not None and s.avcc == first.avcc
        keys = s.keyframes
        w.add([data[a:a + n] for a, n in s.spans], [keys is None or i in keys for i in range(len(s.spans))])
    w.close()
    return w


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("eps")
    return [episode(root / f"e{i}.mp4", n, i) for i, n in enumerate((5, 1, 7))]


def test_pyav_decodes_every_frame_at_its_time(episodes: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "shard.mp4"
    joined(out, episodes)
    want = [f for e in episodes for f in iter_frames(e)]
    got = list(iter_frames(out))
    assert len(got) == len(want) == 13
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    t = stream_timing(out)
    assert t.time_base == Fraction(1, TIMESCALE)
    assert list(t.pts_ticks) == [k * (TIMESCALE // FPS) for k in range(13)] == list(t.dts_ticks)
    assert t.duration is not None and abs(float(t.duration) - 13 / FPS) < 1e-9
    assert not list(tmp_path.glob("*.mdat"))  # the payload file is gone


def test_mp4_index_reads_back_what_was_written(episodes: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "shard.mp4"
    w = joined(out, episodes)
    data = out.read_bytes()
    s = mp4_index.samples(data)
    assert s is not None
    assert [n for _, n in s.spans] == w.sizes
    assert s.keyframes is not None and sorted(k + 1 for k in s.keyframes) == w.keys
    assert len(w.keys) < w.frames  # gop 2: stss is written, and read
    assert s.facts.dts == tuple(k * (TIMESCALE // FPS) for k in range(13))
    assert data[:4] == struct.pack(">I", 32) and data.index(b"moov") < data.index(b"mdat")  # faststart
    assert mp4_timing.stream_timing(out) == stream_timing(out)  # the verifier's fast path takes it


def test_all_key_frames_need_no_stss(tmp_path: Path) -> None:
    src = episode(tmp_path / "k.mp4", 4, 9, gop=1)
    out = tmp_path / "shard.mp4"
    joined(out, [src])
    s = mp4_index.samples(out.read_bytes())
    assert s is not None and s.keyframes is None
    assert b"stss" not in out.read_bytes()[:4096]
    assert len(list(iter_frames(out))) == 4


def test_the_payload_is_copied_where_the_kernel_cannot(episodes: list[Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fast = tmp_path / "fast.mp4"
    joined(fast, episodes)

    def unsupported(*_: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    slow = tmp_path / "slow.mp4"
    joined(slow, episodes)
    assert slow.read_bytes() == fast.read_bytes()


def test_abort_leaves_nothing(episodes: list[Path], tmp_path: Path) -> None:
    s = mp4_index.samples(episodes[0].read_bytes())
    assert s is not None
    w = PlainMp4(tmp_path / "x.mp4", s.avcc, 64, 48, TIMESCALE, TIMESCALE // FPS)
    w.add([b"\0\0\0\x01\x65"], [True])
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_offsets_past_4_gib_use_co64(episodes: list[Path], tmp_path: Path) -> None:
    s = mp4_index.samples(episodes[0].read_bytes())
    assert s is not None
    w = PlainMp4(tmp_path / "x.mp4", s.avcc, 64, 48, TIMESCALE, TIMESCALE // FPS)
    w.add([b"ab", b"cd"], [True, False])
    w.add([b"ef"], [True])
    moov = w._moov(1 << 32)
    w.abort()
    at = moov.index(b"co64")
    assert moov.find(b"stco") < 0
    count, = struct.unpack_from(">I", moov, at + 8)
    assert struct.unpack_from(f">{count}Q", moov, at + 12) == ((1 << 32), (1 << 32) + 4)


def test_h264_is_named_as_pyav_names_it(episodes: list[Path]) -> None:
    with av.open(str(episodes[0])) as c:
        assert codec_params(c.streams.video[0]).codec == H264_NAME


def test_offsets_that_cross_4_gib_behind_the_boxes_use_co64(episodes: list[Path], tmp_path: Path) -> None:
    """A last chunk just under 4 GiB into the payload lands past it once the boxes are ahead of
    it: the offsets go 64-bit, and every one still points at its chunk behind the header."""
    s = mp4_index.samples(episodes[0].read_bytes())
    assert s is not None
    for last in (0xFFFFFFFF - 200, 1000):
        w = PlainMp4(tmp_path / "x.mp4", s.avcc, 64, 48, TIMESCALE, TIMESCALE // FPS)
        w.add([b"ab"], [True])
        w.chunks.append((last, 1))  # a chunk that far into the payload (its bytes not written)
        w.sizes.append(3)
        w._at = last + 3
        head = w.header()
        w.abort()
        kind = b"co64" if last > 1 << 31 else b"stco"
        at = head.index(kind)
        count, = struct.unpack_from(">I", head, at + 8)
        offsets = struct.unpack_from(f">{count}{'Q' if kind == b'co64' else 'I'}", head, at + 12)
        assert offsets == (len(head), len(head) + last)
        assert (b"co64" in head) == (kind == b"co64")
