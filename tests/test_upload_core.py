"""Upload through the core library (no ROS), against a real throwaway OpenSSH server."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd import SshServer  # noqa: E402

from eva_export.config import Config, SftpSettings, parse_config  # noqa: E402
from eva_export.errors import ConfigError, UploadError, UploadRefused  # noqa: E402
from eva_export.export.records import QualitySplit  # noqa: E402
from eva_export.jobs import COMPLETED, FAILED, RUNNING, Job, JobStore  # noqa: E402
from eva_export.manifest import write_manifest  # noqa: E402
from eva_export.upload import SftpBackend, UploadService, check_upload, publish_name  # noqa: E402
from eva_export.upload.sftp import AttemptFn, ProgressFn, UploadResult  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20


# -- fixtures -------------------------------------------------------------------------


@dataclasses.dataclass
class Export:
    source: Path
    accepted: Path
    rejected: Path
    job: Job
    files: dict[str, int]


def write_tree(root: Path, files: dict[str, int]) -> None:
    for rel, size in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as fh:
            left = size
            while left:
                n = min(left, 4 * MB)
                fh.write(os.urandom(n))
                left -= n


SMALL_TREE = {
    "meta/info.json": 700,
    "meta/episodes.jsonl": 300,
    "data/chunk-000/episode_000000.parquet": 120_000,
    "data/chunk-000/episode_000001.parquet": 0,
    "videos/chunk-000/observation.images.top/episode_000000.mp4": 3 * MB + 17,
}


def make_export(tmp_path: Path, store: JobStore, fmt: str = "hdf5", dataset: str = "pick",
                files: dict[str, int] | None = None, marker: dict[str, str] | None = None,
                finished_at: float | None = None) -> Export:
    """A hand-built export: raw source, accepted/rejected trees with markers, a completed job."""
    source = tmp_path / "log" / dataset / "raw"
    (source / "meta").mkdir(parents=True, exist_ok=True)
    (source / "meta" / "info.json").write_text("{}")
    out = tmp_path / "log" / dataset / "export" / fmt
    files = dict(SMALL_TREE if files is None else files)
    for subset in ("accepted", "rejected"):
        root = out / subset
        write_tree(root, files)
        fields = dict(source_dir=str(source), subset=subset, dataset_format=fmt)
        if subset == "accepted" and marker:
            fields.update(marker)
        QualitySplit(source_episode_indices=[0, 3], **fields).write(root)  # type: ignore[arg-type]
    (out / "accepted" / "empty_dir").mkdir()
    for subset in ("accepted", "rejected"):
        write_manifest(out / subset)  # as export/publish.py does for every published subset
    job = Job.new("export", str(source), fmt, state=COMPLETED, accepted_dir=str(out / "accepted"),
                  rejected_dir=str(out / "rejected"), finished_at=finished_at or time.time())
    store.save(job)
    return Export(source, out / "accepted", out / "rejected", job, files)


def make_config(tmp_path: Path, sftp: SftpSettings | None) -> Config:
    raw: dict[str, object] = {
        "collection": {"log_dir": str(tmp_path / "log")},
        "export": {"jobs_dir": str(tmp_path / "jobs" / "export")},
        "upload": {"jobs_dir": str(tmp_path / "jobs" / "upload")},
    }
    if sftp is not None:
        raw["collection"]["storage"] = {"sftp": dataclasses.asdict(sftp)}  # type: ignore[index]
    return parse_config(raw)


def remote_root(tmp_path: Path) -> Path:
    return tmp_path / "remote" / "datasets"


def same_tree(a: Path, b: Path) -> None:
    """Every file of ``a`` is in ``b`` byte for byte and nothing else is (directories too)."""
    la = sorted(str(p.relative_to(a)) for p in a.rglob("*"))
    lb = sorted(str(p.relative_to(b)) for p in b.rglob("*"))
    assert la == lb
    for rel in la:
        if (a / rel).is_file():
            assert filecmp.cmp(a / rel, b / rel, shallow=False), rel


def upload_jobs(cfg: Config) -> list[Path]:
    return sorted(Path(cfg.upload.jobs_dir).glob("*.json"))


def wait_done(service: UploadService, job: Job, timeout: float = 120.0) -> Job:
    final = service.wait(job.job_id, timeout)
    assert final is not None and final.finished, final
    return final


class HookBackend:
    """Wraps a real backend; calls ``hook(bytes_done)`` from the progress callback."""

    def __init__(self, inner: SftpBackend, hook) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.hook = hook

    def describe(self) -> str:
        return self.inner.describe()

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        def wrapped(fd: int, ft: int, bd: int, bt: int) -> None:
            self.hook(bd)
            if progress:
                progress(fd, ft, bd, bt)

        return self.inner.upload(local_dir, name, wrapped, on_attempt)


# -- successful uploads ---------------------------------------------------------------


def test_upload_byte_for_byte(tmp_path: Path, server: SshServer) -> None:
    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    seen: list[Job] = []
    service = UploadService(cfg, on_change=seen.append)
    job = service.start(str(exp.source), "hdf5", str(exp.accepted))
    assert job.kind == "upload" and job.source_dir == str(exp.source.resolve())
    final = wait_done(service, job)
    assert final.state == COMPLETED, final.error
    assert final.remote_path == str(remote_root(tmp_path) / "pick_hdf5_accepted")
    same_tree(exp.accepted, Path(final.remote_path))
    n_files = len(exp.files) + 2  # + meta/quality_split.json + meta/manifest.json
    size = sum(p.stat().st_size for p in exp.accepted.rglob("*") if p.is_file())
    assert (final.files_done, final.files_total) == (n_files, n_files)
    assert (final.bytes_done, final.bytes_total) == (size, size)
    assert [p.name for p in remote_root(tmp_path).iterdir()] == ["pick_hdf5_accepted"]  # no staging left
    stored = JobStore(cfg.upload.jobs_dir).get(job.job_id)
    assert stored is not None and stored.state == COMPLETED and stored.remote_path == final.remote_path
    assert {j.state for j in seen} >= {RUNNING, COMPLETED}
    assert service.status().state == "IDLE" and service.status().current.job_id == job.job_id  # type: ignore[union-attr]
    assert service.get("").job_id == job.job_id  # type: ignore[union-attr]


def test_existing_target_is_never_replaced(tmp_path: Path, server: SshServer) -> None:
    cfg = make_config(tmp_path, server.sftp_settings(str(remote_root(tmp_path))))
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    old = remote_root(tmp_path) / "pick_hdf5_accepted"
    (old / "meta").mkdir(parents=True)
    (old / "meta" / "old.txt").write_text("older upload")
    service = UploadService(cfg)
    first = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert first.state == COMPLETED, first.error
    assert re.fullmatch(re.escape(str(old)) + r"_\d{8}T\d{6}(_\d+)?", first.remote_path)
    same_tree(exp.accepted, Path(first.remote_path))
    assert sorted(p.name for p in old.rglob("*")) == ["meta", "old.txt"]
    assert (old / "meta" / "old.txt").read_text() == "older upload"
    # Within the same second the timestamped name is taken as well: a counter is added.
    backend = SftpBackend(server.sftp_settings(str(remote_root(tmp_path))))
    names = {first.remote_path}
    for _ in range(2):
        res = backend.upload(exp.accepted, "pick_hdf5_accepted")
        assert res.preferred_name_taken and res.remote_path not in names
        names.add(res.remote_path)
    assert len({Path(n).name for n in names}) == 3
    assert not [p for p in remote_root(tmp_path).iterdir() if p.name.startswith(".")]


# -- failures -------------------------------------------------------------------------


def big_export(tmp_path: Path, cfg: Config) -> Export:
    files = dict(SMALL_TREE)
    files["videos/chunk-000/observation.images.top/episode_000001.mp4"] = 48 * MB
    return make_export(tmp_path, JobStore(cfg.export.jobs_dir), files=files)


def staging_dirs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in remote_root(tmp_path).iterdir() if ".staging-" in p.name)


def test_server_killed_mid_transfer_resumes(tmp_path: Path, server: SshServer) -> None:
    """The connection's sshd dies mid-file: the next attempt resumes and publishes once."""
    settings = server.sftp_settings(str(remote_root(tmp_path)))
    cfg = make_config(tmp_path, settings)
    exp = big_export(tmp_path, cfg)
    old = remote_root(tmp_path) / "pick_hdf5_accepted"
    old.mkdir(parents=True)
    (old / "old.txt").write_text("older upload")
    killed: list[int] = []

    def kill(bytes_done: int) -> None:
        if bytes_done >= 12 * MB and not killed:
            killed.extend(server.kill_sessions())  # the connection's sshd dies mid-file

    seen: list[Job] = []
    service = UploadService(cfg, backend=HookBackend(SftpBackend(settings), kill), on_change=seen.append)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert killed, "the transfer ended before the server was killed"
    assert final.state == COMPLETED, final.error
    assert final.attempts == 2 and "while uploading" in final.last_error
    assert any(j.attempts == 2 and j.state == RUNNING and j.last_error for j in seen)  # shown while retrying
    assert final.remote_path != str(old)  # the older target is never replaced
    same_tree(exp.accepted, Path(final.remote_path))
    assert [p.name for p in old.iterdir()] == ["old.txt"]
    assert staging_dirs(tmp_path) == []
    stored = JobStore(cfg.upload.jobs_dir).get(final.job_id)
    assert stored is not None and stored.attempts == 2 and stored.last_error == final.last_error


