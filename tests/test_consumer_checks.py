"""What `verify` and source validation pass, every consumer reads.

Sources the consumers' readers would fail on (duplicate task indices, MP4 frame timing the
table contradicts, embedded images that are null, garbage or the wrong size) are refused
before anything is written, naming the raw file and the raw episode; the verifiers refuse the
broken outputs the old shard writer published; and the exporter's own messages name the raw
dataset, never the staged subset.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset, replace_video
from export_faults import faulty_service
from short_videos import encode_bframes, short_subset, textured
from test_hostile_sources import CAM, V2, Case, edit_rows, rewrite_table, set_column, snapshot

from eva_export.config import parse_config
from eva_export.errors import EvaError, ExportError
from eva_export.export.paths import ExportPaths
from eva_export.export.runner import ExportService
from eva_export.formats.lerobot_v3.exporter import LeRobotV3Exporter
from eva_export.formats.registry import get_exporter
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED, FAILED

CORPUS = Path(__file__).parent / "fixtures" / "lerobot-corpus"
IMG = "observation.images.cam0"
P1 = "data/chunk-000/episode_000001.parquet"


def _service(log_dir: Path, **kw: object) -> ExportService:
    return faulty_service(parse_config({"collection": {"log_dir": str(log_dir)}}), background=False, recover=False,
                         **kw)  # type: ignore[arg-type]


# ---- source mutations -------------------------------------------------------------------------
def late_start(rel: str, seconds: float) -> Callable[[Path], None]:
    """The same frames, shown from ``seconds`` on (an MP4 cut out of a longer recording)."""
    def apply(raw: Path) -> None:
        tmp = raw / "late.tmp.mp4"
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(raw / rel), "-c", "copy", "-output_ts_offset",
                        str(seconds), str(tmp)], check=True, timeout=60)
        tmp.replace(raw / rel)
    return apply


def png(img: np.ndarray) -> bytes:
    frame = av.VideoFrame.from_ndarray(img, format="rgb24")
    cc = av.CodecContext.create("png", "w")
    cc.width, cc.height, cc.pix_fmt = img.shape[1], img.shape[0], "rgb24"
    return b"".join(bytes(p) for p in cc.encode(frame))  # type: ignore[attr-defined]


def image_row(row: int, value: Callable[[dict], object]) -> Callable[[Path], None]:
    """Replace one embedded image of raw episode 1 (the split renumbers it to rejected episode 0)."""
    def make(t: pa.Table) -> pa.Array:
        cells = t.column(IMG).to_pylist()
        cells[row] = value(cells[row])
        return pa.array(cells, t.schema.field(IMG).type)
    return rewrite_table(P1, set_column(IMG, make))


def two_tasks_one_index(raw: Path) -> None:
    (raw / "meta/tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "pick the cube"}) + "\n"
                                          + json.dumps({"task_index": 0, "task": "other"}) + "\n")


def _ep2(*extra: str) -> tuple[str, ...]:
    return ("episode 2",) + extra


CASES = [
    Case("mp4_encoded_at_15fps", lambda raw: replace_video(raw, CAM, 2, 12, 32, 24, fps=15),
         _ep2(V2, "timing disagrees", "0.0667 s")),
    Case("mp4_starts_5s_late", late_start(V2, 5.0), _ep2(V2, "timing disagrees", "5.0000 s")),
    Case("duplicate_task_index", two_tasks_one_index, ("tasks.jsonl", "task_index 0", "twice")),
    Case("duplicate_task_string", edit_rows("tasks.jsonl", lambda r: r + [{"task_index": 5, "task": r[0]["task"]}]),
         ("tasks.jsonl", "appears twice")),
    Case("image_null", image_row(3, lambda cell: None), ("episode 1", P1, IMG, "frame 3", "no image bytes"), "images"),
    Case("image_garbage", image_row(4, lambda cell: {"bytes": b"\x89PNG garbage", "path": None}),
         ("episode 1", P1, IMG, "frame 4", "does not decode"), "images"),
    Case("image_wrong_size", image_row(5, lambda cell: {"bytes": png(np.zeros((24, 32, 3), np.uint8)), "path": None}),
         ("episode 1", P1, IMG, "frame 5", "[24, 32, 3]", "[48, 64, 3]"), "images"),
]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A factory dataset (raw episode 2 renumbered to 1) and LeRobot's image-in-Parquet corpus
    dataset (raw episode 1 renumbered to rejected 0), each with a published pair."""
    base = tmp_path_factory.mktemp("baseline")
    out = {"factory": base / "factory" / "logs", "images": base / "images" / "logs"}
    make_dataset(out["factory"] / "demo" / "raw", [Ep(frames=10), Ep(frames=11, quality="red"), Ep(frames=12),
                                                   Ep(frames=13, quality="red")], cameras=1, width=32, height=24)
    shutil.copytree(CORPUS / "images-parquet-mixed", out["images"] / "demo" / "raw")
    for log in out.values():
        job = _service(log).run(log / "demo" / "raw", "lerobot_v21")
        assert job.state == COMPLETED, job.error
    return out


