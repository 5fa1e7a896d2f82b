"""Ingest speed: the zero-copy paths give exactly what the generic ones gave.

* bag reading: our chunk walk and CDR views (bagreader.py, bagcdr.py) against mcap's own reader
  and mcap-ros2-support's decoder, on bags written by `rosbags` and re-chunked by `mcap`'s writer
  (zstd, lz4, uncompressed: independent writers), big-endian messages included;
* end to end: the same messages little-endian (views) and big-endian (the generic decoder's
  copies) ingest to byte-identical videos and equal tables;
* video: a frame wrapped in place (unaligned, read-only, padded rows; channel-reversed and flipped
  views are copied first) encodes to the same bytes as an aligned copy, and the per-camera
  encoder threads write the same bytes as one encoder run serially.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from bag_helpers import FPS, TOPICS, TS, H, W, frame, jpeg, make_config, offline, write_bag
from mcap.reader import make_reader
from mcap.writer import CompressionType
from mcap.writer import Writer as McapWriter
from mcap_ros2.decoder import DecoderFactory
from rosbags.rosbag2 import StoragePlugin, Writer

from eva_export.capture.ingest import BagIngest
from eva_export.formats.common.records import Feature
from eva_export.formats.common.video import VideoEncoder, VideoSettings
from eva_export.formats.lerobot_v21.writer import DatasetWriter, make_features
from eva_export.formats.rosbag2 import cdr as bagcdr
from eva_export.formats.rosbag2.files import open_bag
from eva_export.formats.rosbag2.reader import BagReader

T = TS.types


def _header(k: int, frame_id: str) -> Any:
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=1_700_000_000 + k, nanosec=7 * k + 1),
                                    frame_id=frame_id)


def _odd_messages() -> list[tuple[str, str, Any]]:
    """(topic, type, message) with every alignment case the fixed layouts meet: frame ids and
    encodings of every length mod 4, odd data sizes, empty arrays, non-ASCII names."""
    out: list[tuple[str, str, Any]] = []
    for k, fid in enumerate(["", "a", "ab", "abc", "abcd", "kamera_ü"]):
        enc = ["rgb8", "bgr8", "mono8", "8UC3", "rgba8", "x"][k]
        w, h = 3 + k, 2 + k
        data = (np.arange(w * h * 3 + k) % 251).astype(np.uint8)
        out.append(("/img", "sensor_msgs/msg/Image", T["sensor_msgs/msg/Image"](
            header=_header(k, fid), height=h, width=w, encoding=enc, is_bigendian=k % 2, step=w * 3 + k, data=data)))
        out.append(("/jpg", "sensor_msgs/msg/CompressedImage", T["sensor_msgs/msg/CompressedImage"](
            header=_header(k, fid), format="jpeg"[: k % 5], data=data[: 5 + k])))
        out.append(("/js", "sensor_msgs/msg/JointState", T["sensor_msgs/msg/JointState"](
            header=_header(k, fid), name=["j", "ü" * k, ""][: k % 4], position=np.linspace(-1, 1, k % 4),
            velocity=np.arange(k % 3, dtype=np.float64), effort=np.zeros(0))))
    return out


def _write_rosbags(path: Path, msgs: list[tuple[str, str, Any]], little_endian: bool = True) -> Path:
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conns: dict[str, Any] = {}
        for k, (topic, ty, msg) in enumerate(msgs):
            if topic not in conns:
                conns[topic] = w.add_connection(topic, ty, typestore=TS)
            w.write(conns[topic], 1_000 + k, bytes(TS.serialize_cdr(msg, ty, little_endian=little_endian)))
    return path


def _rechunk(src: Path, dst: Path, compression: CompressionType, chunk_size: int) -> Path:
    """The same records written again by mcap's own writer (another chunking and compression)."""
    dst.mkdir()
    (mcap,) = src.glob("*.mcap")
    with open(mcap, "rb") as fh, open(dst / "bag.mcap", "wb") as out:
        reader = make_reader(fh)
        w = McapWriter(out, chunk_size=chunk_size, compression=compression)
        w.start(profile="ros2", library="test")
        ids: dict[int, int] = {}
        chans: dict[int, int] = {}
        for schema, channel, m in reader.iter_messages(log_time_order=False):
            if schema.id not in ids:
                ids[schema.id] = w.register_schema(schema.name, schema.encoding, schema.data)
            if channel.id not in chans:
                chans[channel.id] = w.register_channel(channel.topic, channel.message_encoding, ids[schema.id])
            w.add_message(chans[channel.id], m.log_time, m.data, m.publish_time, m.sequence)
        w.finish()
    return dst


