"""hdf5 and mcap episode files written at the disk: frames by pwritev into
preallocated HDF5 chunks, cameras decoded at once, and each file hashed while it is written.
Read back with h5py and with mcap's reader (CRCs validated) against the decoded source frames."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from diskfull import direct_supported
from dsfactory import Ep, make_subset
from mcap.reader import make_reader

from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.video import iter_frames
from eva_export.formats.common.written import RegionHasher
from eva_export.formats.hdf5.exporter import Hdf5Exporter, find_item
from eva_export.formats.hdf5.options import Hdf5Options
from eva_export.formats.mcap_eva.exporter import McapExporter, decode_image
from eva_export.manifest import MANIFEST_FILE, Manifest, build_manifest, recorded_digest, sha256_file, write_manifest

W, H = 64, 48


def source_frames(src: Path, episode: int, key: str) -> list[np.ndarray]:
    meta = read_meta(src)
    return list(iter_frames(meta.video_path(key, episode)))


def test_iter_frames_equal_pyav_own_conversion(tmp_path: Path) -> None:
    """The decoder's shared single-thread converter gives PyAV's ``to_ndarray`` pixels."""
    import av

    src = make_subset(tmp_path / "src", [Ep(frames=12)], cameras=1)
    path = read_meta(src).video_path("observation.images.cam0", 0)
    with av.open(str(path)) as container:
        want = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    got = list(iter_frames(path))
    assert len(got) == len(want) == 12
    assert all(g.shape == (H, W, 3) and g.dtype == np.uint8 and np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("cameras", [1, 3])
def test_hdf5_direct_chunks_equal_decoded_frames_and_digest(tmp_path: Path, cameras: int) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=40), Ep(frames=23)], cameras=cameras)
    out = tmp_path / "out"
    ex = Hdf5Exporter()
    ex.export(src, out)
    assert ex.verify(out).ok
    for ep, n in enumerate([40, 23]):
        path = out / f"data/chunk-000/episode_{ep:06d}.hdf5"
        with h5py.File(path, "r") as f:
            for c in range(cameras):
                key = f"observation.images.cam{c}"
                item = find_item(f["images"], key)
                assert item is not None
                ds = item["value"]
                assert ds.shape == (n, H, W, 3) and ds.chunks == (1, H, W, 3) and ds.maxshape == (None, H, W, 3)
                np.testing.assert_array_equal(ds[()], np.stack(source_frames(src, ep, key)))
        # hashed while written, camera after camera: exactly the file's bytes
        assert recorded_digest(path) == sha256_file(path)
    manifest = build_manifest(out)
    assert all(e.sha256 == sha256_file(out / e.path) for e in manifest.files)


def _direct_writes(monkeypatch: pytest.MonkeyPatch, fail_direct: bool) -> list[tuple[bool, int, int]]:
    """Record (O_DIRECT?, offset, bytes) of every frame write; EINVAL on direct ones if asked."""
    import errno
    import fcntl

    from eva_export.formats.common import written  # hdf5's frame writes go through written.DirectWrites

    real, seen = written.pwritev_all, []

    def recording(fd: int, views: list, offset: int) -> None:  # type: ignore[type-arg]
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        seen.append((direct, offset, sum(memoryview(v).nbytes for v in views)))
        if direct and fail_direct:
            raise OSError(errno.EINVAL, "alignment refused")
        real(fd, views, offset)

    monkeypatch.setattr(written, "pwritev_all", recording)
    return seen


@pytest.mark.parametrize("fail_direct", [False, True])
def test_hdf5_page_sized_frames_go_direct_else_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        fail_direct: bool) -> None:
    """384x256 RGB is 72 pages: chunks page-aligned, written O_DIRECT (where the file system takes
    it); a refused direct write (EINVAL) goes buffered. Either way the frames and the digest are
    exactly the file's."""
    w, h = 384, 256
    src = make_subset(tmp_path / "src", [Ep(frames=20)], cameras=2, width=w, height=h)
    seen = _direct_writes(monkeypatch, fail_direct)
    out = tmp_path / "out"
    Hdf5Exporter().export(src, out)
    path = out / "data/chunk-000/episode_000000.hdf5"
    with h5py.File(path, "r") as f:
        for c in range(2):
            key = f"observation.images.cam{c}"
            item = find_item(f["images"], key)
            assert item is not None
            np.testing.assert_array_equal(item["value"][()], np.stack(source_frames(src, 0, key)))
    assert recorded_digest(path) == sha256_file(path)
    assert all(off % 4096 == 0 and n % 4096 == 0 for _d, off, n in seen)
    direct = [d for d, _o, _n in seen]
    if direct_supported(tmp_path):
        assert direct[0], "page-sized frames were not written O_DIRECT"
        assert all(direct) != fail_direct  # after a refusal the rest go buffered
        assert sum(n for d, _o, n in seen if not d) == (w * h * 3 * 40 if fail_direct else 0)
    else:
        assert not any(direct)


def test_hdf5_compressed_gets_no_digest_and_manifest_reads_it(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6)], cameras=1)
    out = tmp_path / "out"
    Hdf5Exporter(Hdf5Options(compression="gzip")).export(src, out)
    path = out / "data/chunk-000/episode_000000.hdf5"
    assert recorded_digest(path) is None
    entry = build_manifest(out).by_path()["data/chunk-000/episode_000000.hdf5"]
    assert entry.sha256 == sha256_file(path)