def test_whole_server_killed_leftovers_resumed_by_next_upload(tmp_path: Path, server: SshServer) -> None:
    """No server left: the job fails after its attempts, keeps the staging directory, and the
    next upload of the same export (server back) resumes into it and says so."""
    settings = server.sftp_settings(str(remote_root(tmp_path)), connect_timeout_s=3.0, max_attempts=3)
    cfg = make_config(tmp_path, settings)
    exp = big_export(tmp_path, cfg)
    done: list[bool] = []

    def kill(bytes_done: int) -> None:
        if bytes_done >= 20 * MB and not done:
            done.append(True)
            server.stop()

    service = UploadService(cfg, backend=HookBackend(SftpBackend(settings), kill))
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == FAILED and final.attempts == 3
    assert "nothing was published" in final.error and "is kept: the next upload" in final.error
    assert "cannot connect" in final.last_error
    assert [p.name for p in remote_root(tmp_path).iterdir() if not p.name.startswith(".")] == []
    left = staging_dirs(tmp_path)
    assert len(left) == 1
    on_server = sum(p.stat().st_size for p in (remote_root(tmp_path) / left[0]).rglob("*") if p.is_file())
    assert on_server >= 12 * MB

    server.restart()
    results: list[UploadResult] = []

    class Recording(HookBackend):
        def upload(self, *a, **kw):  # type: ignore[no-untyped-def]
            results.append(super().upload(*a, **kw))
            return results[-1]

    service2 = UploadService(cfg, backend=Recording(SftpBackend(settings), lambda _b: None))
    again = wait_done(service2, service2.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert again.state == COMPLETED, again.error
    assert f"resumed into {remote_root(tmp_path) / left[0]}" in again.last_error
    same_tree(exp.accepted, Path(again.remote_path))
    total = sum(p.stat().st_size for p in exp.accepted.rglob("*") if p.is_file())
    assert results[0].sent_bytes <= total - on_server  # nothing that was on the server is re-sent
    assert staging_dirs(tmp_path) == []


@pytest.mark.parametrize("bulk", ["paramiko", "auto"])  # auto: OpenSSH's client sends the bytes
def test_frozen_server_is_retried_instead_of_hanging(tmp_path: Path, server: SshServer, bulk: str) -> None:
    settings = server.sftp_settings(str(remote_root(tmp_path)), transfer_timeout_s=1.0, bulk=bulk)
    cfg = make_config(tmp_path, settings)
    exp = big_export(tmp_path, cfg)
    frozen: list[int] = []

    def freeze(bytes_done: int) -> None:
        if bytes_done >= 12 * MB and not frozen:
            frozen.extend(server.freeze_sessions())

    service = UploadService(cfg, backend=HookBackend(SftpBackend(settings), freeze))
    t0 = time.monotonic()
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)), timeout=60)
    assert frozen
    assert time.monotonic() - t0 < 30
    # the listener still answers: a fresh connection resumed the upload
    assert final.state == COMPLETED and final.attempts >= 2 and "transfer timeout" in final.last_error
    same_tree(exp.accepted, Path(final.remote_path))
    assert staging_dirs(tmp_path) == []


