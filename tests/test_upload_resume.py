"""Uploads over a flaky link, against a real OpenSSH server on 127.0.0.1.

Kills at random points (the connection's sshd, the whole sshd, or the uploading process),
then resume: the published remote directory is byte-identical to the source or absent,
never partial; a resume sends at most the bytes that were not on the server yet; corrupt
remote copies are detected and sent again; the bandwidth cap holds; a re-export during a
paused upload does not mix versions.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd import SshServer  # noqa: E402
from test_upload_core import HookBackend, make_config, remote_root, same_tree, write_tree  # noqa: E402

from eva_export.config import SftpSettings  # noqa: E402
from eva_export.errors import UploadError  # noqa: E402
from eva_export.manifest import verify_manifest, write_manifest  # noqa: E402
from eva_export.upload import remotefs as remotefs_mod  # noqa: E402
from eva_export.upload import transfer as transfer_mod  # noqa: E402
from eva_export.upload.limiter import RateLimiter  # noqa: E402
from eva_export.upload.sftp import SftpBackend, UploadResult  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KB = 1 << 10
MB = 1 << 20
TRIALS = 30

# two files above SMALL_FILE (sent one after another), small ones (sent in parallel), an empty one
TRIAL_TREE = {
    "data/big_a.bin": 1 * MB + 300 * KB,
    "videos/big_b.bin": 1 * MB + 40 * KB,
    "meta/info.json": 900,
    "meta/episodes.jsonl": 3 * KB,
    "data/s1.bin": 150 * KB,
    "data/s2.bin": 90 * KB,
    "data/s3.bin": 200 * KB,
    "data/empty.bin": 0,
}
LARGEST = max(TRIAL_TREE.values())


@pytest.fixture
def fine_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress (and so the kill hooks) every 32 KiB instead of every 4 MiB."""
    monkeypatch.setattr(transfer_mod, "PROGRESS_EVERY", 32 * KB)


def make_subset(root: Path, files: dict[str, int] = TRIAL_TREE) -> Path:
    write_tree(root, files)
    write_manifest(root)
    return root


def subset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def published(remote: Path) -> list[Path]:
    return sorted(p for p in remote.iterdir() if not p.name.startswith(".")) if remote.is_dir() else []


def staged_bytes(remote: Path) -> int:
    if not remote.is_dir():
        return 0
    return sum(subset_bytes(p) for p in remote.iterdir() if ".staging-" in p.name)


def check_never_partial(src: Path, remote: Path) -> None:
    """Whatever is published is the whole source, byte for byte."""
    for d in published(remote):
        same_tree(src, d)


# -- random kills ---------------------------------------------------------------------


UPLOAD_SCRIPT = """
import json, sys
from eva_export.config import SftpSettings
from eva_export.upload import sftp as m, transfer
transfer.PROGRESS_EVERY = 32 * 1024
settings = SftpSettings(**json.loads(sys.argv[1]))
def progress(fd, ft, bd, bt):
    print(bd, flush=True)
m.SftpBackend(settings).upload(sys.argv[2], sys.argv[3], progress)
print("done", flush=True)
"""


