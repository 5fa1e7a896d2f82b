"""Pair publication: replace an existing export, fail at every step, recover a killed publication.

After any failure the final paths hold the old complete pair (or none, when there was none):
never a new accepted beside an old rejected.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset
from export_faults import faulty_service
from test_split import CopyExporter

from eva_export.config import parse_config
from eva_export.export.paths import ExportPaths
from eva_export.export.publish import PUBLISH_STEPS, recover_pair
from eva_export.export.records import QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.fsutil import atomic_write_jsonl, iter_jsonl
from eva_export.jobs import COMPLETED, FAILED

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
