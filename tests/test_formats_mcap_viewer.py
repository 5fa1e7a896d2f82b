"""mcap_foxglove: read back with the viewers' own decoders (mcap-protobuf-support, mcap-ros2-support),
with PyAV for the frames, and converted by Rerun's own `rerun mcap convert`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_subset, replace_video
from mcap.reader import make_reader
from mcap.writer import Writer
from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoders
from mcap_ros2.decoder import DecoderFactory as Ros2Decoders
from short_videos import short_subset

from eva_export.config import parse_config
from eva_export.errors import ExportError
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats.common.images import decode_png
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.table import to_numpy
from eva_export.formats.common.video import iter_frames
from eva_export.formats.eva_store.codecs import encode_image
from eva_export.formats.mcap_viewer import layout
from eva_export.formats.mcap_viewer.exporter import McapViewerExporter
from eva_export.formats.mcap_viewer.options import ViewerOptions
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED

FPS = 30
CAMS = ["observation.images.cam0", "observation.images.cam1"]
NUMERIC = ["observation.state", "action", "capture_time"]
V21 = Path(__file__).resolve().parent / "fixtures" / "lerobot-written" / "v21"
RERUN = Path(sys.executable).parent / "rerun"
JPEG_TOL = 3.0  # mean absolute difference per pixel, JPEG quality 90 against the decoded source frame


def read_file(path: Path) -> tuple[Any, dict[str, list[tuple[Any, Any, Any]]], dict[str, dict[str, str]]]:
    """(header, topic -> [(schema name, message, decoded)], metadata records) through the decoders."""
    msgs: dict[str, list[tuple[Any, Any, Any]]] = {}
    with open(path, "rb") as fh:
        reader = make_reader(fh, validate_crcs=True, decoder_factories=[ProtobufDecoders(), Ros2Decoders()])
        header = reader.get_header()
        meta = {m.name: m.metadata for m in reader.iter_metadata()}
        for schema, channel, message, decoded in reader.iter_decoded_messages(log_time_order=False):
            msgs.setdefault(channel.topic, []).append((schema.name, message, decoded))
    return header, msgs, meta


def h264_frames(datas: list[bytes]) -> list[np.ndarray]:
    cc = av.CodecContext.create("h264", "r")
    out = [f.to_ndarray(format="rgb24") for d in datas for f in cc.decode(av.Packet(d))]
    return out + [f.to_ndarray(format="rgb24") for f in cc.decode(None)]


def export(src: Path, out: Path, options: ViewerOptions = ViewerOptions()) -> McapViewerExporter:
    ex = McapViewerExporter(options)
    ex.export(src, out)
    return ex


def test_values_frames_and_metadata_equal_the_source(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=7, note="looked fine"), Ep(frames=5, quality="red", verdict="pass",
                      issues=[{"code": "dropped_frames", "severity": "error", "detail": "2 slots"}])], "accepted", fps=FPS)
    dataclasses.replace(QualitySplit.read(src), source_episode_indices=[3, 8]).write(src)
    out = tmp_path / "out"
    export(src, out)
    report = McapViewerExporter().verify(out)
    assert report.ok, report.errors
    info = json.loads((out / "meta/info.json").read_text())
    assert info["dataset_format"] == "mcap_foxglove" and info["embedded_images"] is True and info["total_videos"] == 0
    assert QualitySplit.read(out).dataset_format == "mcap_foxglove"
    rows = [json.loads(line) for line in (src / "meta/episodes.jsonl").read_text().splitlines()]
    meta = read_meta(src)
    for ep, n in enumerate([7, 5]):
        header, msgs, records = read_file(out / f"data/chunk-000/episode_{ep:06d}.mcap")
        assert header.profile == "eva-viewer" and header.library.startswith("eva-export ")
        assert set(msgs) == {f"/{k}" for k in CAMS + NUMERIC} | {"/eva_export/episode"}
        table = pq.read_table(src / f"data/chunk-000/episode_{ep:06d}.parquet")
        stamps = [i * 1_000_000_000 // FPS for i in range(n)]
        for key in NUMERIC:
            got = msgs[f"/{key}"]
            assert [s for s, _, _ in got] == ["sensor_msgs/msg/JointState"] * n
            assert [m.sequence for _, m, _ in got] == list(range(n)) and [m.log_time for _, m, _ in got] == stamps
            want = to_numpy(table.column(key)).reshape(n, -1).astype(np.float64)
            np.testing.assert_array_equal(np.array([list(d.position) for _, _, d in got]), want)  # exact
            names = list(got[0][2].name)
            assert names == ([f"joint_{j}" for j in range(6)] if key != "capture_time" else ["capture_time[0]"])
            assert [d.header.stamp.sec * 10**9 + d.header.stamp.nanosec for _, _, d in got] == stamps
        for key in CAMS:
            got = msgs[f"/{key}"]
            assert {s for s, _, _ in got} == {"foxglove.CompressedVideo"}
            assert all(d.format == "h264" and d.frame_id == key and d.timestamp.ToNanoseconds() == t
                       for (_, _, d), t in zip(got, stamps, strict=True))
            frames = h264_frames([d.data for _, _, d in got])
            want = list(iter_frames(meta.video_path(key, ep)))
            assert len(frames) == len(want) == n  # the source's own bitstream: the same pixels
            assert all(np.array_equal(a, b) for a, b in zip(frames, want, strict=True))
        rec = records["eva_export.episode"]
        assert rec["subset"] == "accepted" and json.loads(rec["source_episode_index"]) == [3, 8][ep]
        assert json.loads(rec["tasks"]) == rows[ep]["tasks"] and json.loads(rec["length"]) == n
        assert rec["quality"] == rows[ep]["quality"] and rec.get("qc_verdict", "") == rows[ep].get("qc_verdict", "")
        assert rec.get("note", "") == rows[ep].get("note", "")
        if ep == 1:
            assert json.loads(rec["quality_issues"])[0]["code"] == "dropped_frames"
        [(schema, message, text)] = msgs["/eva_export/episode"]
        assert schema == "std_msgs/msg/String" and message.log_time == 0
        assert text.data.startswith(f"accepted episode {ep} (raw episode {[3, 8][ep]}), {n} frames at {FPS} fps\n")
        assert f"operator: {rows[ep].get('qc_verdict') or 'no verdict'}" in text.data
        record = json.loads(text.data.split("\n\n", 1)[1])  # the metadata record, as JSON
        assert record == {k: v if isinstance(record.get(k), str) else json.loads(v) for k, v in rec.items()}


def rerun_entities(mcap: Path, tmp_path: Path) -> dict[str, list[Any]]:
    """Rerun's own conversion: entity path -> its data record batches."""
    from rerun.chunk import RrdReader

    assert RERUN.exists(), f"{RERUN}: rerun-sdk is pinned in requirements.txt (make setup installs it)"
    rrd = tmp_path / (mcap.stem + ".rrd")
    proc = subprocess.run([str(RERUN), "mcap", "convert", str(mcap), "-o", str(rrd)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[Any]] = {}
    for chunk in RrdReader(rrd).stream():
        if chunk.num_rows:
            out.setdefault(str(chunk.entity_path), []).append(chunk.to_record_batch())
    return out


def column(batches: list[Any], name: str) -> list[Any]:
    return [v for b in batches if name in b.schema.names for v in b.column(name).to_pylist()]


def check_rerun(mcap: Path, tmp_path: Path, table: Any, cams: dict[str, str], numeric: dict[str, list[str]]) -> None:
    """One image or video entity per camera, one named Scalars series per dimension, counts = rows."""
    ents = rerun_entities(mcap, tmp_path)
    n = table.num_rows
    for key, component in cams.items():
        assert len(column(ents[f"/{key}"], component)) == n, (key, component, sorted(ents))
    for key, names in numeric.items():
        batches = ents[f"/{key}/position"]
        scalars = column(batches, "Scalars:scalars")
        assert len(scalars) == n and all(len(s) == len(names) for s in scalars)
        assert column(batches, "SeriesLines:names")[0] == names
        want = to_numpy(table.column(key)).reshape(n, -1).astype(np.float64)
        np.testing.assert_array_equal(np.array(scalars), want)
    assert "eva_export.episode" in ents["/__mcap_metadata"][0].schema.names
    assert len(column(ents["/eva_export/episode"], "TextDocument:text")) == 1


def test_rerun_converts_every_camera_and_dimension(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=9)], "accepted", fps=FPS)
    export(src, tmp_path / "out")
    table = pq.read_table(src / "data/chunk-000/episode_000000.parquet")
    names = {k: [f"joint_{j}" for j in range(6)] for k in NUMERIC[:2]} | {"capture_time": ["capture_time[0]"]}
    check_rerun(tmp_path / "out/data/chunk-000/episode_000000.mcap", tmp_path, table,
                {k: "VideoStream:sample" for k in CAMS}, names)