def _kill_process_at(settings: SftpSettings, src: Path, name: str, at: int) -> bool:
    """Run an upload in its own process and SIGKILL it once ``at`` bytes are reported."""
    import dataclasses

    proc = subprocess.Popen([sys.executable, "-c", UPLOAD_SCRIPT, json.dumps(dataclasses.asdict(settings)),
                             str(src), name], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    killed = False
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.strip().isdigit() and int(line) >= at:
                proc.send_signal(signal.SIGKILL)  # like a node killed mid-upload
                killed = True
                break
    finally:
        if proc.poll() is None and not killed:
            proc.kill()
        proc.wait(30)
    return killed


def test_random_kills_then_resume(tmp_path: Path, server: SshServer, fine_progress: None) -> None:
    """30 trials: kill at a random point, then resume; never a partial publication."""
    rng = random.Random(19)
    src = make_subset(tmp_path / "src")
    total = subset_bytes(src)
    kinds = {"session": 0, "server": 0, "process": 0}
    for trial in range(TRIALS):
        kind = ("session", "server", "process")[trial % 3]
        remote = remote_root(tmp_path) / f"t{trial}"
        # paramiko's sending: kills at any byte of its progress (bulk: openssh, whose progress
        # is per file, has its own break tests in test_upload_openssh.py)
        settings = server.sftp_settings(str(remote), max_attempts=1 if kind == "server" else 4,
                                        connect_timeout_s=3.0, transfer_timeout_s=5.0, bulk="paramiko")
        at = rng.randrange(1, total)
        sent_before = 0
        if kind == "session":  # the connection's sshd dies: the job's next attempt resumes
            fired: list[int] = []

            def kill_session(bd: int, at: int = at, fired: list[int] = fired) -> None:
                if bd >= at and not fired:
                    fired.extend(server.kill_sessions() or [0])

            res = HookBackend(SftpBackend(settings), kill_session).upload(src, "ds")
            assert res.attempts == (2 if fired else 1)
            kinds[kind] += bool(fired)
            resent = res.sent_bytes - total
        else:
            if kind == "server":  # the whole server goes away; the job fails, a later job resumes
                holder: list[UploadResult] = []
                backend = SftpBackend(settings)
                fired2: list[bool] = []

                def stop_server(bd: int, at: int = at, fired2: list[bool] = fired2) -> None:
                    if bd >= at and not fired2:
                        fired2.append(True)
                        server.proc.send_signal(signal.SIGKILL)
                        server.kill_sessions()

                try:
                    holder.append(HookBackend(backend, stop_server).upload(src, "ds"))
                except UploadError as exc:
                    assert "nothing was published" in str(exc)
                kinds[kind] += bool(fired2)
                if fired2:
                    server.restart()
                assert backend.last_job is not None
                sent_before = 0 if holder else backend.last_job.sent_bytes
            else:  # the uploading process is SIGKILLed (a node restart)
                kinds[kind] += _kill_process_at(settings, src, "ds", at)
            check_never_partial(src, remote)
            on_server = staged_bytes(remote)
            res = SftpBackend(settings).upload(src, "ds")
            # a resume sends only what was not on the server (a partial file continues)
            assert res.sent_bytes <= total - on_server + LARGEST, (trial, kind, res.sent_bytes, on_server)
            resent = sent_before + res.sent_bytes - total
        assert resent <= LARGEST, (trial, kind, resent)
        pubs = published(remote)
        assert pubs, (trial, kind)
        for d in pubs:
            same_tree(src, d)
        assert staged_bytes(remote) == 0 and not [p for p in remote.iterdir() if p.name.startswith(".")]
        assert res.verified == "sha256"
    # most trials really broke the upload (a late random point may fall after the last report)
    assert sum(kinds.values()) >= TRIALS * 2 // 3, kinds


# -- corrupt remote copies ----------------------------------------------------------------


def _break_off(server: SshServer, settings: SftpSettings, src: Path, limit: int) -> Path:
    """Upload until the server refuses to grow a file past ``limit`` bytes (its sftp-server dies
    there, a point the server reaches for sure), no retry; return the staging dir."""
    server.limit_file_size(limit)
    try:
        with pytest.raises(UploadError, match="is kept: the next upload"):
            SftpBackend(settings).upload(src, "ds")
    finally:
        server.limit_file_size(None)
    staging = [p for p in Path(settings.remote_dir).iterdir() if ".staging-" in p.name]
    assert len(staging) == 1
    return staging[0]


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("sftp_only", [False, True], ids=["remote-sha256", "read-back"])
def test_corrupt_remote_prefix_and_copy_are_sent_again(tmp_path: Path, fine_progress: None,
                                                      sftp_only: bool) -> None:
    server = SshServer.start(tmp_path / "sshd", sftp_only=sftp_only)
    try:
        src = make_subset(tmp_path / "src", {"a_big.bin": 2 * MB, "b_big.bin": 3 * MB, "c_big.bin": 2 * MB})
        settings = server.sftp_settings(str(remote_root(tmp_path)), max_attempts=1, parallel_files=1,
                                        bulk="paramiko")  # the client's counterpart: test_upload_openssh.py
        # a_big (2 MiB) fits under the limit, b_big stops at it, c_big is never started
        staging = _break_off(server, settings, src, 5 * MB // 2)
        a, b = staging / "a_big.bin", staging / "b_big.bin"
        assert a.stat().st_size == 2 * MB and b.stat().st_size == 5 * MB // 2
        assert not (staging / "c_big.bin").exists()
        partial = b.stat().st_size
        _flip_byte(b, partial // 2)  # the remote prefix is corrupt
        if not sftp_only:
            _flip_byte(a, 1000)  # a complete-looking copy is corrupt (caught by its hash)
        res = SftpBackend(dataclasses_replace(settings, max_attempts=2)).upload(src, "ds")
        assert res.verified == ("size" if sftp_only else "sha256")
        notes = " ".join(res.notes)
        assert "b_big.bin: the partial copy on the server" in notes
        if sftp_only:  # complete files are checked by size only; the prefix was read back
            assert res.sent_bytes == 3 * MB + 2 * MB + len((src / "meta/manifest.json").read_bytes())  # b, c
        else:
            assert "a_big.bin: the copy on the server differs" in notes
            assert res.sent_bytes == subset_bytes(src)
        same_tree(src, Path(res.remote_path))
    finally:
        server.stop()


def dataclasses_replace(settings: SftpSettings, **kw: object) -> SftpSettings:
    import dataclasses

    return dataclasses.replace(settings, **kw)  # type: ignore[arg-type]


def test_intact_prefix_is_continued_not_resent(tmp_path: Path, server: SshServer, fine_progress: None) -> None:
    src = make_subset(tmp_path / "src", {"a_big.bin": 2 * MB, "b_big.bin": 3 * MB})
    settings = server.sftp_settings(str(remote_root(tmp_path)), max_attempts=1, parallel_files=1,
                                    bulk="paramiko")  # the client's counterpart: test_upload_openssh.py
    staging = _break_off(server, settings, src, 5 * MB // 2)
    on_server = staged_bytes(remote_root(tmp_path))
    assert (staging / "a_big.bin").stat().st_size == 2 * MB
    assert (staging / "b_big.bin").stat().st_size == 5 * MB // 2
    res = SftpBackend(settings).upload(src, "ds")
    assert res.sent_bytes == subset_bytes(src) - on_server  # not one byte twice
    assert res.skipped_bytes == on_server
    assert any("resumed into" in n for n in res.notes)
    same_tree(src, Path(res.remote_path))


def test_other_versions_leftovers_are_removed(tmp_path: Path, server: SshServer, fine_progress: None) -> None:
    src = make_subset(tmp_path / "src", {"a_big.bin": 3 * MB, "b_big.bin": 2 * MB})
    settings = server.sftp_settings(str(remote_root(tmp_path)), max_attempts=1)
    old = _break_off(server, settings, src, 5 * MB // 2)  # a_big stops at 2.5 MiB
    stale_random = remote_root(tmp_path) / ".ds.staging-0a1b2c3d"  # an older client's random name
    stale_random.mkdir()
    (stale_random / "x").write_bytes(b"x")
    unrelated = remote_root(tmp_path) / ".other.staging-0a1b2c3d"
    unrelated.mkdir()
    (src / "a_big.bin").write_bytes(os.urandom(1000))  # a new version of the export
    write_manifest(src)
    res = SftpBackend(settings).upload(src, "ds")
    notes = " ".join(res.notes)
    assert f"removed {old}" in notes and f"removed {stale_random}" in notes
    assert sorted(p.name for p in remote_root(tmp_path).iterdir()) == [".other.staging-0a1b2c3d", "ds"]
    same_tree(src, Path(res.remote_path))


def test_local_file_changed_after_export_is_refused(tmp_path: Path, server: SshServer) -> None:
    src = make_subset(tmp_path / "src", {"a.bin": 5000})
    _flip_byte(src / "a.bin", 10)  # same size, other content than the manifest says
    with pytest.raises(UploadError, match="does not match its manifest entry.*staging directory was removed"):
        SftpBackend(server.sftp_settings(str(remote_root(tmp_path)))).upload(src, "ds")
    assert list(remote_root(tmp_path).iterdir()) == []
    (src / "extra.bin").write_bytes(b"1")
    with pytest.raises(UploadError, match="does not match its meta/manifest.json"):
        SftpBackend(server.sftp_settings(str(remote_root(tmp_path)))).upload(src, "ds")


def test_rename_reached_server_before_the_break(tmp_path: Path, server: SshServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection dies right after the rename: the retry finds the publication, no second copy."""
    src = make_subset(tmp_path / "src", {"a.bin": 5000})
    real = remotefs_mod.publish
    calls: list[int] = []

    def publish_then_break(sftp, staging, remote_dir, name):  # type: ignore[no-untyped-def]
        out = real(sftp, staging, remote_dir, name)
        calls.append(1)
        if len(calls) == 1:
            raise EOFError("connection lost after the rename")
        return out

    monkeypatch.setattr(remotefs_mod, "publish", publish_then_break)
    res = SftpBackend(server.sftp_settings(str(remote_root(tmp_path)))).upload(src, "ds")
    assert res.attempts == 2 and res.remote_path == str(remote_root(tmp_path) / "ds")
    assert "had reached the server" in " ".join(res.notes)
    assert [p.name for p in remote_root(tmp_path).iterdir()] == ["ds"]
    same_tree(src, remote_root(tmp_path) / "ds")


# -- bandwidth cap --------------------------------------------------------------------


def test_rate_limiter_accounting_is_exact() -> None:
    """On a fake clock: never more than rate * (elapsed + burst) bytes let through."""
    now = [0.0]

    def sleep(d: float) -> None:
        now[0] += d

    lim = RateLimiter(1000.0, burst_s=0.05, clock=lambda: now[0], sleep=sleep)
    rng = random.Random(3)
    for _ in range(500):
        lim.consume(rng.randrange(1, 200))
        assert lim.granted <= 1000.0 * (now[0] + 0.05) + 200
        if rng.random() < 0.05:
            now[0] += rng.random() * 0.3  # the sender idles: no credit beyond the burst
    assert lim.booked_rate() <= 1000.0 + 1e-9


def test_rate_limiter_does_not_slow_a_fast_sender() -> None:
    """On a fake clock, a sender that never idles is held to exactly the cap: after each call
    the clock stands where the previous bytes are paid for (not later)."""
    now = [0.0]

    def sleep(d: float) -> None:
        now[0] += d

    lim = RateLimiter(1000.0, burst_s=0.05, clock=lambda: now[0], sleep=sleep)
    sent = 0
    for n in [100, 250, 1, 999, 500] * 20:
        lim.consume(n)
        assert now[0] == pytest.approx(sent / 1000.0, abs=1e-9)  # paid for the bytes before these
        sent += n
    assert lim.booked_rate() == pytest.approx(1000.0, rel=1e-9)


def test_bandwidth_cap_holds(tmp_path: Path, server: SshServer) -> None:
    cap = 1_500_000
    src = make_subset(tmp_path / "src", {"a.bin": 2 * MB, "b.bin": 600 * KB, "c.bin": 300 * KB, "d.bin": 200 * KB})
    # the project's limiter paces paramiko's writes; bulk: openssh hands the cap to the client
    # as -l (test_bandwidth_cap_becomes_dash_l)
    backend = SftpBackend(server.sftp_settings(str(remote_root(tmp_path)), bandwidth_limit_bps=cap,
                                               bulk="paramiko"))
    t0 = time.monotonic()
    res = backend.upload(src, "ds")
    elapsed = time.monotonic() - t0
    lim = backend.last_limiter
    assert lim is not None and lim.granted == res.sent_bytes == subset_bytes(src)
    # the limiter's own books: never faster than the cap (a relative 1e-9 tolerance: the rate
    # is a float quotient of the books), and the cap was binding (the sender was made to wait).
    # No lower bound on the rate: a starved sender may run below the cap, which is not a fault;
    # that the limiter itself does not slow a fast sender is test_rate_limiter_accounting_is_exact.
    assert lim.booked_rate() <= cap * (1 + 1e-9)
    assert lim.waited_s > 0
    # and the wall clock cannot beat the cap by more than the burst (a bound that slowness cannot break)
    assert res.sent_bytes <= cap * (elapsed + lim.burst_s)
    same_tree(src, Path(res.remote_path))


# -- snapshot isolation ---------------------------------------------------------------


def test_reexport_during_paused_upload_does_not_mix_versions(tmp_path: Path, server: SshServer,
                                                            fine_progress: None) -> None:
    """hdf5 upload paused at 40%, a note changed, the format re-exported, the upload resumed:
    the remote holds exactly the version that was accepted when the upload started."""
    import shutil

    from dsfactory import Ep, features, make_dataset

    from eva_export.export.runner import ExportService
    from eva_export.formats.lerobot_v21.writer import DatasetWriter
    from eva_export.jobs import COMPLETED
    from eva_export.upload import UploadService

    settings = server.sftp_settings(str(remote_root(tmp_path)), parallel_files=1)
    cfg = make_config(tmp_path, settings)
    raw = tmp_path / "log" / "pick" / "raw"
    make_dataset(raw, [Ep(frames=40, note="first note"), Ep(frames=40), Ep(frames=40), Ep(frames=40)])
    exporter = ExportService(cfg, background=False, recover=False)
    first = exporter.run(str(raw), "hdf5")
    assert first.state == COMPLETED, first.error
    accepted = Path(first.accepted_dir)
    assert verify_manifest(accepted) == []
    before = tmp_path / "before"
    shutil.copytree(accepted, before)

    paused, release = threading.Event(), threading.Event()

    def pause(bd: int) -> None:
        total = subset_bytes(before)
        if bd >= 0.4 * total and not paused.is_set():
            paused.set()
            assert release.wait(60)

    service = UploadService(cfg, backend=HookBackend(SftpBackend(settings), pause))
    job = service.start(str(raw), "hdf5", str(accepted))
    try:
        assert paused.wait(60), "the upload never reached 40%"
        dw = DatasetWriter.open(raw, fps=30, features=features(), robot_type="test")
        dw.review(0, "", "a changed note")
        second = exporter.run(str(raw), "hdf5")
        assert second.state == COMPLETED, second.error
        assert verify_manifest(accepted) == []
        assert (accepted / "meta/manifest.json").read_bytes() != (before / "meta/manifest.json").read_bytes()
    finally:
        release.set()
    final = service.wait(job.job_id, 120)
    assert final is not None and final.state == COMPLETED, final
    same_tree(before, Path(final.remote_path))  # the old version, whole, nothing of the new one
    assert verify_manifest(Path(final.remote_path)) == []
    assert not list(accepted.parent.parent.glob(".upload-*"))  # the snapshot is gone
    # the new version uploads as its own copy
    again = service.wait(service.start(str(raw), "hdf5", str(accepted)).job_id, 120)
    assert again is not None and again.state == COMPLETED, again
    same_tree(accepted, Path(again.remote_path))