@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_source_a_consumer_cannot_read_is_refused(case: Case, fmt: str, baselines: dict[str, Path],
                                                  tmp_path: Path) -> None:
    log = tmp_path / "logs"
    shutil.copytree(baselines[case.base], log, symlinks=True)
    raw = log / "demo" / "raw"
    case.mutate(raw)
    before = snapshot(log / "demo" / "export")
    try:
        job = _service(log).run(raw, fmt)
        assert job.state == FAILED, f"{case.name} was exported as {fmt}"
        error = job.error
    except EvaError as exc:
        error = str(exc)
    assert snapshot(log / "demo" / "export") == before
    for want in case.expect:
        assert want in error, f"{case.name}: {want!r} not in {error!r}"
    assert ".staging-" not in error and "/export/" not in error
    renumbered = {"episode 2": "episode 1", "episode 1": "episode 0"}.get(case.expect[0])
    if renumbered:
        assert renumbered not in error  # never the renumbered index


# ---- verifiers refuse what the old shard writer published ---------------------------------------
def _naive_join(parts: list[Path], out: Path, fps: int) -> None:
    """Episode MP4s joined as the old writer joined them: each shifted by its frames, decode
    times as the file had them (a 1-frame episode first leaves decode times 0 -> 0)."""
    with av.open(str(parts[0])) as first, av.open(str(out), "w", format="mp4") as dst:
        ost = dst.add_stream_from_template(first.streams.video[0], opaque=True)
        frames = 0
        for p in parts:
            with av.open(str(p)) as src:
                s = src.streams.video[0]
                shift = round(Fraction(frames, fps) / s.time_base)
                n = 0
                for pkt in src.demux(s):
                    if pkt.size == 0:
                        continue
                    pkt.pts += shift
                    pkt.dts += shift
                    pkt.stream = ost
                    dst.mux(pkt)
                    n += 1
                frames += n


def test_v3_verify_refuses_a_shard_whose_decode_times_repeat(tmp_path: Path) -> None:
    src = short_subset(tmp_path / "src", [1, 25])
    out = tmp_path / "out"
    LeRobotV3Exporter().export(src, out)
    assert verify_export(out).ok
    shard = next((out / "videos").rglob("*.mp4"))
    parts = sorted((src / "videos").rglob("*.mp4"))
    shard.unlink()
    _naive_join(parts, shard, 30)
    errors = verify_export(out).errors
    assert any("decode timestamps do not increase" in e for e in errors), errors
    assert any("the stream lasts 0.8333 s, its 26 frames need 0.8667 s" in e for e in errors), errors


def test_v3_verify_refuses_duplicate_task_strings(tmp_path: Path) -> None:
    src = short_subset(tmp_path / "src", [3, 4])
    out = tmp_path / "out"
    LeRobotV3Exporter().export(src, out)
    tt = pq.read_table(out / "meta/tasks.parquet")
    twice = pa.table({"task_index": pa.array([0, 1], pa.int64()), "task": pa.array(["pick the cube"] * 2)},
                     schema=tt.schema)
    pq.write_table(twice, out / "meta/tasks.parquet")
    info = json.loads((out / "meta/info.json").read_text())
    (out / "meta/info.json").write_text(json.dumps({**info, "total_tasks": 2}))
    assert any("not one to one" in e for e in verify_export(out).errors)


