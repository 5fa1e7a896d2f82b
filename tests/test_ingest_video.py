"""Bag ingest of H.264 cameras (foxglove_msgs/msg/CompressedVideo): bags written by
`rosbags` with H.264 made by PyAV; the episode MP4 is the source's bitstream copied (frames decode
to exactly the source's pixels) when every row is the source's next frame from a keyframe on, and
encoded from the decoded frames otherwise; damaged or foreign streams are reported, never lost."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from eva_export.capture.ingest import BagIngest, IngestError
from eva_export.config import parse_config
from eva_export.formats.lerobot_v21.validate import validate_dataset

VIDEO_TYPE = "foxglove_msgs/msg/CompressedVideo"
# the message definition as foxglove_msgs ships it for ROS 2
VIDEO_MSG = "builtin_interfaces/Time timestamp\nstring frame_id\nuint8[] data\nstring format\n"
TS = get_typestore(Stores.ROS2_HUMBLE)
TS.register(get_types_from_msg(VIDEO_MSG, VIDEO_TYPE))
W, H, FPS, GOP = 64, 48, 30, 12
T0 = 1_700_000_000.0


def config(tmp_path: Path, **capture: Any) -> Any:
    cap = {"min_frames": 5, "frozen_frames": 30, "max_drop_ratio": 0.1, **capture}
    return parse_config({"collection": {
        "log_dir": str(tmp_path / "logs"), "fps": FPS, "robot_type": "sim",
        "tasks": [{"dataset_name": "bag", "task": "pick it"}],
        "streams": {"state": {"topic": "/s", "type": "JointState", "names": ["a", "b"]},
                    "cameras": [{"name": "front", "topic": "/v", "type": "CompressedVideo", "width": W, "height": H},
                                {"name": "raw", "topic": "/f", "type": "Image", "width": W, "height": H}]},
        "capture": cap}}).collection


def picture(m: int, w: int = W, h: int = H) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = (x * 4 + m * 3) % 256
    img[..., 1] = (y * 5) % 256
    img[..., 2] = (m * 7) % 256
    img[:8, (m % 8) * 8:(m % 8) * 8 + 8] = 255
    return img


def h264(n: int, w: int = W, h: int = H) -> list[bytes]:
    """n H.264 access units (Annex B, in-band SPS/PPS at every keyframe, no B-frames), by PyAV."""
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = w, h, "yuv420p"
    ctx.time_base = Fraction(1, FPS)
    ctx.gop_size = GOP
    ctx.options = {"preset": "ultrafast", "crf": "23", "bframes": "0"}
    out: list[bytes] = []
    for m in range(n):
        f = av.VideoFrame.from_ndarray(picture(m, w, h), format="rgb24")
        f.pts = m
        out += [bytes(p) for p in ctx.encode(f)]  # type: ignore[union-attr]  # a video codec
    out += [bytes(p) for p in ctx.encode(None)]  # type: ignore[union-attr]
    assert len(out) == n
    return out


def decode(packets: list[bytes]) -> list[np.ndarray]:
    ctx = av.CodecContext.create("h264", "r")
    return [f.to_ndarray(format="rgb24") for p in packets for f in ctx.decode(av.Packet(p))]  # type: ignore[union-attr]


def write_bag(path: Path, seconds: float, packets: list[bytes], fmt: str = "h264",
              late: dict[int, float] | None = None) -> Path:
    T = TS.types

    def stamp(t: float) -> Any:
        ns = round(t * 1e9)
        return T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9)

    events = [(k / 100.0, "/s", k) for k in range(int(seconds * 100))]
    events += [(0.003 + k / FPS + (late or {}).get(k, 0.0), "/v", k) for k in range(int(seconds * FPS))]
    events += [(0.004 + k / FPS, "/f", k) for k in range(int(seconds * FPS))]
    events.sort()
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conns = {"/s": w.add_connection("/s", "sensor_msgs/msg/JointState", typestore=TS),
                 "/v": w.add_connection("/v", VIDEO_TYPE, typestore=TS),
                 "/f": w.add_connection("/f", "sensor_msgs/msg/Image", typestore=TS)}
        for rel, topic, k in events:
            t = T0 + rel
            head = T["std_msgs/msg/Header"](stamp=stamp(t), frame_id="")
            if topic == "/s":
                msg: Any = T["sensor_msgs/msg/JointState"](header=head, name=["a", "b"], position=np.array([k, -k], float),
                                                           velocity=np.zeros(0), effort=np.zeros(0))
                ty = "sensor_msgs/msg/JointState"
            elif topic == "/v":
                msg = T[VIDEO_TYPE](timestamp=stamp(t), frame_id="cam", data=np.frombuffer(packets[k], np.uint8),
                                    format=fmt)
                ty = VIDEO_TYPE
            else:
                msg = T["sensor_msgs/msg/Image"](header=head, height=H, width=W, encoding="rgb8", is_bigendian=0,
                                                 step=W * 3, data=picture(k).reshape(-1).copy())
                ty = "sensor_msgs/msg/Image"
            w.write(conns[topic], round((t + 0.002) * 1e9), TS.serialize_cdr(msg, ty))
    return path


def rows(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "meta" / "episodes.jsonl").read_text().splitlines() if x.strip()]


def video(root: Path, cam: str, i: int) -> Path:
    return root / f"videos/chunk-000/observation.images.{cam}/episode_{i:06d}.mp4"


def mp4_frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_h264_camera_is_stream_copied_into_a_valid_dataset(tmp_path):
    col = config(tmp_path)
    packets = h264(60)
    res = BagIngest(col, write_bag(tmp_path / "bag", 2.0, packets), "bag").run()
    root = col.dataset_dir("bag")
    (row,) = rows(root)
    assert row["quality"] == "green", row["quality_issues"]
    assert len(validate_dataset(root).episodes) == 1
    got = mp4_frames(video(root, "front", 0))
    # row 0: the keyframe that opened the bag (the grid starts once every stream delivered, on the
    # newest keyframe before that moment)
    assert len(got) == row["length"] >= 58
    want = decode(packets)
    # a copy decodes to the source's pixels exactly (an encode at any quality would not)
    first = next(k for k, w in enumerate(want) if np.array_equal(w, got[0]))
    assert first == 0 and all(np.array_equal(g, w) for g, w in zip(got, want[first:], strict=False))
    with av.open(str(video(root, "front", 0))) as c:
        st = c.streams.video[0]
        assert st.codec_context.name == "h264"
        pts = [p.pts * st.time_base for p in c.demux(st) if p.size and p.pts is not None]
    assert pts == [Fraction(k, FPS) for k in range(row["length"])]  # frame k at k/fps: on the grid
    assert len(mp4_frames(video(root, "raw", 0))) == row["length"]
    assert res.episodes[0]["quality"] == "green"
    assert not list(root.rglob("*.h264"))  # the side file never reaches the dataset


def test_cut_inside_a_gop_starts_at_the_next_keyframe_and_is_copied(tmp_path):
    col = config(tmp_path)
    packets = h264(90)
    BagIngest(col, write_bag(tmp_path / "bag", 3.0, packets), "bag", episodes="ranges:0.5-2.5").run()
    root = col.dataset_dir("bag")
    (row,) = rows(root)
    assert len(validate_dataset(root).episodes) == 1
    got = mp4_frames(video(root, "front", 0))
    want = decode(packets)
    assert len(got) == row["length"] and all(np.array_equal(g, w) for g, w in zip(got, want[2 * GOP:], strict=False))
    assert 40 <= row["length"] <= 52  # from frame 24 (the first keyframe after 0.5 s) to about 2.5 s


def test_back_to_back_episodes_each_start_at_a_keyframe(tmp_path):
    col = config(tmp_path)
    packets = h264(90)
    BagIngest(col, write_bag(tmp_path / "bag", 3.0, packets), "bag", episodes="ranges:0.1-1.0,1.05-2.9").run()
    root = col.dataset_dir("bag")
    assert [r["episode_index"] for r in rows(root)] == [0, 1]
    assert len(validate_dataset(root).episodes) == 2
    want = decode(packets)
    for ep, start in ((0, GOP), (1, 3 * GOP)):  # the first keyframes after 0.1 s and after 1.05 s
        got = mp4_frames(video(root, "front", ep))
        assert len(got) == rows(root)[ep]["length"] > 10
        assert all(np.array_equal(g, w) for g, w in zip(got, want[start:], strict=False))


def test_frames_off_the_grid_are_encoded_from_the_decoded_frames(tmp_path):
    col = config(tmp_path)
    packets = h264(60)
    # frame 30 delivered 20 ms late (stamp and log time): its row repeats frame 29, the copy is off
    BagIngest(col, write_bag(tmp_path / "bag", 2.0, packets, late={30: 0.02}), "bag").run()
    root = col.dataset_dir("bag")
    (row,) = rows(root)
    assert len(validate_dataset(root).episodes) == 1
    got = mp4_frames(video(root, "front", 0))
    assert len(got) == row["length"] >= 45
    want = decode(packets)
    diffs = [min(np.abs(g.astype(int) - w.astype(int)).mean() for w in want) for g in got]
    assert max(diffs) < 3.0  # the source's pixels, re-encoded (lossy)
    assert sum(d > 0 for d in diffs) > len(got) // 2  # not the copy: an exact match is rare after x264


def test_truncated_nal_is_reported_and_the_episode_encoded(tmp_path):
    col = config(tmp_path)
    packets = h264(60)
    packets[20] = packets[20][: len(packets[20]) // 2]  # a P-frame cut inside its slice NAL
    BagIngest(col, write_bag(tmp_path / "bag", 2.0, packets), "bag").run()
    root = col.dataset_dir("bag")
    (row,) = rows(root)
    details = " ".join(i["detail"] for i in row["quality_issues"])
    assert "undecodable frame" in details and "h264 frame 20" in details, row["quality_issues"]
    assert len(validate_dataset(root).episodes) == 1
    assert len(mp4_frames(video(root, "front", 0))) == row["length"]


def test_garbage_instead_of_h264_is_reported_not_copied(tmp_path):
    col = config(tmp_path)
    packets = h264(60)
    packets[0] = b"\x00\x00\x00\x01" + bytes(range(256)) * 4  # no SPS, no picture: nothing decodes first
    BagIngest(col, write_bag(tmp_path / "bag", 2.0, packets), "bag").run()
    root = col.dataset_dir("bag")
    (row,) = rows(root)
    assert "undecodable frame" in json.dumps(row["quality_issues"])
    assert len(mp4_frames(video(root, "front", 0))) == row["length"]
    assert len(validate_dataset(root).episodes) == 1


def test_a_stream_of_another_size_is_reported_and_encoded_from_placeholders(tmp_path):
    col = config(tmp_path)
    BagIngest(col, write_bag(tmp_path / "bag", 2.0, h264(60, 32, 24)), "bag").run()
    root = col.dataset_dir("bag")
    (row,) = rows(root)
    assert row["quality"] == "red" and "front: 32x24 received, 64x48 configured" in json.dumps(row["quality_issues"])
    got = mp4_frames(video(root, "front", 0))
    assert len(got) == row["length"] and got[0].shape == (H, W, 3)  # the configured size, never the stream's
    assert len(validate_dataset(root).episodes) == 1


def test_wrong_format_string_is_refused_naming_the_bag_file_and_topic(tmp_path):
    col = config(tmp_path)
    bag = write_bag(tmp_path / "bag", 1.0, h264(30), fmt="h265")
    with pytest.raises(IngestError) as err:
        BagIngest(col, bag, "bag").run()
    msg = str(err.value)
    assert "/v" in msg and "h265" in msg and ".mcap" in msg and str(bag) in msg
    root = col.dataset_dir("bag")
    assert not (root / "meta" / "episodes.jsonl").exists() or not rows(root)


def test_compressed_video_cdr_is_read_as_a_view_and_a_cut_buffer_is_left_to_the_generic_decoder():
    from eva_export.formats.rosbag2 import cdr as bagcdr

    T = TS.types
    msg = T[VIDEO_TYPE](timestamp=T["builtin_interfaces/msg/Time"](sec=7, nanosec=9), frame_id="cam",
                        data=np.arange(37, dtype=np.uint8), format="h264")
    buf = bytes(TS.serialize_cdr(msg, VIDEO_TYPE))
    got = bagcdr.decode(VIDEO_TYPE, memoryview(buf))
    assert isinstance(got, bagcdr.CompressedVideo)
    assert (got.timestamp.sec, got.timestamp.nanosec, got.frame_id, got.format) == (7, 9, "cam", "h264")
    assert np.array_equal(got.data, np.arange(37)) and not got.data.flags.owndata  # a view of the buffer
    for cut in (len(buf) - 1, len(buf) - 6, 20, 9):
        assert bagcdr.decode(VIDEO_TYPE, memoryview(buf[:cut])) is None
