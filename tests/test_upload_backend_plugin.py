"""Adding an upload backend is its module + one registry line: shown with a local directory.

``plugins/local_dir.py`` is the module; the one line is the ``BackendSpec`` patched into the
registry below. Its config section (collection.storage.local_dir) selects it; the gate, the
upload service's jobs and resume take it from there, on a real export read back file by file.
"""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export.config import Config, parse_config
from eva_export.errors import ConfigError, UploadRefused
from eva_export.export.runner import ExportService
from eva_export.jobs import COMPLETED, FAILED, Job
from eva_export.manifest import MANIFEST_FILE
from eva_export.upload import UploadService, backends

SPEC = backends.BackendSpec("local_dir", "plugins.local_dir:from_section", "a local directory (tests only)")
FMT = "lerobot_v21"


@pytest.fixture
def local_dir_backend(monkeypatch: pytest.MonkeyPatch) -> backends.BackendSpec:
    monkeypatch.setattr(backends, "BACKENDS", (*backends.BACKENDS, SPEC))  # the one registry line
    return SPEC


def config(tmp_path: Path, storage: dict[str, object] | None = None) -> Config:
    return parse_config({"collection": {"log_dir": str(tmp_path / "logs"), **({"storage": storage} if storage else {})}})


def exported(tmp_path: Path) -> Job:
    """A real export (source episodes 0 and 2 accepted, 1 rejected) with a completed job."""
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [
        Ep(frames=7), Ep(frames=9, quality="red", issues=[{"code": "missing_stream", "detail": "state"}]),
        Ep(frames=11)], cameras=1, width=32, height=24)
    job = ExportService(config(tmp_path), background=False, recover=False).run(src, FMT)
    assert job.state == COMPLETED, job.error
    return job


def remote(tmp_path: Path) -> Path:
    root = tmp_path / "remote"
    root.mkdir(exist_ok=True)
    return root


def manifest_files(directory: Path) -> list[str]:
    return [f["path"] for f in json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]]


def same_tree(a: Path, b: Path) -> None:
    files = manifest_files(a)
    assert files and sorted(manifest_files(b)) == sorted(files)
    match, mismatch, errors = filecmp.cmpfiles(a, b, [*files, MANIFEST_FILE], shallow=False)
    assert (mismatch, errors) == ([], []) and len(match) == len(files) + 1


def finished(service: UploadService, job: Job) -> Job:
    final = service.wait(job.job_id, timeout=60)
    assert final is not None
    return final


def test_a_registered_backend_is_chosen_by_its_section_and_uploads_through_the_gate(
        tmp_path: Path, local_dir_backend: backends.BackendSpec) -> None:
    job = exported(tmp_path)
    cfg = config(tmp_path, {"local_dir": {"root": str(remote(tmp_path))}})
    assert cfg.collection.sftp is None  # no SFTP anywhere: the gate takes the registered backend
    service = UploadService(cfg)
    assert type(service.backend).__name__ == "LocalDirBackend"
    with pytest.raises(UploadRefused, match="rejected"):  # the gate still holds
        service.start(job.source_dir, FMT, job.rejected_dir)
    up = service.start(job.source_dir, FMT, job.accepted_dir)
    final = finished(service, up)
    assert final.state == COMPLETED, final.error
    assert final.remote_path == str(remote(tmp_path) / f"demo_{FMT}_accepted")
    same_tree(Path(job.accepted_dir), Path(final.remote_path))
    assert (final.files_done, final.files_total) == (len(manifest_files(Path(job.accepted_dir))) + 1,) * 2
    assert sorted(p.name for p in remote(tmp_path).iterdir()) == [f"demo_{FMT}_accepted"]  # no staging left


def test_an_injected_backend_passes_the_gate_without_any_storage_section(tmp_path: Path) -> None:
    from plugins.local_dir import LocalDirBackend

    job = exported(tmp_path)
    service = UploadService(config(tmp_path), backend=LocalDirBackend(remote(tmp_path)))
    final = finished(service, service.start(job.source_dir, FMT, job.accepted_dir))
    assert final.state == COMPLETED, final.error
    same_tree(Path(job.accepted_dir), Path(final.remote_path))
    with pytest.raises(UploadRefused, match="no upload backend is configured"):
        UploadService(config(tmp_path)).start(job.source_dir, FMT, job.accepted_dir)


def test_a_failed_upload_resumes_from_its_staging_directory_in_a_new_service(
        tmp_path: Path, local_dir_backend: backends.BackendSpec) -> None:
    job = exported(tmp_path)
    root = remote(tmp_path)
    broken = UploadService(config(tmp_path, {"local_dir": {"root": str(root), "fail_after_files": 2}}))
    first = finished(broken, broken.start(job.source_dir, FMT, job.accepted_dir))
    assert first.state == FAILED and "stopped after 2 files" in first.error
    staged = [p for p in root.iterdir()]
    assert len(staged) == 1 and staged[0].name.startswith(f".demo_{FMT}_accepted.staging-")  # nothing published
    files = manifest_files(Path(job.accepted_dir))
    kept = sum((Path(job.accepted_dir) / rel).stat().st_size for rel in files[:2])

    service = UploadService(config(tmp_path, {"local_dir": {"root": str(root)}}))
    final = finished(service, service.start(job.source_dir, FMT, job.accepted_dir))
    assert final.state == COMPLETED, final.error
    assert "resumed into" in final.last_error
    last = service.backend.last  # type: ignore[union-attr]
    assert last is not None and last.skipped_bytes == kept and last.sent_bytes == last.bytes - kept - len(
        (Path(job.accepted_dir) / MANIFEST_FILE).read_bytes())
    same_tree(Path(job.accepted_dir), Path(final.remote_path))
    assert sorted(p.name for p in root.iterdir()) == [f"demo_{FMT}_accepted"]


def test_an_unknown_or_second_storage_section_is_refused_by_name(
        tmp_path: Path, local_dir_backend: backends.BackendSpec) -> None:
    with pytest.raises(ConfigError, match=r"collection\.storage\.nfs: no upload backend is registered as 'nfs'; "
                                          r"registered backends: sftp, local_dir"):
        UploadService(config(tmp_path, {"nfs": {"root": "/x"}}))
    two = {"local_dir": {"root": str(remote(tmp_path))},
           "sftp": {"host": "127.0.0.1", "remote_dir": "/srv", "known_hosts": "/k"}}
    with pytest.raises(ConfigError, match="configures 2 upload backends"):
        UploadService(config(tmp_path, two))
    with pytest.raises(ConfigError, match=r"collection\.storage\.local_dir\.root"):
        UploadService(config(tmp_path, {"local_dir": {"root": "relative"}}))
