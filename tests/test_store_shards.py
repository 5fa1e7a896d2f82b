"""eva_store shards as files: the Zarr arrays written file by file read back by zarr as zarr writes
them, each shard's record naming its files' digests (a torn shard is rewritten on the rerun), and
the verifier naming a damaged array."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from dsfactory import Ep, make_subset

from eva_export.formats.eva_store.exporter import EvaStoreExporter
from eva_export.formats.eva_store.records import SHARD_FILE, ShardRecord
from eva_export.formats.eva_store.zarr_write import array_files, check_name, group_files, write_files
from eva_export.formats.verify import verify_export

ARRAYS = {
    "multi_chunk": np.random.default_rng(1).random((2500, 6)).astype(np.float32),  # 3 chunks, the last padded
    "exact_chunk": np.arange(1024 * 2, dtype=np.float64).reshape(1024, 2),
    "ints": np.arange(-3, 4, dtype=np.int64),
    "small_ints": np.array([1, -2, 3], dtype=np.int16),
    "flags": np.array([True, False, True]),
    "pixels": np.random.default_rng(2).integers(0, 255, (5, 2, 3)).astype(np.uint8),
    "big_endian": np.array([1.5, -2.25, 3.0], dtype=">f8"),
    "one_row": np.array([[7.0, 8.0]], dtype=np.float32),
}
CHUNK = 1024


def _zarr_chunks(n: int) -> tuple[int, ...]:
    return (max(1, min(n, CHUNK)),)


def test_arrays_written_by_file_equal_zarrs_own(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    list(write_files(ours, group_files()))
    group = zarr.open_group(str(theirs), mode="w", zarr_format=3)
    for name, arr in ARRAYS.items():
        list(write_files(ours, array_files(name, arr, CHUNK)))
        z = group.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=_zarr_chunks(len(arr)) + arr.shape[1:])
        z[...] = arr
    written = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file())
    assert written  # zarr wrote something to compare with
    for rel in written:  # every file zarr wrote, ours the same (metadata as JSON, chunks byte for byte)
        a, b = (theirs / rel).read_bytes(), (ours / rel).read_bytes()
        if rel.endswith("zarr.json"):
            assert json.loads(a) == json.loads(b), rel
        else:
            assert a == b, rel
    back = zarr.open_group(str(ours), mode="r")
    for name, arr in ARRAYS.items():
        got = np.asarray(back[name][...])
        assert got.shape == arr.shape and got.dtype == arr.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, arr, err_msg=name)


def test_all_fill_chunks_are_written_and_read_back(tmp_path: Path) -> None:
    """zarr may leave a chunk of fill values out; ours writes it (negative zero keeps its sign)."""
    arr = np.array([-0.0, 0.0, -0.0], dtype=np.float32)
    list(write_files(tmp_path, group_files()))
    files = dict(write_files(tmp_path, array_files("zeros", arr, CHUNK)))
    assert "zeros/c/0" in files
    got = np.asarray(zarr.open_group(str(tmp_path), mode="r")["zeros"][...])
    assert np.array_equal(np.signbit(got), np.signbit(arr))


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "..\\x", "__meta", "nul\0"])
def test_a_column_name_that_is_no_plain_array_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cannot name a Zarr array"):
        check_name(name)
    with pytest.raises(ValueError, match="cannot name a Zarr array"):
        list(array_files(name, np.zeros(2), CHUNK))


def test_each_shard_records_its_files_digests(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5)], cameras=1)
    out = tmp_path / "out"
    EvaStoreExporter().export(src, out)
    for shard in sorted((out / "shards").iterdir()):
        rec = ShardRecord.read(shard)
        on_disk = sorted(str(p.relative_to(shard)) for p in shard.rglob("*") if p.is_file() and p.name != SHARD_FILE)
        assert sorted(rel for rel, _ in rec.files) == on_disk
        assert all(hashlib.sha256((shard / rel).read_bytes()).hexdigest() == sha for rel, sha in rec.files)


def test_a_torn_shard_is_rewritten_and_an_intact_one_kept(tmp_path: Path) -> None:
    """A power cut after a shard's rename but before the job's sync can leave its files short or
    empty: the rerun finds the digests differ and writes that shard again; the others stay."""
    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5), Ep(frames=4)], cameras=1)
    out = tmp_path / "out"
    ex = EvaStoreExporter()
    ex.export(src, out)
    clean = {p.name: ShardRecord.read(p).files for p in (out / "shards").iterdir()}
    torn = out / "shards" / "shard-00001"
    payload = next(torn.glob("records/*.msgpack"))
    payload.write_bytes(payload.read_bytes()[: payload.stat().st_size // 2])  # cut as a lost write leaves it
    chunk = torn / "data.zarr" / "timestamp" / "c" / "0"
    chunk.write_bytes(b"")
    ex.export(src, out)
    assert ex.resumed == [0, 2]  # shard 1 written again, the intact ones kept
    assert {p.name: ShardRecord.read(p).files for p in (out / "shards").iterdir()} == clean
    assert verify_export(out).ok


def test_a_shard_record_naming_a_path_outside_the_shard_is_not_reused(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=4)], cameras=1)
    out = tmp_path / "out"
    ex = EvaStoreExporter()
    ex.export(src, out)
    shard = out / "shards" / "shard-00000"
    outside = tmp_path / "secret"
    outside.write_bytes(b"x")
    rec = json.loads((shard / SHARD_FILE).read_text())
    rec["files"].append(["../../../secret", "0" * 64])
    (shard / SHARD_FILE).write_text(json.dumps(rec))
    ex.export(src, out)
    assert ex.resumed == [] and outside.read_bytes() == b"x"
    assert verify_export(out).ok


def test_verify_names_a_damaged_zarr_array_and_a_shape_the_manifest_does_not_state(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5)], cameras=1)
    out = tmp_path / "out"
    EvaStoreExporter().export(src, out)
    assert verify_export(out).ok  # the clean control
    chunk = out / "shards" / "shard-00001" / "data.zarr" / "action" / "c" / "0" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"not zstd at all")
    report = verify_export(out)
    assert any("shards/shard-00001/data.zarr/action: unreadable Zarr array" in e for e in report.errors), report.errors
    chunk.write_bytes(good)
    group = zarr.open_group(str(out / "shards" / "shard-00000" / "data.zarr"), mode="a")
    group.create_array("timestamp", shape=(3,), dtype=np.float64, overwrite=True)[...] = np.zeros(3)  # readable, wrong
    report = verify_export(out)
    assert any("shards/shard-00000/data.zarr/timestamp: shape" in e and "manifest.json says" in e
               for e in report.errors), report.errors


def test_the_manifest_takes_shard_digests_from_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shard files are hashed as written (or as checked on reuse): the manifest reads none again,
    and its digests are the files' own."""
    from eva_export import manifest

    src = make_subset(tmp_path / "src", [Ep(frames=6), Ep(frames=5)], cameras=1)
    out = tmp_path / "out"
    hashed: list[Path] = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda p: hashed.append(Path(p)) or real(p))
    for run in ("first", "rerun"):
        EvaStoreExporter().export(src, out)
        hashed.clear()
        built = manifest.build_manifest(out)
        read_again = [p for p in hashed if "shards" in p.parts]
        # meta files only; a reused shard's record is read by the manifest (it was parsed, not hashed)
        assert hashed and read_again == ([] if run == "first" else [p for p in read_again if p.name == SHARD_FILE])
        assert run == "first" or len(read_again) == 2
        for e in built.files:
            assert e.sha256 == hashlib.sha256((out / e.path).read_bytes()).hexdigest(), (run, e.path)
