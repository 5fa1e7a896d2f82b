"""Bag ingest of hostile bags: metadata.yaml paths and symlinked MCAP
files outside the ingest roots are refused, a bag whose log times run backwards is named, and a
compressed frame's size is checked from its header before anything is decoded."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from bag_helpers import frame, jpeg, make_config, offline, write_bag

from eva_export.capture.ingest import BagIngest, IngestError
from eva_export.capture.intake import ImageDecoder, RawImage, compressed_size
from eva_export.capture.recorder import Recorder
from eva_export.errors import EvaError


@pytest.fixture(scope="module")
def bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bag(tmp_path_factory.mktemp("bags") / "bag", offline(1.0))


def _layout(tmp_path: Path, bag: Path) -> tuple[Path, Path, Path]:
    """roots/ (the ingest root) holding a copy of the bag, and outside/ holding its MCAP file."""
    roots, outside = tmp_path / "roots", tmp_path / "outside"
    inside = roots / "bag"
    shutil.copytree(bag, inside)
    outside.mkdir()
    mcap = next(inside.glob("*.mcap"))
    shutil.copy2(mcap, outside / mcap.name)
    return roots, inside, outside / mcap.name


def _set_paths(bag_dir: Path, paths: list[str]) -> None:
    mfile = bag_dir / "metadata.yaml"
    raw = yaml.safe_load(mfile.read_text())
    raw["rosbag2_bagfile_information"]["relative_file_paths"] = paths
    mfile.write_text(yaml.safe_dump(raw))


def _ingest_refused(tmp_path: Path, roots: Path, bag_dir: Path, *want: str) -> None:
    col = make_config(tmp_path, ingest_roots=[str(roots)])
    rec = Recorder(col)
    try:
        with pytest.raises(EvaError) as info:
            rec.ingest(str(bag_dir))
        for w in want:
            assert w in str(info.value), str(info.value)
        assert rec.list_episodes()[1] == []
    finally:
        rec.close()


def test_metadata_path_absolute_is_refused(tmp_path: Path, bag: Path) -> None:
    roots, inside, outside_mcap = _layout(tmp_path, bag)
    for f in inside.glob("*.mcap"):
        f.unlink()
    _set_paths(inside, [str(outside_mcap)])
    _ingest_refused(tmp_path, roots, inside, "metadata.yaml", "absolute")


def test_metadata_path_dotdot_is_refused(tmp_path: Path, bag: Path) -> None:
    roots, inside, outside_mcap = _layout(tmp_path, bag)
    for f in inside.glob("*.mcap"):
        f.unlink()
    _set_paths(inside, [f"../../outside/{outside_mcap.name}"])
    _ingest_refused(tmp_path, roots, inside, "metadata.yaml", "'..'")


def test_symlinked_mcap_outside_the_roots_is_refused(tmp_path: Path, bag: Path) -> None:
    roots, inside, outside_mcap = _layout(tmp_path, bag)
    mcap = next(inside.glob("*.mcap"))
    mcap.unlink()
    mcap.symlink_to(outside_mcap)
    _ingest_refused(tmp_path, roots, inside, "outside the ingest roots", str(outside_mcap))


def test_a_bag_inside_the_roots_still_ingests(tmp_path: Path, bag: Path) -> None:
    roots, inside, _ = _layout(tmp_path, bag)
    col = make_config(tmp_path, ingest_roots=[str(roots)])
    res = BagIngest(col, inside, "bag", roots=[roots]).run()
    assert res.episodes_done == 1


def test_bag_whose_log_times_run_backwards_is_named(tmp_path: Path) -> None:
    rec = offline(1.0)
    top = max(r.log_ns for r in rec) + min(r.log_ns for r in rec)
    backwards = [dataclasses.replace(r, log_ns=top - r.log_ns) for r in rec]  # file order kept, time reversed
    bag_dir = write_bag(tmp_path / "reversed", backwards)
    col = make_config(tmp_path)
    with pytest.raises(IngestError, match="log times run backwards"):
        BagIngest(col, bag_dir, "bag").run()


def _huge_jpeg(width: int = 12000, height: int = 12000) -> bytes:
    """A real small JPEG whose frame header declares ``width`` x ``height``."""
    data = bytearray(jpeg(frame(0, 1)))
    i = 2
    while not (data[i] == 0xFF and 0xC0 <= data[i + 1] <= 0xC2):
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    data[i + 5:i + 7] = height.to_bytes(2, "big")
    data[i + 7:i + 9] = width.to_bytes(2, "big")
    return bytes(data)


def test_compressed_size_is_read_from_the_header() -> None:
    import av

    assert compressed_size(np.frombuffer(jpeg(frame(3, 1)), np.uint8)) == (64, 48)
    assert compressed_size(np.frombuffer(_huge_jpeg(), np.uint8)) == (12000, 12000)
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = 40, 30, "rgb24"
    png = b"".join(bytes(p) for p in ctx.encode(av.VideoFrame.from_ndarray(np.zeros((30, 40, 3), np.uint8))))
    assert compressed_size(np.frombuffer(png, np.uint8)) == (40, 30)
    with pytest.raises(ValueError, match="12000x12000"):
        ImageDecoder().rgb(RawImage(np.frombuffer(_huge_jpeg(), np.uint8), compressed=True), (64, 48))


def test_huge_jpeg_in_a_bag_is_refused_before_decoding(tmp_path: Path) -> None:
    huge = np.frombuffer(_huge_jpeg(), np.uint8)
    recs = offline(1.0)
    for r in recs:
        if r.topic == "/w":
            r.msg = dataclasses.replace(r.msg, data=huge)
    col = make_config(tmp_path)
    res = BagIngest(col, write_bag(tmp_path / "huge", recs), "bag").run()
    assert res.episodes_done == 1 and res.episodes[0]["quality"] == "red"
    row = (col.dataset_dir("bag") / "meta" / "episodes.jsonl").read_text()
    assert "12000x12000" in row and "not decoded" in row, row[:2000]