def _reference(bag: Path) -> list[tuple[int, str, Any]]:
    out = []
    for f in open_bag(bag).files:
        with open(f, "rb") as fh:
            for _s, ch, m, dm in make_reader(fh, decoder_factories=[DecoderFactory()]).iter_decoded_messages(
                    log_time_order=False):
                out.append((m.log_time, ch.topic, dm))
    return out


_FIELDS = ("height", "width", "encoding", "is_bigendian", "step", "format")


def _assert_same(bag: Path) -> int:
    """Every message of the bag as BagReader gives it equals mcap's reader + mcap-ros2's decoder."""
    ref = _reference(bag)
    got = list(BagReader(open_bag(bag), {t for _, t, _ in ref}, lambda topic, ty: None))
    assert len(got) == len(ref) > 0
    for g, (log_ns, topic, want) in zip(got, ref, strict=True):
        assert (g.topic, g.log_time) == (topic, log_ns * 1e-9)
        m = g.msg
        if hasattr(want, "header"):
            assert (m.header.stamp.sec, m.header.stamp.nanosec, m.header.frame_id) == (
                want.header.stamp.sec, want.header.stamp.nanosec, want.header.frame_id)
        for key in _FIELDS:
            if hasattr(want, key):
                assert getattr(m, key) == getattr(want, key), (topic, key)
        if hasattr(want, "data") and hasattr(want, "header"):  # the image types
            assert bytes(m.data) == bytes(want.data), topic
        elif hasattr(want, "data"):
            assert list(m.data) == list(want.data), topic
        if hasattr(want, "name"):
            assert list(m.name) == list(want.name)
            for key in ("position", "velocity", "effort"):
                assert np.array_equal(np.asarray(getattr(m, key), np.float64),
                                      np.asarray(getattr(want, key), np.float64)), key
    return len(got)


def test_cdr_views_equal_the_generic_decoder_for_every_alignment(tmp_path: Path) -> None:
    msgs = _odd_messages()
    bag = _write_rosbags(tmp_path / "le", msgs)
    assert _assert_same(bag) == len(msgs)
    raw = next(bag.glob("*.mcap")).read_bytes()
    assert raw.count(b"kamera_\xc3\xbc") >= 3  # the non-ASCII frame id really is in the file


def test_big_endian_messages_take_the_generic_decoder(tmp_path: Path) -> None:
    msgs = _odd_messages()
    bag = _write_rosbags(tmp_path / "be", msgs, little_endian=False)
    assert _assert_same(bag) == len(msgs)
    got = list(BagReader(open_bag(bag), {"/img"}, lambda topic, ty: None))
    assert got and not any(isinstance(g.msg, bagcdr.Image) for g in got)


@pytest.mark.parametrize("compression", [CompressionType.ZSTD, CompressionType.LZ4, CompressionType.NONE])
def test_chunks_of_another_writer_read_the_same(tmp_path: Path, compression: CompressionType) -> None:
    bag = write_bag(tmp_path / "bag", offline(1.0))
    # small chunks: many chunk boundaries, several messages per chunk and records split across none
    other = _rechunk(bag, tmp_path / "other", compression, chunk_size=4096)
    n = _assert_same(other)
    assert n == _assert_same(bag) == len(offline(1.0))