@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3"])
def test_verify_refuses_an_undecodable_embedded_image(tmp_path: Path, fmt: str) -> None:
    log = tmp_path / "logs"
    shutil.copytree(CORPUS / "images-parquet-mixed", log / "demo" / "raw")
    job = _service(log).run(log / "demo" / "raw", fmt)
    assert job.state == COMPLETED, job.error
    sub = tmp_path / "copy"
    shutil.copytree(job.accepted_dir, sub)  # a copy: the published files are hard links to the raw ones
    shard = sorted((sub / "data").rglob("*.parquet"))[0]
    t = pq.read_table(shard)
    cells = t.column(IMG).to_pylist()
    cells[2] = {"bytes": png(np.zeros((8, 8, 3), np.uint8)), "path": None}
    i = t.schema.get_field_index(IMG)
    pq.write_table(t.set_column(i, t.schema.field(IMG), pa.array(cells, t.schema.field(IMG).type)), shard)
    errors = verify_export(sub).errors
    assert any(("row 2" in e or "frame 2" in e) and "[8, 8, 3]" in e for e in errors), errors


# ---- exporter messages name the raw dataset ---------------------------------------------------------
def test_v3_exporter_error_names_the_raw_file_and_episode(tmp_path: Path) -> None:
    """A fault only the exporter sees (the staged copy changed after validation): the message
    names raw episode 4 and its raw file, not the staged subset's episode 2 or its path."""
    log = tmp_path / "logs"
    raw = make_dataset(log / "demo" / "raw", [Ep(frames=8, quality=q) for q in
                                              ("green", "red", "green", "red", "green")], cameras=1)
    job = _service(log, fail_at="convert_accepted").run(raw, "lerobot_v3")
    assert job.state == FAILED
    native = ExportPaths.of(raw, "lerobot_v3").staging / "native" / "accepted"
    staged = native / f"videos/chunk-000/{CAM}/episode_000002.mp4"  # raw episode 4
    staged.unlink()  # a hard link to the raw file: replace it, do not write through it
    encode_bframes(staged, [textured(4, i, 64, 48)[:, :32] for i in range(8)], 30, "libx264")
    with pytest.raises(ExportError) as err:
        get_exporter("lerobot_v3").export(native, tmp_path / "out", progress=None)  # type: ignore[arg-type]
    msg = str(err.value)
    assert "episode 4" in msg and str(raw / f"videos/chunk-000/{CAM}/episode_000004.mp4") in msg, msg
    assert ".staging-" not in msg and "episode 2" not in msg


def test_reencoded_episodes_are_recorded_by_raw_index(tmp_path: Path) -> None:
    """An episode the shard cannot take as it is (its frames off the grid) is re-encoded alone,
    and quality_split.json says which raw episode that was."""
    src = short_subset(tmp_path / "src", [6, 5, 7])
    p = src / f"videos/chunk-000/{CAM}/episode_000001.mp4"
    buf = io.BytesIO(p.read_bytes())
    p.unlink()
    with av.open(buf) as s_in, av.open(str(p), "w", format="mp4") as dst:
        s = s_in.streams.video[0]
        ost = dst.add_stream_from_template(s, opaque=True)
        k = 0
        for pkt in s_in.demux(s):
            if pkt.size == 0:
                continue
            if k >= 2:  # a quarter frame late from the third packet on
                off = round(Fraction(1, 120) / s.time_base)
                pkt.pts += off
                pkt.dts += off
            k += 1
            pkt.stream = ost
            dst.mux(pkt)
    rows = [json.loads(line) for line in (src / "meta/episodes.jsonl").read_text().splitlines()]
    rows[1]["source_episode_index"] = 9
    (src / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    ex = LeRobotV3Exporter()
    ex.export(src, out)
    assert ex.last_reencoded == {CAM: [1]}
    assert json.loads((out / "meta/quality_split.json").read_text())["reencoded_source_episodes"] == {CAM: [9]}
    rep = verify_export(out)
    assert rep.ok, rep.errors


@pytest.mark.parametrize("fmt", ["lerobot_v21", "hdf5", "mcap", "eva_store"])
def test_verify_refuses_a_task_index_listed_twice(tmp_path: Path, fmt: str) -> None:
    """Every format carries tasks.jsonl; with one index for two tasks a reader gives an
    episode the other episode's task (LeRobot returned 'other' for 'pick the cube')."""
    src = short_subset(tmp_path / "src", [3, 4])
    out = tmp_path / fmt
    get_exporter(fmt).export(src, out, progress=None)  # type: ignore[arg-type]
    assert verify_export(out).ok
    two_tasks_one_index(out)
    errors = verify_export(out).errors
    assert any("tasks.jsonl" in e and ("not one to one" in e or "twice" in e) for e in errors), errors