def test_lerobot_written_dataset_through_the_export_job(tmp_path: Path) -> None:
    """LeRobot's own v2.1 (AV1 camera, no quality fields: every episode unrated, so rejected):
    split, staged, verified, published as a pair with the accepted side empty; the AV1 camera
    is carried as JPEG images within a tolerance of the source frames."""
    src = tmp_path / "data" / "v21"
    shutil.copytree(V21, src)
    cfg = parse_config({"export": {"data_roots": [str(tmp_path / "data")], "jobs_dir": str(tmp_path / "jobs")}})
    job = ExportService(cfg, background=False, recover=False).run(src, "mcap_foxglove")
    assert job.state == COMPLETED, job.error
    assert (job.accepted_episodes, job.rejected_episodes, job.rejected_frames) == (0, 2, 35)
    accepted, rejected = Path(job.accepted_dir), Path(job.rejected_dir)
    for d in (accepted, rejected):
        rep = verify_export(d)
        assert rep.ok, rep.errors
    meta = read_meta(src)
    names = [f"joint_{j}" for j in range(6)]
    for ep in meta.episodes:
        path = rejected / f"data/chunk-000/episode_{ep.episode_index:06d}.mcap"
        _, msgs, records = read_file(path)
        want = list(iter_frames(meta.video_path("observation.images.cam", ep.episode_index)))
        got = msgs["/observation.images.cam"]
        assert len(got) == len(want) == ep.length
        assert {s for s, _, _ in got} == {"foxglove.CompressedImage"} and {d.format for _, _, d in got} == {"jpeg"}
        for (_, _, msg), frame in zip(got, want, strict=True):
            assert np.abs(decode_png(msg.data, "test").astype(int) - frame.astype(int)).mean() < JPEG_TOL
        assert records["eva_export.episode"]["subset"] == "rejected"
        assert json.loads(records["eva_export.episode"]["tasks"]) == ep.tasks
        table = pq.read_table(meta.data_path(ep.episode_index))
        check_rerun(path, tmp_path, table, {"observation.images.cam": "EncodedImage:blob"},
                    {"observation.state": names, "action": names})


