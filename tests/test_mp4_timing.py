"""formats/common/mp4_timing.py: a plain MP4's stream timing from its moov box alone is what
PyAV's demux reports (presentation and decode times, time base, duration): on the writer's
episode files, on v3 shards the export joins from them, and on seeded mutations of their
index; anything unusual is left to PyAV (None)."""

from __future__ import annotations

import random
from pathlib import Path

import av
import pytest
from dsfactory import Ep, make_dataset
from short_videos import encode_bframes, textured
from test_mp4_index import SHAPES, moov_range, mutations, without_edit_list, write

from eva_export.config import parse_config
from eva_export.errors import VideoError
from eva_export.export.paths import ExportPaths
from eva_export.export.runner import ExportService
from eva_export.formats.common import mp4_timing
from eva_export.formats.common.video import StreamTiming, stream_timing


def pyav(path: Path) -> StreamTiming | None:
    try:
        return stream_timing(path)
    except (VideoError, av.FFmpegError):
        return None


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("timing")
    out = [write(root / f"v{i}.mp4", w, h, n, fps) for i, (w, h, n, fps) in enumerate(SHAPES)]
    plain = root / "no-edit.mp4"
    plain.write_bytes(without_edit_list(out[0].read_bytes()))
    return [*out, plain]


def test_the_writers_files_and_the_v3_shards_are_timed_as_pyav_times_them(files: list[Path],
                                                                          tmp_path: Path) -> None:
    for path in files:
        mine = mp4_timing.stream_timing(path)
        assert mine is not None and mine == pyav(path), path.name
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [Ep(frames=3 + i, quality="green" if i % 3 else "red")
                                                            for i in range(7)], cameras=2, width=32, height=24)
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")},
                        "export": {"workers": 1, "v3_video_file_mb": 0.002}})
    assert ExportService(cfg, background=False, recover=False).run(src, "lerobot_v3").state == "completed"
    shards = sorted(ExportPaths.of(src, "lerobot_v3").pair_dir.rglob("*.mp4"))
    assert len(shards) > 4  # several shards per camera and subset
    for path in shards:
        mine = mp4_timing.stream_timing(path)
        assert mine is not None and mine == pyav(path), path


def test_mutated_indexes_are_timed_as_pyav_times_them_or_go_to_pyav(files: list[Path], tmp_path: Path) -> None:
    rng = random.Random(41)
    path = tmp_path / "m.mp4"
    answered, bad = 0, []
    for i, original in enumerate(files):
        data = original.read_bytes()
        for j, mutated in enumerate(mutations(data, rng, 300)):
            path.write_bytes(mutated)
            mine = mp4_timing.stream_timing(path)
            if mine is None:
                continue
            answered += 1
            if mine != pyav(path):
                bad.append(f"file {i} mutation {j}")
    assert not bad, bad[:5]
    assert answered > 150


def test_unusual_files_go_to_pyav(files: list[Path], tmp_path: Path) -> None:
    frames = [textured(2, i, 64, 48) for i in range(6)]
    encode_bframes(tmp_path / "b.mp4", frames, 30, "libx264")  # composition offsets
    assert mp4_timing.stream_timing(tmp_path / "b.mp4") is None
    data = files[0].read_bytes()
    lo, hi = moov_range(data)
    at = data.index(b"mdhd", lo, hi) + 4 + 16  # version 0: the duration field
    stated = bytearray(data)
    stated[at:at + 4] = (int.from_bytes(data[at:at + 4], "big") + 1).to_bytes(4, "big")
    (tmp_path / "d.mp4").write_bytes(bytes(stated))  # a duration other than the samples'
    assert mp4_timing.stream_timing(tmp_path / "d.mp4") is None
    (tmp_path / "cut.mp4").write_bytes(data[:-7])  # the last box runs past the end of the file
    assert mp4_timing.stream_timing(tmp_path / "cut.mp4") is None
    (tmp_path / "f.mp4").write_bytes(b"\0\0\0\x08free" * 4)
    assert mp4_timing.stream_timing(tmp_path / "f.mp4") is None
    assert mp4_timing.stream_timing(tmp_path / "absent.mp4") is None
