"""formats/v3_probe.index_probe: a plain MP4's probe read from its boxes equals PyAV's open and
demux of it (codec parameters, time base, reorder lead, size, every packet's bytes, times and
key flag), on the writer's files and on seeded mutations of them; anything else goes to PyAV."""

from __future__ import annotations

import os
import random
from fractions import Fraction
from pathlib import Path

import av
import pytest
from av.video.stream import VideoStream
from short_videos import encode_bframes, textured
from test_mp4_index import SHAPES, mutations, without_edit_list, write

from eva_export.formats.common import mp4_index, reuse
from eva_export.formats.common.video import VideoSettings
from eva_export.formats.lerobot_v3 import probe as v3_probe
from eva_export.formats.lerobot_v3.probe import Probe, index_probe


def pyav_probe(path: Path, fps: int, monkeypatch: pytest.MonkeyPatch) -> Probe | None:
    with monkeypatch.context() as m:
        m.setattr(v3_probe, "index_probe", lambda _path, _fps: None)
        return v3_probe.probe(path, fps, keep=True)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[bytes, int]]:
    root = tmp_path_factory.mktemp("mp4")
    out = [(write(root / f"v{i}.mp4", w, h, n, fps).read_bytes(), fps) for i, (w, h, n, fps) in enumerate(SHAPES)]
    out.append((without_edit_list(out[0][0]), out[0][1]))
    return out


def test_the_writers_files_probe_as_pyav_does(originals: list[tuple[bytes, int]], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for i, (data, fps) in enumerate(originals):
        path = tmp_path / f"o{i}.mp4"
        path.write_bytes(data)
        mine = index_probe(path, fps)
        assert mine is not None and mine.packets is not None, i
        assert mine == pyav_probe(path, fps, monkeypatch), i
        assert v3_probe.probe(path, fps, keep=True) == mine


def test_mutated_files_probe_as_pyav_does_or_go_to_pyav(originals: list[tuple[bytes, int]], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(28)
    answered = 0
    bad: list[str] = []
    path = tmp_path / "m.mp4"
    for i, (data, fps) in enumerate(originals):
        for j, mutated in enumerate(mutations(data, rng, 150)):
            path.write_bytes(mutated)
            mine = index_probe(path, fps)
            if mine is None:
                continue
            answered += 1
            if mine != pyav_probe(path, fps, monkeypatch):
                bad.append(f"shape {i} mutation {j}")
    assert not bad, bad[:5]
    assert answered > 100


def test_other_files_go_to_pyav(tmp_path: Path) -> None:
    frames = [textured(2, i, 64, 48) for i in range(6)]
    encode_bframes(tmp_path / "b.mp4", frames, 30, "libx264")  # composition offsets
    assert index_probe(tmp_path / "b.mp4", 30) is None
    assert index_probe(tmp_path / "absent.mp4", 30) is None
    # the writer's settings with a full-range VUI: the boxes are read, the pixel format is not
    full = tmp_path / "full.mp4"
    settings = VideoSettings()
    with av.open(str(full), "w", format="mp4") as c:
        s = c.add_stream(settings.codec, rate=30)
        assert isinstance(s, VideoStream)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        s.time_base = s.codec_context.time_base = Fraction(1, 30)
        s.codec_context.gop_size = settings.gop
        s.options = {"preset": settings.preset, "crf": "10", "x264-params": "fullrange=on"}
        for i, f in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(f, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 30)
            c.mux(s.encode(frame))
        c.mux(s.encode(None))
    assert mp4_index.read(full) is not None and index_probe(full, 30) is None
    with av.open(str(full)) as c:
        assert c.streams.video[0].codec_context.pix_fmt == "yuvj420p"


def test_a_second_read_of_an_unchanged_file_reuses_its_parse_within_a_bound(
        originals: list[tuple[bytes, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """reuse: validation's parse answers the writer's probe of the same unchanged file (once,
    the same probe as a fresh parse), never a changed file's, and only while there is room."""
    parsed: list[int] = []
    real = mp4_index._parse
    monkeypatch.setattr(mp4_index, "_parse", lambda data: parsed.append(len(data)) or real(data))
    data, fps = originals[0]
    paths = [tmp_path / f"r{i}.mp4" for i in range(3)]
    for p in paths:
        p.write_bytes(data)
        os.utime(p, ns=(1_000_000_000, 1_000_000_000))  # old enough to be trusted unchanged
    fresh = index_probe(paths[0], fps)
    monkeypatch.setitem(reuse.BUDGETS, reuse.PARSE, 2 * (512 + 160 * len(fresh.packets or ())))  # room for two
    with reuse.keeping():  # tables and statistics rows only: no MP4 parse kept
        assert mp4_index.parse(mp4_index.file_bytes(paths[0]) or b"") is not None
        assert not reuse.held(reuse.PARSE)
    with reuse.keeping(parses=True):
        for p in paths:  # validation's reads
            assert mp4_index.parse(mp4_index.file_bytes(p) or b"") is not None
        parsed.clear()
        assert index_probe(paths[0], fps) == fresh and parsed == []  # kept
        paths[1].write_bytes(data[:-1] + b"\x00")  # changed since (size kept, mtime now)
        index_probe(paths[1], fps)
        assert len(parsed) == 1  # parsed again
        index_probe(paths[2], fps)
        assert len(parsed) == 2  # over the bound: never kept
        assert index_probe(paths[0], fps) == fresh and len(parsed) == 3  # handed out once
    with reuse.keeping(parses=True):
        assert not reuse.held(reuse.PARSE)  # dropped when the job ended


def test_file_bytes_reads_what_a_file_grew_by_since_its_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """file_bytes reads the stated size, then the rest: every byte, and still the bound."""
    path = tmp_path / "g.mp4"
    path.write_bytes(bytes(range(256)) * 40)
    real = os.stat

    def stale(p: object) -> object:  # the stat taken before the file grew
        st = real(p)  # type: ignore[arg-type]
        return type("St", (), {"st_size": 100, "st_mtime_ns": st.st_mtime_ns, "st_dev": st.st_dev,
                               "st_ino": st.st_ino})()

    monkeypatch.setattr(mp4_index.os, "stat", stale)
    assert mp4_index.file_bytes(path) == path.read_bytes()
    monkeypatch.setattr(mp4_index, "MAX_BYTES", 5000)
    assert mp4_index.file_bytes(path) is None  # grown past the bound


def test_frame_slots_are_the_fraction_arithmetic_of_lerobots_tolerance() -> None:
    """probe.frame_slots (integers) against the Fraction form: the nearest frame (halves to even)
    and |t - i/fps| <= 1/10000 s, on time bases near and off the grid, halves included."""
    rng = random.Random(5)
    for tb, fps in [(Fraction(1, 15360), 30), (Fraction(1, 90000), 30), (Fraction(1, 1000), 30),
                    (Fraction(1, 60), 30), (Fraction(1001, 30000), 30), (Fraction(1, 12800), 25)]:
        ticks = [rng.randrange(-10**6, 10**7) for _ in range(300)] + [0, 1, -1]
        ticks += [int(Fraction(2 * k + 1, 2 * fps) / tb) for k in range(5)]  # about halfway
        want = []
        for t in ticks:
            i = round(t * tb * fps)
            want.append((i, abs(t * tb - Fraction(i, fps)) <= Fraction(1, 10000)))
        assert v3_probe.frame_slots(ticks, tb, fps) == want, (tb, fps)