def test_wrong_host_key_is_refused(tmp_path: Path, server: SshServer) -> None:
    other = SshServer.start(tmp_path / "other")  # a second server: its key is the wrong one
    try:
        wrong = tmp_path / "wrong_known_hosts"
        wrong.write_text(f"[127.0.0.1]:{server.port} {other.host_key_line}\n")
    finally:
        other.stop()
    settings = server.sftp_settings(str(remote_root(tmp_path)), known_hosts=str(wrong))
    cfg = make_config(tmp_path, settings)
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    service = UploadService(cfg)
    final = wait_done(service, service.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert final.state == FAILED and "does not match" in final.error and "refused" in final.error
    assert not remote_root(tmp_path).exists()

    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    backend = SftpBackend(dataclasses.replace(settings, known_hosts=str(unknown)))
    with pytest.raises(UploadError, match="is not in .*refused"):
        backend.upload(exp.accepted, "pick_hdf5_accepted")
    assert not remote_root(tmp_path).exists()


# -- the gate -------------------------------------------------------------------------


def _refusal_cases(tmp_path: Path, cfg: Config) -> Export:
    return make_export(tmp_path, JobStore(cfg.export.jobs_dir))


@pytest.mark.parametrize("case, message", [
    ("rejected_dir", r"is the rejected subset of export .*only the accepted"),
    ("other_format", r"was exported as hdf5, not mcap"),
    ("other_format_marker", r"says dataset_format 'hdf5', not 'mcap'.*older or other-format"),
    ("older_export", r"not the accepted directory of the latest completed hdf5 export"),
    ("mismatched_source_marker", r"says source_dir .* not the current source"),
    ("mismatched_source_request", r"was exported from .*not from the current source"),
    ("never_exported", r"has never been exported as hdf5"),
    ("failed_export", r"has never been exported as hdf5"),
    ("marker_missing", r"cannot read .*quality_split.json"),
    ("marker_rejected", r"says subset 'rejected': a rejected directory is never uploaded"),
    ("no_backend", r"no upload backend is configured"),
    ("unknown_format", r"unknown export format .parquet.; registered formats"),
    ("empty_accepted", r"accepted subset is empty \(0 of 2 episodes accepted\): nothing to upload; 2 episode\(s\) "
                       r"have no quality field and no verdict"),
])
def test_gate_refusals(tmp_path: Path, case: str, message: str) -> None:
    sftp = None if case == "no_backend" else SftpSettings(
        host="127.0.0.1", port=1, identity_file="/nonexistent", known_hosts="/nonexistent",
        remote_dir=str(remote_root(tmp_path)))
    cfg = make_config(tmp_path, sftp)
    store = JobStore(cfg.export.jobs_dir)
    exp = make_export(tmp_path, store)
    source, fmt, accepted = str(exp.source), "hdf5", str(exp.accepted)
    if case == "rejected_dir":
        accepted = str(exp.rejected)
    elif case == "other_format":
        fmt = "mcap"
    elif case == "other_format_marker":  # the mcap job points at a directory still marked hdf5
        fmt = "mcap"
        store.save(Job.new("export", source, "mcap", state=COMPLETED, accepted_dir=accepted,
                           finished_at=time.time()))
    elif case == "older_export":
        newer = make_export(tmp_path / "again", store, finished_at=time.time() + 10)
        newer_job = dataclasses.replace(newer.job, source_dir=source)
        store.save(newer_job)
    elif case == "mismatched_source_marker":
        QualitySplit(source_dir=str(tmp_path / "elsewhere" / "raw"), subset="accepted",
                     dataset_format="hdf5", source_episode_indices=[0]).write(exp.accepted)
    elif case == "mismatched_source_request":
        other = make_export(tmp_path / "o", store, dataset="place")
        source = str(other.source)
    elif case == "never_exported":
        for p in Path(cfg.export.jobs_dir).glob("*.json"):
            p.unlink()
    elif case == "failed_export":
        for p in Path(cfg.export.jobs_dir).glob("*.json"):
            p.unlink()
        store.save(Job.new("export", source, "hdf5", state=FAILED, accepted_dir=accepted))
    elif case == "marker_missing":
        (exp.accepted / "meta" / "quality_split.json").unlink()
    elif case == "marker_rejected":
        QualitySplit(source_dir=source, subset="rejected", dataset_format="hdf5",
                     source_episode_indices=[0]).write(exp.accepted)
    elif case == "unknown_format":
        fmt = "parquet"
    elif case == "empty_accepted":  # e.g. a LeRobot dataset without quality fields
        QualitySplit(source_dir=source, subset="accepted", dataset_format="hdf5", source_episode_indices=[],
                     rejected_count=2, unrated_count=2).write(exp.accepted)
    service = UploadService(cfg)
    with pytest.raises(UploadRefused, match=message):
        service.start(source, fmt, accepted)
    assert upload_jobs(cfg) == []  # no job created
    assert service.status().state == "IDLE" and service.status().current is None


def test_gate_accepts_current_export_and_resolves_paths(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs")
    exp = make_export(tmp_path, store)
    link = tmp_path / "link_to_raw"
    link.symlink_to(exp.source)
    sftp = SftpSettings(host="h", known_hosts="/k", remote_dir="/r")
    marker = check_upload(str(link), "hdf5", str(exp.accepted) + "/.", store, sftp, set())
    assert marker.subset == "accepted" and marker.dataset_format == "hdf5"
    assert publish_name(str(exp.source), "hdf5") == "pick_hdf5_accepted"
    assert publish_name(str(tmp_path / "session_7"), "mcap") == "session_7_mcap_accepted"


class BlockingBackend:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def describe(self) -> str:
        return "blocking"

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        self.entered.set()
        assert self.release.wait(30)
        return UploadResult(f"/x/{name}", 0, 0, False)


def test_gate_refuses_a_second_upload_of_the_same_directory(tmp_path: Path) -> None:
    sftp = SftpSettings(host="127.0.0.1", known_hosts="/k", remote_dir="/r")
    cfg = make_config(tmp_path, sftp)
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    backend = BlockingBackend()
    service = UploadService(cfg, backend=backend)
    job = service.start(str(exp.source), "hdf5", str(exp.accepted))
    try:
        assert backend.entered.wait(10)
        assert service.status().state == "BUSY" and service.get(job.job_id).state == RUNNING  # type: ignore[union-attr]
        with pytest.raises(UploadRefused, match="already running"):
            service.start(str(exp.source), "hdf5", str(exp.accepted))
        assert upload_jobs(cfg) == [JobStore(cfg.upload.jobs_dir).path(job.job_id)]
    finally:
        backend.release.set()
    final = wait_done(service, job)
    assert final.state == COMPLETED and final.remote_path == "/x/pick_hdf5_accepted"
    assert service.status().state == "IDLE"


def test_jobs_left_running_are_marked_failed_at_start(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, None)
    store = JobStore(cfg.upload.jobs_dir)
    stale = Job.new("upload", "/s", "hdf5", state=RUNNING)
    store.save(stale)
    service = UploadService(cfg)
    got = service.get(stale.job_id)
    assert got is not None and got.state == FAILED and "interrupted" in got.error
    assert [j.job_id for j in service.interrupted] == [stale.job_id]


# -- configuration --------------------------------------------------------------------


@pytest.mark.parametrize("remote_dir", ["datasets", "./datasets", "/data/../etc", "/data//x", "/data/",
                                         "/data/./x", ""])
def test_config_refuses_non_canonical_remote_dir(tmp_path: Path, remote_dir: str) -> None:
    settings = SftpSettings(host="127.0.0.1", known_hosts="/k", remote_dir=remote_dir)
    with pytest.raises(ConfigError, match="remote_dir"):
        make_config(tmp_path, settings)
    with pytest.raises(ConfigError, match="remote_dir"):
        SftpBackend(settings)


# -- the CLI --------------------------------------------------------------------------


def test_cli_upload(tmp_path: Path, server: SshServer) -> None:
    settings = server.sftp_settings(str(remote_root(tmp_path)))
    cfg = make_config(tmp_path, settings)
    exp = make_export(tmp_path, JobStore(cfg.export.jobs_dir))
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({
        "collection": {"log_dir": str(tmp_path / "log"), "storage": {"sftp": dataclasses.asdict(settings)}},
        "export": {"jobs_dir": str(cfg.export.jobs_dir)},
        "upload": {"jobs_dir": str(cfg.upload.jobs_dir)},
    }))
    cmd = [sys.executable, "-m", "eva_export.cli", "upload", "--config", str(config_file),
           "--source", str(exp.source), "--format", "hdf5"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(cmd + ["--accepted", str(exp.accepted), "--wait"], capture_output=True, text=True,
                        env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    job = json.loads(ok.stdout)
    assert job["state"] == COMPLETED and job["remote_path"].endswith("/pick_hdf5_accepted")
    same_tree(exp.accepted, Path(job["remote_path"]))
    refused = subprocess.run(cmd + ["--accepted", str(exp.rejected)], capture_output=True, text=True,
                             env=env, timeout=120)
    assert refused.returncode == 2 and "upload refused" in refused.stderr and refused.stdout == ""


def test_close_cancels_a_running_upload(tmp_path: Path, server: SshServer) -> None:
    """A node shutdown cancels the upload; the staging directory is kept and the next start resumes."""
    settings = server.sftp_settings(str(remote_root(tmp_path)))
    cfg = make_config(tmp_path, settings)
    exp = big_export(tmp_path, cfg)
    reached = threading.Event()
    holder: list[UploadService] = []

    def hold(bytes_done: int) -> None:
        if bytes_done >= 12 * MB and not reached.is_set():
            reached.set()
            deadline = time.monotonic() + 10
            while not holder[0].closing and time.monotonic() < deadline:
                time.sleep(0.01)

    service = UploadService(cfg, backend=HookBackend(SftpBackend(settings), hold))
    holder.append(service)
    job = service.start(str(exp.source), "hdf5", str(exp.accepted))
    assert reached.wait(30)
    service.close(cancel=True, timeout=60)
    final = service.get(job.job_id)
    assert final is not None and final.state == FAILED and "cancelled" in final.error
    assert "nothing was published" in final.error and "is kept: the next upload" in final.error
    assert [p.name for p in remote_root(tmp_path).iterdir() if not p.name.startswith(".")] == []
    with pytest.raises(UploadRefused, match="shutting down"):
        service.start(str(exp.source), "hdf5", str(exp.accepted))
    # the local snapshot is gone with the job
    assert not list((exp.accepted.parent.parent).glob(".upload-*"))

    restarted = UploadService(cfg)
    again = wait_done(restarted, restarted.start(str(exp.source), "hdf5", str(exp.accepted)))
    assert again.state == COMPLETED and "resumed into" in again.last_error
    same_tree(exp.accepted, Path(again.remote_path))
    assert staging_dirs(tmp_path) == []
