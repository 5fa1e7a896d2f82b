"""MCAP export: real datasets from dsfactory, read back with the mcap reader (CRCs validated)."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, image, make_subset, replace_video, state_value
from mcap.exceptions import DecoderNotFoundError
from mcap.reader import make_reader

from eva_export.errors import ExportError
from eva_export.export.records import QualitySplit
from eva_export.formats.common.table import to_numpy
from eva_export.formats.mcap_eva.exporter import McapExporter, decode_image
from eva_export.formats.mcap_eva.options import McapOptions

W, H, FPS = 64, 48, 30
TOL = 5


def subset(root: Path, eps: list[Ep], **kw: object) -> Path:
    return make_subset(root, eps, "accepted", **kw)


@pytest.mark.parametrize("compression", ["lz4", "zstd", "none"])
def test_mcap_round_trip(tmp_path: Path, compression: str) -> None:
    src = subset(tmp_path / "src", [Ep(frames=7, note="n"), Ep(frames=5, quality="red", verdict="fail")], fps=FPS)
    out = tmp_path / "out"
    ex = McapExporter(McapOptions(compression=compression), chunk_size=64 * 1024)
    ex.export(src, out)
    assert ex.verify(out).ok
    info = json.loads((out / "meta/info.json").read_text())
    assert info["dataset_format"] == "mcap" and info["embedded_images"] is True and info["total_videos"] == 0
    assert "video_path" not in info and info["data_path"].endswith(".mcap")
    assert QualitySplit.read(out).dataset_format == "mcap"
    rows = [json.loads(line) for line in (src / "meta/episodes.jsonl").read_text().splitlines()]
    cams = ["observation.images.cam0", "observation.images.cam1"]
    for ep, n in enumerate([7, 5]):
        table = pq.read_table(src / f"data/chunk-000/episode_{ep:06d}.parquet")
        with open(out / f"data/chunk-000/episode_{ep:06d}.mcap", "rb") as fh:
            reader = make_reader(fh, validate_crcs=True)
            header = reader.get_header()
            assert header.profile == "eva-client" and header.library == "eva-client"
            summary = reader.get_summary()
            assert summary is not None and summary.chunk_indexes  # chunked and indexed
            assert {s.name for s in summary.schemas.values()} == {"eva_client.episode", "eva_client.image"}
            assert all(s.encoding == "jsonschema" for s in summary.schemas.values())
            topics = {c.topic: c for c in summary.channels.values()}
            assert set(topics) == {"episode", *(f"episode/image/{k}" for k in cams)}
            assert all(c.message_encoding == "messagepack" for c in topics.values())
            assert summary.statistics.message_count == 1 + 2 * n
            file_order = [(c.topic, m.log_time, m.publish_time, m.sequence, m.data)
                          for _, c, m in reader.iter_messages(log_time_order=False)]
        assert [t for t, *_ in file_order][:3] == ["episode", *(f"episode/image/{k}" for k in cams)]
        log_times = [lt for _, lt, *_ in file_order]
        assert log_times == sorted(log_times)  # written in time order, cameras interleaved
        meta_msgs = [d for t, _, _, _, d in file_order if t == "episode"]
        assert len(meta_msgs) == 1
        payload = msgpack.unpackb(meta_msgs[0], raw=False)
        assert set(payload) == {"columns", "images", "metadata"} and payload["images"] == {}
        assert payload["metadata"] == {**rows[ep], "fps": FPS}
        assert list(payload["columns"]) == table.column_names
        for name in table.column_names:
            np.testing.assert_array_equal(np.asarray(payload["columns"][name]), to_numpy(table.column(name)))
        np.testing.assert_array_equal(np.asarray(payload["columns"]["observation.state"][2], np.float32),
                                      state_value(ep, 2))
        for c, key in enumerate(cams):
            msgs = [(lt, pt, seq, d) for t, lt, pt, seq, d in file_order if t == f"episode/image/{key}"]
            assert [seq for _, _, seq, _ in msgs] == list(range(n))
            assert [lt for lt, *_ in msgs] == [(i + 1) * 1_000_000_000 // FPS for i in range(n)]
            assert all(lt == pt for lt, pt, *_ in msgs)
            for i, (*_, data) in enumerate(msgs):
                msg, img = decode_image(data)
                assert msg["frame_index"] == i and msg["encoding"] == "rgb8"
                assert (msg["height"], msg["width"], msg["step"]) == (H, W, 3 * W)
                assert msg["timestamp"] == pytest.approx(i / FPS)
                want = image(ep, i, c, W, H).reshape(-1, 3).mean(0)
                assert np.all(np.abs(img.reshape(-1, 3).mean(0) - want) <= TOL)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_mcap_is_refused_by_the_ros2_bag_reader(tmp_path: Path) -> None:
    from mcap_ros2.reader import read_ros2_messages

    src = subset(tmp_path / "src", [Ep(frames=3)], cameras=1)
    out = tmp_path / "out"
    McapExporter().export(src, out)
    path = out / "data/chunk-000/episode_000000.mcap"
    decoded = []
    with pytest.raises(DecoderNotFoundError, match="messagepack"):
        for m in read_ros2_messages(path):
            decoded.append(m)
    assert not decoded
    with open(path, "rb") as fh:
        assert make_reader(fh).get_header().profile != "ros2"


def test_mcap_camera_ending_early_fails(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=6), Ep(frames=8)])
    replace_video(src, "observation.images.cam1", 1, 6)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="episode 1: camera observation.images.cam1 ends early at frame 6 of 8"):
        McapExporter().export(src, out)
    assert not (out / "data/chunk-000/episode_000001.mcap").exists()
    assert not list(out.rglob("*.partial"))


def test_mcap_camera_with_trailing_frames_fails(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=6)])
    replace_video(src, "observation.images.cam0", 0, 7)
    with pytest.raises(ExportError, match="episode 0: camera observation.images.cam0 has frames after"):
        McapExporter().export(src, tmp_path / "out")


def test_mcap_rerun_keeps_finished_episodes(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=4), Ep(frames=5)], cameras=1)
    out = tmp_path / "out"
    McapExporter().export(src, out)
    (out / "data/chunk-000/episode_000001.mcap").write_bytes(b"\x89MCAP0\r\ntruncated")
    ex = McapExporter()
    ex.export(src, out)
    assert ex.resumed == [0]
    assert ex.verify(out).ok