def test_parquet_png_column_is_copied(tmp_path: Path) -> None:
    """A LeRobot ``image`` feature (PNG bytes in Parquet) goes into CompressedImage as it is."""
    src = make_subset(tmp_path / "src", [Ep(frames=5)], cameras=1)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.images.wrist"] = {"dtype": "image", "shape": [48, 64, 3],
                                                    "names": ["height", "width", "channels"]}
    (src / "meta/info.json").write_text(json.dumps(info, indent=4))
    path = src / "data/chunk-000/episode_000000.parquet"
    table = pq.read_table(path)
    rng = np.random.default_rng(0)
    pngs = [encode_image(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), "png") for _ in range(5)]
    col = pa.array([{"bytes": b, "path": f"frame_{r:06d}.png"} for r, b in enumerate(pngs)],
                   type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(table.append_column("observation.images.wrist", col), path)
    out = tmp_path / "out"
    export(src, out)
    rep = verify_export(out)
    assert rep.ok, rep.errors
    _, msgs, _ = read_file(out / "data/chunk-000/episode_000000.mcap")
    got = msgs["/observation.images.wrist"]
    assert [(s, d.format, d.data) for s, _, d in got] == [("foxglove.CompressedImage", "png", b) for b in pngs]
    assert {s for s, _, _ in msgs["/observation.images.cam0"]} == {"foxglove.CompressedVideo"}


def test_bframes_camera_is_carried_as_images(tmp_path: Path) -> None:
    """Viewers cannot play H.264 with B-frames as CompressedVideo: such a camera becomes JPEG images."""
    src = short_subset(tmp_path / "src", [12])
    out = tmp_path / "out"
    export(src, out)
    assert McapViewerExporter().verify(out).ok
    _, msgs, _ = read_file(out / "data/chunk-000/episode_000000.mcap")
    got = msgs["/observation.images.cam0"]
    assert len(got) == 12 and {s for s, _, _ in got} == {"foxglove.CompressedImage"}
    want = list(iter_frames(read_meta(src).video_path("observation.images.cam0", 0)))
    for (_, _, msg), frame in zip(got, want, strict=True):
        assert np.abs(decode_png(msg.data, "test").astype(int) - frame.astype(int)).mean() < JPEG_TOL


@pytest.mark.parametrize(("frames", "what"), [(5, "ends early at frame 5 of 8"), (10, "has frames after the table's 8 rows")])
def test_camera_frame_count_mismatch_fails_naming_the_source(tmp_path: Path, frames: int, what: str) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=4), Ep(frames=8)], "accepted", fps=FPS)
    replace_video(src, "observation.images.cam1", 1, frames)
    with pytest.raises(ExportError, match=rf"episode 1: camera observation.images.cam1 \(.*episode_000001.mp4\) {what}"):
        export(src, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.partial"))


def test_damaged_file_is_refused(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=6)], "accepted", fps=FPS)
    out = tmp_path / "out"
    export(src, out, ViewerOptions(compression="none"))
    assert verify_export(out).ok
    flipped, cut = out / "data/chunk-000/episode_000000.mcap", out / "data/chunk-000/episode_000001.mcap"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the data chunk
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:-200])
    errors = McapViewerExporter().verify(out).errors
    assert any("episode_000000.mcap" in e for e in errors), errors
    assert any("episode_000001.mcap" in e for e in errors), errors


