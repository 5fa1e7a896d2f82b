"""One uploader per export, a remote_dir that must exist, job records for this account only,
against a real OpenSSH server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd import SshServer  # noqa: E402
from test_upload_core import make_config, make_export, remote_root, same_tree, wait_done  # noqa: E402

from eva_export.errors import UploadRefused  # noqa: E402
from eva_export.jobs import COMPLETED, FAILED, RUNNING, Job, JobKind, JobStore  # noqa: E402
from eva_export.upload import UploadService  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HOLD = """
import sys
from pathlib import Path
from eva_export.upload.runner import claim_upload
fd = claim_upload(Path(sys.argv[1]), sys.argv[2])  # what a running upload of another process holds
print("held", flush=True)
sys.stdin.read()
"""


def test_second_uploader_of_the_same_export_is_refused(tmp_path: Path, server: SshServer) -> None:
    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(exp.accepted), "hdf5"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        service = UploadService(cfg)
        with pytest.raises(UploadRefused, match=rf"being uploaded already \(process {holder.pid}\)"):
            service.start(str(exp.source), "hdf5", str(exp.accepted))
        assert service.jobs.all() == []  # a refusal leaves no job behind
        assert not remote_root(tmp_path).exists() or list(remote_root(tmp_path).iterdir()) == []
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    # the holder is gone (its lock with it): the upload goes through, once
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == COMPLETED, final.error
    assert [p.name for p in remote_root(tmp_path).iterdir()] == [Path(final.remote_path).name]
    same_tree(exp.accepted, Path(final.remote_path))


def test_a_second_process_does_not_fail_a_live_upload(tmp_path: Path, server: SshServer) -> None:
    """The CLI opening the job store beside a running node leaves the node's job running; a job
    whose process is dead is failed as before."""
    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    store = JobStore(cfg.upload.jobs_dir)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    try:
        host = socket.gethostname()
        jobs = {}
        for name, pid in (("live", live.pid), ("dead", dead.pid)):
            job = dataclasses.replace(Job.new(JobKind.UPLOAD, "/src", "hdf5", accepted_dir=f"/a/{name}"),
                                      state=RUNNING, pid=pid, host=host)
            store.save(job)
            jobs[name] = job.job_id
        UploadService(cfg)  # what `eva-export upload` does first
        after = JobStore(cfg.upload.jobs_dir)
        got_live, got_dead = after.get(jobs["live"]), after.get(jobs["dead"])
        assert got_live is not None and got_live.state == RUNNING
        assert got_dead is not None and got_dead.state in (FAILED, "interrupted")
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(30)


@pytest.mark.parametrize("case", ["missing", "a_file"])
def test_remote_dir_must_be_a_directory(tmp_path: Path, server: SshServer, case: str) -> None:
    remote = tmp_path / "remote_dir"
    if case == "a_file":
        remote.write_text("not a directory")
    settings = server.sftp_settings(str(remote), create_remote_dir=False, max_attempts=3)
    cfg = make_config(tmp_path, settings)
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == FAILED
    want = "does not exist on the server" if case == "missing" else "on the server is not a directory"
    assert want in final.error
    assert final.attempts == 1  # permanent: not retried
    assert (not remote.exists()) if case == "missing" else remote.read_text() == "not a directory"


def test_remote_dir_is_created_when_configured(tmp_path: Path, server: SshServer) -> None:
    remote = tmp_path / "new" / "remote_dir"
    cfg = make_config(tmp_path, server.sftp_settings(str(remote), create_remote_dir=True))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == COMPLETED, final.error
    same_tree(exp.accepted, Path(final.remote_path))


def test_job_records_are_private(tmp_path: Path, server: SshServer) -> None:
    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    record = service.jobs.path(final.job_id)
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert f"{server.host}:{server.port}" in record.read_text() or str(remote_root(tmp_path)) in record.read_text()


def _staging_lock(remote: Path) -> list[Path]:
    return [p for p in remote.iterdir() if ".uploading-" in p.name] if remote.is_dir() else []


def _lock_of(exp_source: Path, accepted: Path, remote: Path) -> Path:
    from eva_export.manifest import manifest_digest
    from eva_export.upload.gate import publish_name
    from eva_export.upload.job import staging_name
    from eva_export.upload.remotelock import lock_path

    digest = manifest_digest((accepted / "meta/manifest.json").read_bytes())
    return Path(lock_path(str(remote / staging_name(publish_name(str(exp_source), "hdf5"), digest))))


def test_a_version_another_host_uploads_is_refused(tmp_path: Path, server: SshServer) -> None:
    """The remote lock beside the staging directory: another machine's upload of the same
    version refuses this one before anything is sent, and its staging is left alone."""
    import json

    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    remote = remote_root(tmp_path)
    remote.mkdir(parents=True)
    lock = _lock_of(exp.source, exp.accepted, remote)
    staging = Path(str(lock).replace(".uploading-", ".staging-"))
    staging.mkdir()
    (staging / "partial.bin").write_bytes(b"from the other host")
    lock.write_text(json.dumps({"host": "robot-elsewhere", "pid": 4242, "since": 0.0}))
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == FAILED
    assert "host robot-elsewhere (process 4242) has been uploading this version" in final.error
    assert (staging / "partial.bin").read_bytes() == b"from the other host"  # left alone
    assert lock.exists() and sorted(p.name for p in remote.iterdir()) == sorted([staging.name, lock.name])
    lock.unlink()  # that upload is gone for good: this one goes through
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == COMPLETED, final.error
    same_tree(exp.accepted, Path(final.remote_path))
    assert _staging_lock(remote) == []  # publication leaves no lock behind


def test_a_lock_left_on_this_host_is_taken_over(tmp_path: Path, server: SshServer) -> None:
    import json

    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    remote = remote_root(tmp_path)
    remote.mkdir(parents=True)
    lock = _lock_of(exp.source, exp.accepted, remote)
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 999999, "since": 0.0}))  # a killed upload's
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == COMPLETED, final.error
    assert "left by process 999999 of this host" in final.last_error
    assert _staging_lock(remote) == []
    same_tree(exp.accepted, Path(final.remote_path))
