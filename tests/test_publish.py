"""Pair publication: replace an existing export, fail at every step, recover a killed publication.

After any failure the final paths hold the old complete pair (or none, when there was none):
never a new accepted beside an old rejected.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset
from export_faults import faulty_service
from test_split import CopyExporter

from eva_export.config import parse_config
from eva_export.export import publish
from eva_export.export.paths import ExportPaths
from eva_export.export.publish import PUBLISH_STEPS, hashed_meanwhile, recover_pair
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.fsutil import atomic_write_jsonl, iter_jsonl
from eva_export.jobs import COMPLETED, FAILED
from eva_export.manifest import build_manifest, recorded_digest, sha256_file, write_manifest

STEPS_NATIVE = ["validate", "unit:0", "unit:3", "split_units", "assemble_accepted", "assemble_rejected",
                *[s for s in PUBLISH_STEPS if s != "cleanup"]]
STEPS_CONVERTED = STEPS_NATIVE[:6] + ["convert_accepted", "convert_rejected"] + STEPS_NATIVE[6:]


def svc(tmp_path: Path, **kw: object) -> ExportService:
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")}})
    return faulty_service(cfg, background=False, recover=False,
                         exporters={"hdf5": CopyExporter}, **kw)  # type: ignore[arg-type]


def source(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "logs" / "demo" / "raw",
                        [Ep(frames=6, quality=q) for q in ("green", "red", "green", "red", "green")],
                        cameras=1, width=32, height=24)


def fail_episode(src: Path, index: int) -> None:
    """A later review (the source changes, so the next export differs from the first)."""
    atomic_write_jsonl(src / "meta/episodes.jsonl", [
        {**r, "qc_verdict": "fail"} if r["episode_index"] == index else r for r in iter_jsonl(src / "meta/episodes.jsonl")])


def pair_state(paths: ExportPaths, native: bool = True) -> tuple[str, str] | None:
    """(job_id, source indices of accepted) of a complete, consistent pair; None if absent."""
    if not paths.pair_dir.exists():
        assert not paths.accepted.exists() and not paths.rejected.exists()
        return None
    qa, qr = QualitySplit.read(paths.accepted), QualitySplit.read(paths.rejected)
    assert qa.job_id == qr.job_id, "a pair mixes two publications"
    assert sorted(os.listdir(paths.pair_dir)) == ["accepted", "rejected"]
    if native:
        assert verify_v21(paths.accepted).ok and verify_v21(paths.rejected).ok
    return qa.job_id, str(qa.source_episode_indices)


def test_replace_existing_pair(tmp_path: Path) -> None:
    src = source(tmp_path)
    first = svc(tmp_path).run(src, "lerobot_v21")
    paths = ExportPaths.of(src, "lerobot_v21")
    assert pair_state(paths) == (first.job_id, "[0, 2, 4]")
    fail_episode(src, 2)
    second = svc(tmp_path).run(src, "lerobot_v21")
    assert second.state == COMPLETED
    assert pair_state(paths) == (second.job_id, "[0, 4]")
    assert QualitySplit.read(paths.rejected).source_episode_indices == [1, 2, 3]
    assert paths.backups() == [] and not paths.staging.exists()


@pytest.mark.parametrize("fmt,step", [("lerobot_v21", s) for s in STEPS_NATIVE]
                         + [("hdf5", s) for s in STEPS_CONVERTED])
def test_failure_at_each_step_keeps_old_pair(tmp_path: Path, fmt: str, step: str) -> None:
    src = source(tmp_path)
    native = fmt == "lerobot_v21"
    first = svc(tmp_path).run(src, fmt)
    assert first.state == COMPLETED, first.error
    paths = ExportPaths.of(src, fmt)
    old = pair_state(paths, native)
    fail_episode(src, 0)
    job = svc(tmp_path, fail_at=step).run(src, fmt)
    assert job.state == FAILED and step in job.error
    assert pair_state(paths, native) == old  # the old pair, untouched
    assert paths.backups() == []
    again = svc(tmp_path).run(src, fmt)  # a clean rerun publishes the new pair
    assert again.state == COMPLETED, again.error
    assert pair_state(paths, native) == (again.job_id, "[2, 4]")


@pytest.mark.parametrize("step", STEPS_NATIVE)
def test_failure_without_old_pair_publishes_nothing(tmp_path: Path, step: str) -> None:
    src = source(tmp_path)
    job = svc(tmp_path, fail_at=step).run(src, "lerobot_v21")
    assert job.state == FAILED
    paths = ExportPaths.of(src, "lerobot_v21")
    assert pair_state(paths) is None
    if step == "validate":
        assert not paths.staging.exists()


def test_cleanup_failure_keeps_new_pair(tmp_path: Path) -> None:
    src = source(tmp_path)
    svc(tmp_path).run(src, "lerobot_v21")
    fail_episode(src, 0)
    job = svc(tmp_path, fail_at="cleanup").run(src, "lerobot_v21")
    paths = ExportPaths.of(src, "lerobot_v21")
    assert job.state == COMPLETED  # published: a leftover backup does not undo it
    assert pair_state(paths) == (job.job_id, "[2, 4]")
    assert len(paths.backups()) == 1
    svc(tmp_path).run(src, "lerobot_v21")  # the next export removes the stale backup
    assert paths.backups() == []


def test_recover_a_publication_killed_between_backup_and_move(tmp_path: Path) -> None:
    src = source(tmp_path)
    first = svc(tmp_path).run(src, "lerobot_v21")
    paths = ExportPaths.of(src, "lerobot_v21")
    os.rename(paths.pair_dir, paths.backup("export-killed"))  # what a SIGKILL after step 2 leaves
    assert pair_state(paths) is None
    assert recover_pair(paths) and pair_state(paths) == (first.job_id, "[0, 2, 4]")
    # and a stale backup beside a published pair is dropped
    shutil.copytree(paths.pair_dir, paths.backup("export-stale"))
    recover_pair(paths)
    assert paths.backups() == []


def test_concurrent_export_of_same_pair_is_locked(tmp_path: Path) -> None:
    from eva_export.errors import ExportError
    from eva_export.export.publish import export_lock

    src = source(tmp_path)
    paths = ExportPaths.of(src, "lerobot_v21")
    with export_lock(paths):
        job = svc(tmp_path).run(src, "lerobot_v21")
        assert job.state == FAILED and "another process is exporting" in job.error
        with pytest.raises(ExportError), export_lock(paths):
            pass
    assert svc(tmp_path).run(src, "lerobot_v21").state == COMPLETED


def test_a_refused_concurrent_export_does_not_name_the_winners_staging(tmp_path: Path) -> None:
    from eva_export.export.publish import export_lock

    src = source(tmp_path)
    paths = ExportPaths.of(src, "lerobot_v21")
    with export_lock(paths):  # the winner: it holds the lock and writes its staging
        paths.staging.mkdir(parents=True)
        (paths.staging / "unit").write_bytes(b"x" * 100)
        job = svc(tmp_path).run(src, "lerobot_v21")
        assert job.state == FAILED and "another process is exporting" in job.error
        assert job.staging_dir == "" and job.staging_bytes == 0, job.staging_dir
        assert svc(tmp_path).store.get(job.job_id).staging_dir == ""  # nor does its record
    assert paths.staging.is_dir()  # the winner's staging is untouched


def _tree(root: Path) -> Path:
    """A staged subset: files the job wrote, one hard link of a source file, a nested folder."""
    (root / "meta").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    for i in range(5):
        (root / "data" / "chunk-000" / f"file-{i:03d}.parquet").write_bytes(os.urandom(4096 + 1000 * i))
    (root / "meta" / "info.json").write_text('{"fps": 30}\n')
    outside = root.parent / "source.mp4"
    outside.write_bytes(os.urandom(8192))
    os.link(outside, root / "data" / "linked.mp4")
    return root


def test_the_pair_hashed_beside_verification_gives_the_same_manifest(tmp_path: Path) -> None:
    """hashed_meanwhile hashes the files the job wrote (not a hard link of a source file) while
    the block runs; the manifest written then takes those digests and is byte for byte the one
    written by hashing every file itself; a file changed after its hash is hashed again."""
    sub = _tree(tmp_path / "pair" / "accepted")
    with hashed_meanwhile(tmp_path / "pair"):
        pass
    wrote = [p for p in sub.rglob("*") if p.is_file() and p.stat().st_nlink == 1]
    assert all(recorded_digest(p) == sha256_file(p) for p in wrote)
    assert recorded_digest(sub / "data" / "linked.mp4") is None
    changed = sub / "data" / "chunk-000" / "file-002.parquet"
    with open(changed, "ab") as fh:
        fh.write(b"more")  # after its hash: its identity no longer the recorded one
    write_manifest(sub)
    with_recorded = (sub / "meta" / "manifest.json").read_bytes()
    assert all(recorded_digest(p) is None for p in wrote)  # each taken by the manifest
    write_manifest(sub)  # every file hashed now
    assert (sub / "meta" / "manifest.json").read_bytes() == with_recorded
    assert build_manifest(sub).by_path()["data/chunk-000/file-002.parquet"].sha256 == sha256_file(changed)


def test_a_failed_verification_stops_the_pair_hashing(tmp_path: Path) -> None:
    """The block's failure is raised as it is, once the hashing thread has stopped; a pair the
    hashing cannot walk (a FIFO in it) leaves the fault to the manifest, which names it."""
    sub = _tree(tmp_path / "pair" / "accepted")
    os.mkfifo(sub / "meta" / "odd")
    with pytest.raises(RuntimeError, match="verification failed"), hashed_meanwhile(tmp_path / "pair"):
        raise RuntimeError("verification failed")
    assert not [t for t in threading.enumerate() if t.name in ("pair-hashes", "pair-sync")]
    with hashed_meanwhile(tmp_path / "pair"):
        pass
    with pytest.raises(ValueError, match="not a regular file"):
        write_manifest(sub)


def test_a_file_changed_while_it_is_hashed_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest is kept only for the file as stated before its hash (a hook changes it mid-hash)."""
    sub = _tree(tmp_path / "pair" / "accepted")
    target = sub / "data" / "chunk-000" / "file-001.parquet"
    real = publish.sha256_file

    def changing(path: Path, limit: int | None = None) -> str:
        digest = real(path, limit)
        if path == target:
            with open(path, "ab") as fh:
                fh.write(b"grown while hashed")
        return digest

    monkeypatch.setattr(publish, "sha256_file", changing)
    with hashed_meanwhile(tmp_path / "pair"):
        pass
    assert recorded_digest(target) is None
    assert recorded_digest(sub / "data" / "chunk-000" / "file-000.parquet") is not None
    write_manifest(sub)
    assert build_manifest(sub).by_path()["data/chunk-000/file-001.parquet"].sha256 == real(target)