def test_resume_keeps_finished_episode_files(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=5), Ep(frames=6), Ep(frames=4)], "accepted", fps=FPS)
    out = tmp_path / "out"
    export(src, out)
    first = (out / "data/chunk-000/episode_000000.mcap").read_bytes()
    (out / "data/chunk-000/episode_000001.mcap").unlink()
    (out / "data/chunk-000/episode_000002.mcap").write_bytes(first[:100])  # a torn file is redone
    ex = export(src, out)
    assert ex.resumed == [0]
    assert McapViewerExporter().verify(out).ok


def test_a_value_that_differs_from_the_source_fails_the_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back compares every decoded value with the source table: an encoder that writes
    one wrong value (frame 3 of the action) is caught before the file is renamed into place."""
    src = make_subset(tmp_path / "src", [Ep(frames=6)], "accepted", fps=FPS)
    encode = layout.JointStateCdr.encode

    def wrong_on_frame_3(self: layout.JointStateCdr, stamp_ns: int, values: Any) -> bytes:
        if stamp_ns == layout.frame_time_ns(3, FPS) and self._dims == 6 and float(values[0]) < 0:
            values = np.asarray(values) + 1.0
        return encode(self, stamp_ns, values)

    monkeypatch.setattr(layout.JointStateCdr, "encode", wrong_on_frame_3)
    with pytest.raises(ExportError, match=r"episode 0: episode_000000.mcap read back: /action frame 3: values"):
        export(src, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.mcap*"))


def test_a_file_missing_a_message_is_refused(tmp_path: Path) -> None:
    """A file whose CRCs are fine but that lost one camera message: the verifier counts it."""
    src = make_subset(tmp_path / "src", [Ep(frames=6)], "accepted", fps=FPS)
    out = tmp_path / "out"
    export(src, out)
    path = out / "data/chunk-000/episode_000000.mcap"
    with open(path, "rb") as fh:
        reader = make_reader(fh)
        summary = reader.get_summary()
        header = reader.get_header()
        kept = [(c.id, m) for _, c, m in reader.iter_messages(log_time_order=False)
                if not (c.topic == "/observation.images.cam1" and m.sequence == 5)]
        metadata = list(reader.iter_metadata())
    with open(path, "wb") as fh:
        w = Writer(fh)
        w.start(profile=header.profile, library=header.library)
        for s in summary.schemas.values():
            w.register_schema(s.name, s.encoding, s.data)
        for c in summary.channels.values():
            w.register_channel(c.topic, c.message_encoding, c.schema_id, c.metadata)
        for m in metadata:
            w.add_metadata(m.name, m.metadata)
        for cid, m in kept:
            w.add_message(cid, m.log_time, m.data, m.publish_time, m.sequence)
        w.finish()
    errors = McapViewerExporter().verify(out).errors
    assert any("/observation.images.cam1: 5 messages, episode length 6" in e for e in errors), errors


def test_a_column_wider_or_narrower_than_its_names_is_a_named_error(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=4)], "accepted", fps=FPS)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["action"]["shape"] = [7]
    info["features"]["action"]["names"] = [f"joint_{j}" for j in range(7)]
    (src / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(ExportError, match=r"episode 0: .*episode_000000.parquet: column 'action' holds 6 values per "
                                          r"row, info.json declares 7"):
        export(src, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.mcap*"))


@pytest.mark.parametrize(("shape", "names", "want"), [
    ((3,), ["a", "b", "c"], ["a", "b", "c"]),
    ((2,), {"motors": ["left", "right"]}, ["left", "right"]),  # LeRobot's dict form
    ((2,), ["same", "same"], ["k[0]", "k[1]"]),  # duplicates would merge two series
    ((2,), ["only_one"], ["k[0]", "k[1]"]),
    ((2, 2), None, ["k[0]", "k[1]", "k[2]", "k[3]"]),
    ((), None, ["k[0]"]),
])
def test_dimension_names(shape: tuple[int, ...], names: Any, want: list[str]) -> None:
    from eva_export.formats.common.records import Feature

    assert layout.dimension_names("k", Feature("float32", shape, names)) == want
