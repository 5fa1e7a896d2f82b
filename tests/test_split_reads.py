"""What the native split job reads and syncs: each source camera file read once (its manifest
digest taken from validation's read), each staged table read once by the verifier, and one sync
of the staged pair before the rename that publishes it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset
from test_video_facts import age, videos

from eva_export.config import parse_config
from eva_export.export import publish
from eva_export.export.paths import ExportPaths
from eva_export.export.runner import ExportService
from eva_export.formats.common import video_facts
from eva_export.formats.common.facts_index import FactsIndex
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.formats.lerobot_v21.validate import TableTap, validate_source
from eva_export.manifest import Manifest, sha256_file

N = 5


@pytest.fixture()
def source(tmp_path: Path) -> Iterator[Path]:
    video_facts.forget_all()
    root = make_dataset(tmp_path / "logs" / "demo" / "raw",
                        [Ep(frames=4 + i, quality="green" if i % 2 == 0 else "red") for i in range(N)],
                        cameras=2, width=32, height=24)
    age(root)  # recorded earlier: past the racy margin, as a real source is
    yield root
    video_facts.forget_all()


def service(source: Path) -> ExportService:
    log = source.parent.parent
    return ExportService(parse_config({"collection": {"log_dir": str(log)}}), background=False, recover=False)


def test_the_manifest_reads_no_linked_camera_file_again(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation reads every source MP4 whole; its digest goes to the job's index from those
    bytes, so the manifest hashes only the files the split wrote (tables and meta)."""
    from eva_export import manifest

    hashed: list[Path] = []

    def counting(path: Path, limit: int | None = None) -> str:
        hashed.append(Path(path))
        return sha256_file(path, limit)

    monkeypatch.setattr(manifest, "sha256_file", counting)
    monkeypatch.setattr(publish, "sha256_file", counting)  # the pair hashed beside its verification
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed", job.error
    assert hashed and not [p for p in hashed if p.suffix == ".mp4"]
    paths = ExportPaths.of(source, "lerobot_v21")
    source_digests = {sha256_file(v) for v in videos(source)}
    for sub in (paths.accepted, paths.rejected):
        mp4s = [e for e in Manifest.read(sub).files if e.path.endswith(".mp4")]
        assert mp4s and all(e.sha256 in source_digests for e in mp4s)
        assert all(sha256_file(sub / e.path) == e.sha256 for e in mp4s)  # the digests are the bytes'
    assert verify_v21(paths.accepted).ok and verify_v21(paths.rejected).ok


def test_digests_of_reads_only_when_asked(source: Path, tmp_path: Path) -> None:
    """A job that does not link the source's camera files (``on`` False) hashes none of them."""
    for on in (False, True):
        video_facts.forget_all()
        (tmp_path / f"jobs-{on}").mkdir()  # its own index: nothing known, every MP4 read
        index = FactsIndex(tmp_path / f"jobs-{on}")
        try:
            with video_facts.use_index(index), video_facts.digests_of_reads(on):
                validate_source(source)
            got = [index.get(video_facts.file_key(v), video_facts.SHA256_KIND) for v in videos(source)]
        finally:
            index.close()
        assert got == ([sha256_file(v) for v in videos(source)] if on else [None] * len(got))


def test_a_tap_sees_every_table_once_with_its_columns(source: Path) -> None:
    seen: list[tuple[int, list[str]]] = []
    tap = TableTap(("observation.state", "action", "no such column"),
                   lambda ep, path, table: seen.append((ep, table.column_names)))
    validate_source(source, tap=tap)
    assert [e for e, _ in seen] == list(range(N))
    assert all({"observation.state", "action", "index"} <= set(cols) and "no such column" not in cols
               for _, cols in seen)


def test_the_verifier_opens_each_staged_table_once(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The value checks (NaN/inf, timestamps) read their columns with validation's read of the
    table, not in a second pass over every file."""
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed", job.error
    sub = ExportPaths.of(source, "lerobot_v21").accepted
    episodes = len(list((sub / "data").rglob("*.parquet")))
    opened: list[Any] = []
    real = pq.ParquetFile

    def counting(*args: Any, **kw: Any) -> Any:
        opened.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(pq, "ParquetFile", counting)
    report = verify_v21(sub, decode_frames=False)
    assert report.ok, report.errors
    assert episodes >= 2 and len(opened) <= episodes + 1  # + the sample read of one episode


def test_the_staged_pair_is_synced_after_its_manifests_before_it_is_published(
        source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One syncfs of the staged pair once its manifests are written, before the publishing rename
    (the durability guarantee); the only other one is the early write-back beside verification."""
    paths = ExportPaths.of(source, "lerobot_v21")
    calls: list[tuple[Path, bool, bool, str]] = []
    real = publish.sync_filesystem

    def recording(path: Path) -> None:
        manifests = all((Path(path) / s / "meta" / "manifest.json").is_file() for s in ("accepted", "rejected"))
        calls.append((Path(path), paths.pair_dir.exists(), manifests, threading.current_thread().name))
        real(path)

    monkeypatch.setattr(publish, "sync_filesystem", recording)
    assert service(source).run(source, "lerobot_v21").state == "completed"
    assert [c[3] for c in calls] == ["pair-sync", "MainThread"]
    assert all(synced.parent == paths.staging and not published_then for synced, published_then, _, _ in calls)
    assert calls[-1][2]  # the last one after the manifests
    assert (paths.accepted / "meta" / "manifest.json").is_file()


def test_value_checks_cover_tables_the_index_already_knows(source: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A table proved by the facts index is not read by validation: the value checks read it
    themselves, so every episode is still checked."""
    from eva_export.formats.lerobot_v21 import validate

    assert service(source).run(source, "lerobot_v21").state == "completed"
    read: list[int] = []
    real = validate.check_table

    def counting(*args: Any, **kw: Any) -> Any:
        read.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(validate, "check_table", counting)
    sub = ExportPaths.of(source, "lerobot_v21").accepted
    age(sub)
    episodes = len(list((sub / "data").rglob("*.parquet")))
    (tmp_path / "jobs").mkdir()
    for n_read in (episodes, 0):  # the first verification reads every table, the second knows them all
        read.clear()
        video_facts.forget_all()
        index = FactsIndex(tmp_path / "jobs")
        try:
            with video_facts.use_index(index):
                report = verify_v21(sub, decode_frames=False)
        finally:
            index.close()
        assert report.ok, report.errors
        assert len(read) == n_read
        assert any(c.startswith(f"values: {episodes} episode(s)") for c in report.checks), report.checks