def test_a_length_past_the_buffer_is_left_to_the_generic_decoder() -> None:
    img = frame(3, 0)
    msg = T["sensor_msgs/msg/Image"](header=_header(1, "cam"), height=H, width=W, encoding="rgb8", is_bigendian=0,
                                     step=W * 3, data=img.reshape(-1).copy())
    buf = bytes(TS.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    whole = bagcdr.decode("sensor_msgs/msg/Image", memoryview(buf))
    assert isinstance(whole, bagcdr.Image) and np.array_equal(whole.data.reshape(H, W, 3), img)
    assert not whole.data.flags.writeable  # a view of the message buffer, not a copy
    for cut in (3, 10, 40, len(buf) - 1):
        assert bagcdr.decode("sensor_msgs/msg/Image", memoryview(buf[:cut])) is None
    comp = T["sensor_msgs/msg/CompressedImage"](header=_header(1, "cam"), format="jpeg",
                                                data=np.frombuffer(jpeg(img), np.uint8))
    cbuf = bytes(TS.serialize_cdr(comp, "sensor_msgs/msg/CompressedImage"))
    assert bagcdr.decode("sensor_msgs/msg/CompressedImage", memoryview(cbuf[:-1])) is None
    assert bagcdr.decode("std_msgs/msg/String", memoryview(cbuf)) is None  # not a fixed layout


def _frames(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [(frame(k, 0) ^ rng.integers(0, 16, (H, W, 3), dtype=np.uint8)) for k in range(n)]


def _encode(path: Path, frames: list[np.ndarray]) -> bytes:
    with VideoEncoder(path, W, H, FPS, VideoSettings()) as enc:
        for f in frames:
            enc.add(f)
    return path.read_bytes()


def test_a_wrapped_frame_encodes_to_the_bytes_of_an_aligned_copy(tmp_path: Path) -> None:
    frames = _frames(25)
    want = _encode(tmp_path / "copy.mp4", [np.ascontiguousarray(f).copy() for f in frames])

    def unaligned(f: np.ndarray, off: int) -> np.ndarray:
        return np.frombuffer(bytes(off) + f.tobytes(), np.uint8)[off:].reshape(H, W, 3)  # read-only

    def padded(f: np.ndarray) -> np.ndarray:
        rows = np.zeros((H, W * 3 + 7), np.uint8)
        rows[:, : W * 3] = f.reshape(H, -1)
        return rows[:, : W * 3].reshape(H, W, 3)

    views = {"unaligned": [unaligned(f, 1 + k % 7) for k, f in enumerate(frames)],
             "padded": [padded(f) for f in frames],
             "reversed": [np.ascontiguousarray(f[..., ::-1])[..., ::-1] for f in frames],
             "flipped": [np.ascontiguousarray(f[::-1])[::-1] for f in frames]}
    assert not views["unaligned"][0].flags.writeable and views["reversed"][0].strides[2] == -1
    assert views["flipped"][0].strides[0] < 0
    for name, vs in views.items():
        assert _encode(tmp_path / f"{name}.mp4", vs) == want, name
    with av.open(str(tmp_path / "copy.mp4")) as c:
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(decoded) == len(frames)
    assert float(np.mean(np.abs(decoded[-1].astype(int) - frames[-1].astype(int)))) < 8.0


def test_camera_threads_write_the_bytes_of_a_serial_encoder(tmp_path: Path) -> None:
    keys = ("observation.images.a", "observation.images.b", "observation.images.c")
    feats = make_features({k: Feature.video(H, W, FPS, codec="h264") for k in keys})
    dw = DatasetWriter.open(tmp_path / "ds", fps=FPS, features=feats, robot_type="t")
    frames = {k: _frames(20)[i:] + _frames(20)[:i] for i, k in enumerate(keys)}
    ew = dw.begin_episode("t")
    for r in range(20):
        ew.add_frame({}, {k: frames[k][r] for k in keys})
    done = ew.finish()
    assert done.video_frames == {k: 20 for k in keys}
    for k in keys:
        serial = _encode(tmp_path / f"{k}.serial.mp4", frames[k])
        assert (ew.staging / f"{k}.mp4").read_bytes() == serial, k
    ew.abort()


def test_views_and_the_generic_decoder_give_the_same_dataset(tmp_path: Path) -> None:
    """The same messages, little-endian (zero-copy views) and big-endian (mcap-ros2's copies):
    byte-identical videos and equal tables."""
    recorded = offline(2.0)
    le = write_bag(tmp_path / "le", recorded)
    with Writer(tmp_path / "be", version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conns = {t: w.add_connection(t, ty, typestore=TS) for t, ty in TOPICS.items()}
        for r in recorded:
            w.write(conns[r.topic], r.log_ns, bytes(TS.serialize_cdr(r.msg, TOPICS[r.topic], little_endian=False)))
    col = make_config(tmp_path)
    for bag, name in ((le, "live"), (tmp_path / "be", "bag")):
        res = BagIngest(col, bag, name).run()
        assert res.episodes_done == 1 and not res.damage, res
    a, b = col.dataset_dir("live"), col.dataset_dir("bag")
    ta = pq.read_table(a / "data/chunk-000/episode_000000.parquet")
    tb = pq.read_table(b / "data/chunk-000/episode_000000.parquet")
    assert ta.num_rows > 50 and ta.equals(tb)
    for cam in ("front", "wrist"):
        rel = f"videos/chunk-000/observation.images.{cam}/episode_000000.mp4"
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), cam