def test_recorded_digest_dropped_once_the_file_changes(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=5)], cameras=1)
    out = tmp_path / "out"
    Hdf5Exporter().export(src, out)
    path = out / "data/chunk-000/episode_000000.hdf5"
    assert recorded_digest(path) == sha256_file(path)
    with open(path, "ab") as fh:  # a byte more: size (and mtime) no longer match the record
        fh.write(b"\0")
    assert recorded_digest(path) is None
    assert build_manifest(out).by_path()["data/chunk-000/episode_000000.hdf5"].sha256 == sha256_file(path)


def test_mcap_digest_and_frames_read_back_with_crcs(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=30), Ep(frames=11)], cameras=2)
    out = tmp_path / "out"
    ex = McapExporter(chunk_size=32 * 1024)  # many chunks: several compressed off the writer's thread
    ex.export(src, out)
    assert ex.verify(out).ok
    for ep in range(2):
        path = out / f"data/chunk-000/episode_{ep:06d}.mcap"
        assert recorded_digest(path) == sha256_file(path)
        got: dict[str, list[np.ndarray]] = {}
        with open(path, "rb") as fh:
            for _s, channel, message in make_reader(fh, validate_crcs=True).iter_messages():
                if channel.topic.startswith("episode/image/"):
                    got.setdefault(channel.topic.removeprefix("episode/image/"), []).append(decode_image(message.data)[1])
        for key, frames in got.items():
            np.testing.assert_array_equal(np.stack(frames), np.stack(source_frames(src, ep, key)))
        assert sorted(got) == ["observation.images.cam0", "observation.images.cam1"]


def _file(tmp_path: Path) -> tuple[int, bytes, bytes]:
    """A file of library bytes 'head' at 0..99, then 'data' written by us at 100..299."""
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT)
    head, data = bytes(range(100)), bytes(200 * [7])
    os.pwrite(fd, head, 0)
    return fd, head, data


def test_region_hasher_matches_the_file_and_voids_on_rewrites(tmp_path: Path) -> None:
    fd, head, data = _file(tmp_path)
    try:
        h = RegionHasher(fd)
        h.data(100, [data])
        os.pwrite(fd, data, 100)
        os.pwrite(fd, head, 0)  # the library writes the same bytes again: the digest stands
        os.pwrite(fd, b"tail", 300)
        assert h.finish([(0, 100), (300, 4)]) == sha256_file(tmp_path / "f.bin")

        h = RegionHasher(fd)
        h.data(100, [data])
        assert h.finish([(150, 8)]) is None and "inside a data region" in h.void

        h = RegionHasher(fd)
        h.data(100, [data])
        os.pwrite(fd, b"X", 5)  # the library changed bytes already hashed
        assert h.finish([(5, 1)]) is None and "changed" in h.void
    finally:
        os.close(fd)


def test_manifest_takes_the_recorded_digest_and_verification_still_rereads(tmp_path: Path) -> None:
    from eva_export.manifest import record_written, verify_manifest

    root = tmp_path / "subset"
    (root / "meta").mkdir(parents=True)
    path = root / "data.bin"
    path.write_bytes(b"payload")
    record_written(path, "0" * 64)  # a wrong record: only the hook can put it in the manifest
    manifest = build_manifest(root)
    assert manifest.by_path()["data.bin"].sha256 == "0" * 64
    assert recorded_digest(path) is None  # taken once
    manifest.write(root)
    assert verify_manifest(root) == ["data.bin: SHA-256 differs from meta/manifest.json (content changed or corrupt)"]


def test_hdf5_files_carry_no_clock(tmp_path: Path) -> None:
    """Preallocated datasets are made through HDF5's low-level API, whose default records
    object times; two exports a second apart must still be byte-identical."""
    src = make_subset(tmp_path / "src", [Ep(frames=4)], cameras=1)
    Hdf5Exporter().export(src, tmp_path / "a")
    first = (tmp_path / "a/data/chunk-000/episode_000000.hdf5").stat().st_mtime_ns
    tick = tmp_path / "tick"
    tick.write_bytes(b"")
    while tick.stat().st_mtime_ns // 10**9 <= first // 10**9:  # the next second, reached for sure
        tick.write_bytes(b"")
    Hdf5Exporter().export(src, tmp_path / "b")
    rel = "data/chunk-000/episode_000000.hdf5"
    assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


@pytest.mark.parametrize("shape", ["empty", "nested", "rewritten"])
def test_streamed_manifest_is_byte_for_byte_the_built_one(tmp_path: Path, shape: str) -> None:
    # write_manifest spools entries as it hashes them; readers see the same bytes
    root = tmp_path / "subset"
    root.mkdir()
    if shape != "empty":
        (root / "data" / "chunk-000").mkdir(parents=True)
        (root / "data" / "chunk-000" / 'é "quoted".bin').write_bytes(b"x" * 10)
        (root / "meta").mkdir()
        (root / "meta" / "info.json").write_text("{}\n")
        (root / "empty_dir").mkdir()
    if shape == "rewritten":
        write_manifest(root)  # an old manifest: not listed in the new one
        (root / "b.txt").write_text("later\n")
    want = build_manifest(root).to_bytes()
    write_manifest(root)
    assert (root / MANIFEST_FILE).read_bytes() == want
    assert not [p.name for p in (root / "meta").iterdir() if p.name.startswith(".")]  # no temp file left
    assert Manifest.read(root).files == build_manifest(root).files
