"""formats/common/plain_decode.py: a small plain-shape camera MP4 decoded from its sample table
gives av.open's frames, pixel for pixel and in the same order; a file of any other shape (B-frames,
larger than the bound, not an MP4 of the plain shape) takes av.open's path, and a damaged sample
is reported as av.open's path reports it, naming the file."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from short_videos import encode_bframes, textured

from eva_export.errors import VideoError
from eva_export.formats.common import mp4_index, plain_decode
from eva_export.formats.common.video import RgbConverter, VideoEncoder, VideoSettings, iter_frames

FPS = 30


def plain(path: Path, n: int, seed: int = 1, gop: int = 2) -> Path:
    """An episode's camera file as the project's writer makes it (H.264, no B-frames)."""
    with VideoEncoder(path, 64, 48, FPS, VideoSettings(gop=gop)) as enc:
        for i in range(n):
            enc.add(textured(seed, i, 64, 48))
    return path


def through_av_open(path: Path) -> list[np.ndarray]:
    rgb = RgbConverter()
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        return [rgb(f) for f in c.decode(s)]


def same_frames(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("n", "gop"), [(1, 2), (4, 2), (31, 2), (12, 30)])
def test_a_plain_file_decodes_to_av_opens_frames(tmp_path: Path, n: int, gop: int) -> None:
    path = plain(tmp_path / "cam.mp4", n, seed=n, gop=gop)
    assert plain_decode.read_small(path) is not None  # the path under test is taken
    got = list(iter_frames(path))
    assert len(got) == n
    assert same_frames(got, through_av_open(path))


def test_two_files_decoded_interleaved_keep_their_own_frames(tmp_path: Path) -> None:
    a, b = plain(tmp_path / "a.mp4", 6, seed=3), plain(tmp_path / "b.mp4", 6, seed=4)
    pairs = list(zip(iter_frames(a), iter_frames(b), strict=True))
    assert same_frames([p[0] for p in pairs], through_av_open(a))
    assert same_frames([p[1] for p in pairs], through_av_open(b))


def test_a_bframe_file_takes_av_opens_path(tmp_path: Path) -> None:
    path = tmp_path / "b.mp4"
    encode_bframes(path, [textured(5, i, 64, 48) for i in range(8)], FPS, "libx264")
    assert plain_decode.read_small(path) is None  # composition offsets: not the plain shape
    assert same_frames(list(iter_frames(path)), through_av_open(path))


def test_a_file_over_the_bound_takes_av_opens_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = plain(tmp_path / "cam.mp4", 5)
    assert plain_decode.read_small(path) is not None
    monkeypatch.setattr(plain_decode, "SMALL_FILE", path.stat().st_size - 1)
    assert plain_decode.read_small(path) is None
    assert same_frames(list(iter_frames(path)), through_av_open(path))


def test_a_file_not_an_mp4_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "cam.mp4"
    path.write_bytes(b"\0" * 200)
    assert plain_decode.read_small(path) is None
    with pytest.raises(VideoError, match="cam.mp4"):
        list(iter_frames(path))


def damaged(src: Path, dst: Path) -> Path:
    """``src`` with the payload of its second sample overwritten by noise (boxes intact)."""
    data = bytearray(src.read_bytes())
    found = mp4_index.samples(bytes(data))
    assert found is not None
    at, size = found.spans[1]
    data[at + 5:at + size] = np.random.default_rng(0).integers(0, 256, size - 5, dtype=np.uint8).tobytes()
    dst.write_bytes(bytes(data))
    return dst


def test_a_damaged_sample_is_refused_naming_the_file_as_av_open_refuses_it(tmp_path: Path) -> None:
    path = damaged(plain(tmp_path / "cam.mp4", 6, seed=7), tmp_path / "bad.mp4")
    assert plain_decode.read_small(path) is not None  # the boxes still read: decoded here
    with pytest.raises(av.FFmpegError):
        through_av_open(path)  # the damage is one a decoder refuses
    with pytest.raises(VideoError, match="bad.mp4"):
        list(iter_frames(path))
