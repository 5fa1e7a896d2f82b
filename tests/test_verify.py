"""verify_export on all four formats, the registry, and verification catching broken exports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, image, make_dataset

from eva_export.errors import ExportError
from eva_export.export.records import QualitySplit
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.options import FormatOptions
from eva_export.formats.common.video import VideoEncoder, VideoSettings
from eva_export.formats.mcap_eva.options import McapOptions
from eva_export.formats.registry import FORMATS, UnknownFormatError, get_exporter
from eva_export.formats.verify import detect_format, verify_export

ALL = ["lerobot_v21", "lerobot_v3", "hdf5", "mcap", "eva_store", "mcap_foxglove"]


def subset(root: Path, eps: list[Ep], **kw: object) -> Path:
    make_dataset(root, eps, **kw)  # type: ignore[arg-type]
    meta = read_meta(root)
    QualitySplit(str(root), "accepted", "lerobot_v21", [0, 3, 5][: len(meta.episodes)],
                 episode_count=len(meta.episodes), frame_count=sum(e.length for e in meta.episodes)).write(root)
    return root


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return subset(tmp_path_factory.mktemp("src") / "accepted", [Ep(frames=6), Ep(frames=9, note="n"), Ep(frames=4)])


def export(source: Path, tmp_path: Path, fmt: str, options: FormatOptions | None = None) -> Path:
    out = tmp_path / fmt
    get_exporter(fmt, options).export(source, out, progress=None)  # type: ignore[arg-type]
    return out


def test_registry_has_the_four_formats() -> None:
    assert list(FORMATS) == ALL
    for name in ALL:
        assert get_exporter(name).name == name
    with pytest.raises(UnknownFormatError, match=r"unknown export format 'zarr'.*lerobot_v21, lerobot_v3, hdf5, mcap, eva_store, mcap_foxglove"):
        get_exporter("zarr")
    assert issubclass(UnknownFormatError, ExportError)


@pytest.mark.parametrize("fmt", ALL)
def test_verify_export_passes_on_every_format(source: Path, tmp_path: Path, fmt: str) -> None:
    out = export(source, tmp_path, fmt)
    assert detect_format(out) == (fmt, [])
    report = verify_export(out)
    assert report.ok, report.errors
    assert report.dataset_format == fmt and report.episodes == 3 and report.frames == 19
    assert any(c.startswith("real read") and "state[0]=[0.0]" in c and "frame 64x48" in c for c in report.checks)
    assert any("quality_split.json" in c for c in report.checks)
    qs = QualitySplit.read(out)
    assert qs.dataset_format == fmt and qs.subset == "accepted" and qs.source_episode_indices == [0, 3, 5]
    assert QualitySplit.read(source).dataset_format == "lerobot_v21"  # the staged source is untouched


def test_native_export_links_the_staged_files(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "lerobot_v21")
    a = source / "data/chunk-000/episode_000001.parquet"
    b = out / "data/chunk-000/episode_000001.parquet"
    assert b.read_bytes() == a.read_bytes()
    if os.stat(a).st_dev == os.stat(tmp_path).st_dev:
        assert os.path.samefile(a, b)
    assert not (out / "meta/quality_split.json").samefile(source / "meta/quality_split.json")


def test_quality_split_problems_are_errors(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "hdf5")
    qs = json.loads((out / "meta/quality_split.json").read_text())
    qs["dataset_format"] = "mcap"
    (out / "meta/quality_split.json").write_text(json.dumps(qs))
    report = verify_export(out)
    assert not report.ok and any("says 'mcap'" in e for e in report.errors)
    (out / "meta/quality_split.json").unlink()
    report = verify_export(out)
    assert not report.ok and any("quality_split.json" in e for e in report.errors)


def test_info_totals_mismatch_is_an_error(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "mcap")
    info = json.loads((out / "meta/info.json").read_text())
    info["total_frames"] += 1
    (out / "meta/info.json").write_text(json.dumps(info))
    report = verify_export(out)
    assert any("info.json claims 3 episodes / 20 frames" in e for e in report.errors)


def test_v21_frame_count_mismatch_is_an_error(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "lerobot_v21")
    path = out / "videos/chunk-000/observation.images.cam0/episode_000002.mp4"
    path.unlink()  # a link: the source keeps its file
    with VideoEncoder(path, 64, 48, 30, VideoSettings(crf=10)) as enc:
        for i in range(3):
            enc.add(image(2, i, 0, 64, 48))
    report = verify_export(out)
    assert any("episode 2 observation.images.cam0: 3 video frames, 4 Parquet rows" in e for e in report.errors)


def test_v21_rewritten_table_is_caught_without_the_per_episode_count(source: Path, tmp_path: Path) -> None:
    """The verifier takes row and frame counts from the subset's validation when it passes; a
    table changed after the export (a row dropped, or its index column shifted with the same
    row count) fails that validation, and the per-episode count then names the episode."""
    out = export(source, tmp_path, "lerobot_v21")
    data = out / "data/chunk-000/episode_000001.parquet"
    table = pq.read_table(data)
    data.unlink()  # a link: the source keeps its file
    pq.write_table(table.slice(0, table.num_rows - 1), data)
    report = verify_export(out)
    assert any("episode 1: 8 Parquet rows, length 9" in e for e in report.errors), report.errors
    assert any("has 8 rows but episodes.jsonl says length 9" in e for e in report.errors), report.errors
    i = table.schema.get_field_index("index")
    shifted = table.set_column(i, "index", pa.array([v + 1 for v in table.column("index").to_pylist()], pa.int64()))
    pq.write_table(shifted, data)
    report = verify_export(out)
    assert any("episode 1" in e and "index" in e for e in report.errors), report.errors


def test_v3_shifted_locator_is_an_error(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "lerobot_v3")
    path = out / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(path)
    col = "videos/observation.images.cam1/from_timestamp"
    values = t.column(col).to_pylist()
    values[1] += 1 / 30  # off by one whole frame: would silently return another episode's frames
    t = t.set_column(t.schema.get_field_index(col), col, pa.array(values, pa.float64()))
    pq.write_table(t, path)
    report = verify_export(out)
    assert any("episode 1 observation.images.cam1: timestamps" in e for e in report.errors)


def test_v3_missing_shard_frames_is_an_error(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "lerobot_v3")
    path = out / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    path.unlink()
    with VideoEncoder(path, 64, 48, 30, VideoSettings(crf=10)) as enc:
        for i in range(18):
            enc.add(image(0, i, 0, 64, 48))
    report = verify_export(out)
    assert any("18 frames, 19 expected" in e for e in report.errors), report.errors


def test_hdf5_truncated_images_are_an_error(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "hdf5")
    with h5py.File(out / "data/chunk-000/episode_000001.hdf5", "a") as f:
        f["images/item_000001/value"].resize(8, axis=0)
    report = verify_export(out)
    assert any("episode_000001.hdf5: images observation.images.cam1 has 8 frames, 9 rows" in e for e in report.errors)


def test_mcap_flipped_byte_fails_the_crc_check(source: Path, tmp_path: Path) -> None:
    out = export(source, tmp_path, "mcap", McapOptions(compression="none"))
    path = out / "data/chunk-000/episode_000001.mcap"
    data = bytearray(path.read_bytes())
    pos = data.index(b"rgb8") + 200  # inside an image message inside a chunk
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    report = verify_export(out)
    assert not report.ok
    assert any("episode_000001.mcap" in e and ("CRC" in e or "crc" in e) for e in report.errors), report.errors


def test_unknown_directory_is_reported(tmp_path: Path) -> None:
    report = verify_export(tmp_path)
    assert not report.ok and report.dataset_format == "unknown"
