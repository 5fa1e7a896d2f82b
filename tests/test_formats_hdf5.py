"""HDF5 export: real datasets from dsfactory, read back with h5py (and Debian's h5ls when present)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, image, make_subset, replace_video, state_value

from eva_export.errors import ExportError
from eva_export.export.records import QualitySplit
from eva_export.formats.common import images as images_mod
from eva_export.formats.common.table import to_numpy
from eva_export.formats.hdf5 import exporter as hdf5_mod
from eva_export.formats.hdf5.exporter import Hdf5Exporter, find_item, read_group
from eva_export.formats.hdf5.options import Hdf5Options

W, H, FPS = 64, 48, 30
TOL = 5


def subset(root: Path, eps: list[Ep], **kw: object) -> Path:
    return make_subset(root, eps, "rejected", **kw)


@pytest.mark.parametrize("compression", ["", "lzf", "gzip"])
def test_hdf5_round_trip(tmp_path: Path, compression: str) -> None:
    issues = [{"code": "late", "severity": "error", "detail": "x"}]
    src = subset(tmp_path / "src", [Ep(frames=9, extra={"stream_stats": {"cam0": {"late": 1}}}),
                                    Ep(frames=7, quality="red", issues=issues, verdict="pass", note="ok")])
    out = tmp_path / "out"
    ex = Hdf5Exporter(Hdf5Options(compression=compression))
    ex.export(src, out)
    assert ex.verify(out).ok
    info = json.loads((out / "meta/info.json").read_text())
    assert info["dataset_format"] == "hdf5" and info["embedded_images"] is True and info["total_videos"] == 0
    assert "video_path" not in info
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.hdf5"
    assert info["features"]["observation.images.cam0"]["dtype"] == "image"
    assert QualitySplit.read(out).dataset_format == "hdf5"
    assert not list(out.rglob("*.mp4")) and not list(out.rglob("*.partial"))
    for name in ("episodes.jsonl", "tasks.jsonl", "stats.json"):
        assert (out / "meta" / name).read_bytes() == (src / "meta" / name).read_bytes()
    rows = [json.loads(line) for line in (src / "meta/episodes.jsonl").read_text().splitlines()]
    for ep, n in enumerate([9, 7]):
        table = pq.read_table(src / f"data/chunk-000/episode_{ep:06d}.parquet")
        with h5py.File(out / f"data/chunk-000/episode_{ep:06d}.hdf5", "r") as f:
            assert set(f) == {"columns", "images", "metadata"}
            cols = read_group(f["columns"])
            assert list(cols) == table.column_names
            for name in table.column_names:
                np.testing.assert_array_equal(cols[name], to_numpy(table.column(name)))
            assert cols["observation.state"].dtype == np.float32
            np.testing.assert_array_equal(cols["observation.state"][3], state_value(ep, 3))
            for item in f["columns"].values():
                assert item.attrs["kind"] == "array"
            md = read_group(f["metadata"])
            assert md == {**rows[ep], "fps": FPS}
            kinds = {item.attrs["key"]: item.attrs["kind"] for item in f["metadata"].values()}
            assert kinds["tasks"] == "msgpack" and kinds["quality_issues"] == "msgpack"
            assert kinds["quality"] == "string" and kinds["fps"] == "array" and kinds["length"] == "array"
            for c in range(2):
                item = find_item(f["images"], f"observation.images.cam{c}")
                assert item is not None and item.attrs["kind"] == "array"
                ds = item["value"]
                assert ds.shape == (n, H, W, 3) and ds.dtype == np.uint8
                assert ds.maxshape == (None, H, W, 3) and ds.chunks == (1, H, W, 3)
                assert (ds.compression or "") == compression
                for i in range(n):
                    want = image(ep, i, c, W, H).reshape(-1, 3).mean(0)
                    assert np.all(np.abs(ds[i].reshape(-1, 3).mean(0) - want) <= TOL)


def test_hdf5_metadata_kinds_none_bytes_mappings(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=3, note=None, extra={"nothing": None, "nested": {"a": [1, {"b": 2}]},
                                                                   "flag": True, "pair": [1, 2]})], cameras=1)
    out = tmp_path / "out"
    Hdf5Exporter().export(src, out)
    with h5py.File(out / "data/chunk-000/episode_000000.hdf5", "r") as f:
        kinds = {item.attrs["key"]: item.attrs["kind"] for item in f["metadata"].values()}
        md = read_group(f["metadata"])
    assert kinds["nothing"] == "none" and md["nothing"] is None
    assert kinds["nested"] == "msgpack" and md["nested"] == {"a": [1, {"b": 2}]}
    assert kinds["pair"] == "msgpack" and md["pair"] == [1, 2]
    assert kinds["flag"] == "array" and bool(md["flag"]) is True
    with h5py.File(tmp_path / "b.h5", "w") as f:
        hdf5_mod._write_value(f, 0, "blob", b"\x00\x01abc")
        assert f["item_000000"].attrs["kind"] == "bytes"
        assert hdf5_mod.read_value(f["item_000000"]) == b"\x00\x01abc"


def test_hdf5_frame_count_mismatch_raises(tmp_path: Path) -> None:
    src = subset(tmp_path / "src", [Ep(frames=6), Ep(frames=8)])
    replace_video(src, "observation.images.cam1", 1, 5)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=r"episode 1: observation.images.cam1 has 5 frames, the table has 8 rows"):
        Hdf5Exporter().export(src, out)
    assert (out / "data/chunk-000/episode_000000.hdf5").is_file()
    assert not (out / "data/chunk-000/episode_000001.hdf5").exists()
    assert not list(out.rglob("*.partial"))
    replace_video(src, "observation.images.cam1", 1, 10)
    with pytest.raises(ExportError, match=r"episode 1: observation.images.cam1 has more frames"):
        Hdf5Exporter().export(src, tmp_path / "out2")


def test_hdf5_shape_change_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = subset(tmp_path / "src", [Ep(frames=6)], cameras=1)
    real = images_mod.iter_frames  # the camera frames of every embedded-image format come from here

    def shrinking(path: Path):  # type: ignore[no-untyped-def]
        for i, frame in enumerate(real(path)):
            yield frame if i < 3 else frame[:, :32]

    monkeypatch.setattr(images_mod, "iter_frames", shrinking)
    with pytest.raises(ExportError, match=r"episode 0: observation.images.cam0 frame 3 has shape \(48, 32, 3\)"):
        Hdf5Exporter().export(src, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.hdf5"))


def test_hdf5_interrupted_run_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = subset(tmp_path / "src", [Ep(frames=5), Ep(frames=6), Ep(frames=4)])
    out = tmp_path / "out"
    real = hdf5_mod.Hdf5Exporter._write_episode
    calls = []

    def dies_on_second(self, tmp, meta, episode_index, row, table):  # type: ignore[no-untyped-def]
        calls.append(episode_index)
        if episode_index == 1:
            with h5py.File(tmp, "w") as f:  # a half-written file, as a kill would leave
                f.create_group("columns")
            raise KeyboardInterrupt
        return real(self, tmp, meta, episode_index, row, table)

    monkeypatch.setattr(hdf5_mod.Hdf5Exporter, "_write_episode", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        Hdf5Exporter().export(src, out)
    assert sorted(p.name for p in out.rglob("*.hdf5")) == ["episode_000000.hdf5"]
    monkeypatch.setattr(hdf5_mod.Hdf5Exporter, "_write_episode", real)
    (out / "data/chunk-000/.episode_000001.hdf5.partial").write_bytes(b"junk")  # stale temp file
    ex = Hdf5Exporter()
    ex.export(src, out)
    assert ex.resumed == [0]
    assert not list(out.rglob("*.partial"))
    assert ex.verify(out).ok


def test_hdf5_readable_by_debian_tools(tmp_path: Path) -> None:
    assert shutil.which("h5ls"), "h5ls missing: tools/setup.sh installs hdf5-tools"
    src = subset(tmp_path / "src", [Ep(frames=4)], cameras=1)
    out = tmp_path / "out"
    Hdf5Exporter(Hdf5Options(compression="gzip")).export(src, out)
    res = subprocess.run(["h5ls", "-r", str(out / "data/chunk-000/episode_000000.hdf5")],
                         capture_output=True, text=True, check=True)
    assert "/images/item_000000/value Dataset {4/Inf, 48, 64, 3}" in res.stdout
