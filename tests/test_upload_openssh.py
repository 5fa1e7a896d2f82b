"""``bulk: openssh``: the file bytes go through OpenSSH's ``sftp -b``, against a real sshd.

paramiko still connects, plans the resume, verifies and renames; these tests check that the
client runs under the same host-key policy, resumes an intact prefix and overwrites a
corrupt one after a server-side break at an exact byte, reports per file, honours the cap
and the cancel, and that its failures are retryable attempts with a redacted message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd import SshServer  # noqa: E402
from test_upload_core import remote_root, same_tree, write_tree  # noqa: E402
from test_upload_resume import _flip_byte, make_subset, published, staged_bytes, subset_bytes  # noqa: E402

from eva_export.config import SftpSettings  # noqa: E402
from eva_export.errors import ConfigError, UploadError  # noqa: E402
from eva_export.upload import bulk_openssh  # noqa: E402
from eva_export.upload.bulk_openssh import OpensshBulk, batch_safe, find_client  # noqa: E402
from eva_export.upload.connection import connect, open_sftp  # noqa: E402
from eva_export.upload.job import UploadCancelled  # noqa: E402
from eva_export.upload.remote import HashQueue, RemoteHasher  # noqa: E402
from eva_export.upload.sftp import SftpBackend  # noqa: E402

MB = 1 << 20
SFTP = find_client("openssh")
assert SFTP is not None  # find_client raises when the client is missing


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> SshServer:
    srv = SshServer.start(tmp_path / "sshd")
    request.addfinalizer(srv.stop)
    return srv


def openssh_settings(server: SshServer, tmp_path: Path, **kw: object) -> SftpSettings:
    return server.sftp_settings(str(remote_root(tmp_path)), **{"bulk": "openssh", **kw})


def test_upload_byte_for_byte_with_per_file_progress(tmp_path: Path, server: SshServer) -> None:
    files = {"videos/a.mp4": 3 * MB + 5, "data/b.parquet": 200_000, "meta/info.json": 700,
             "meta/with space.json": 300, "data/empty.bin": 0}
    src = make_subset(tmp_path / "src", files)
    seen: list[tuple[int, int]] = []
    res = SftpBackend(openssh_settings(server, tmp_path)).upload(
        src, "ds", lambda fd, ft, bd, bt: seen.append((fd, bd)))
    same_tree(src, Path(res.remote_path))
    assert res.verified == "sha256" and res.attempts == 1
    assert res.sent_bytes == subset_bytes(src)
    done = sorted({fd for fd, _bd in seen})
    # every file is reported once complete (the empty one counts before sending)
    assert done[-1] == len(files) + 1 and len(done) >= len(files)
    assert [bd for _fd, bd in seen] == sorted(bd for _fd, bd in seen)


def _break_off(server: SshServer, settings: SftpSettings, src: Path, limit: int) -> str:
    """Upload until the server's sftp-server dies at ``limit`` bytes of a file; return the error."""
    server.limit_file_size(limit)
    try:
        with pytest.raises(UploadError, match="is kept: the next upload") as info:
            SftpBackend(settings).upload(src, "ds")
    finally:
        server.limit_file_size(None)
    return str(info.value)


def _staging(tmp_path: Path) -> Path:
    dirs = [p for p in remote_root(tmp_path).iterdir() if ".staging-" in p.name]
    assert len(dirs) == 1
    return dirs[0]


def test_break_at_the_server_then_reput_resumes(tmp_path: Path, server: SshServer) -> None:
    src = make_subset(tmp_path / "src", {"a_big.bin": 2 * MB, "b_big.bin": 3 * MB, "c_big.bin": 2 * MB})
    settings = openssh_settings(server, tmp_path, max_attempts=1)
    error = _break_off(server, settings, src, 5 * MB // 2)
    assert "OpenSSH's sftp client failed" in error and "b_big.bin" in error
    client_part = error.split("OpenSSH's sftp client failed", 1)[1]
    assert f"{server.user}@{server.host}" not in client_part  # the client's stderr is redacted
    staging = _staging(tmp_path)
    assert (staging / "a_big.bin").stat().st_size == 2 * MB
    assert (staging / "b_big.bin").stat().st_size == 5 * MB // 2
    assert not (staging / "c_big.bin").exists()
    on_server = staged_bytes(remote_root(tmp_path))
    res = SftpBackend(settings).upload(src, "ds")
    assert res.sent_bytes == subset_bytes(src) - on_server  # the prefix was continued, not re-sent
    assert res.skipped_bytes == on_server
    assert any("resumed into" in n for n in res.notes)
    same_tree(src, Path(res.remote_path))
    assert [p.name for p in remote_root(tmp_path).iterdir()] == ["ds"]


def test_corrupt_prefix_is_overwritten(tmp_path: Path, server: SshServer) -> None:
    src = make_subset(tmp_path / "src", {"a_big.bin": 2 * MB, "b_big.bin": 3 * MB})
    settings = openssh_settings(server, tmp_path, max_attempts=1)
    _break_off(server, settings, src, 5 * MB // 2)
    staging = _staging(tmp_path)
    _flip_byte(staging / "b_big.bin", MB)
    _flip_byte(staging / "a_big.bin", 10)  # a complete-looking copy, caught by its hash
    res = SftpBackend(settings).upload(src, "ds")
    notes = " ".join(res.notes)
    assert "b_big.bin: the partial copy on the server" in notes
    assert "a_big.bin: the copy on the server differs" in notes
    assert res.sent_bytes == subset_bytes(src)
    same_tree(src, Path(res.remote_path))


def test_a_failed_client_is_a_retryable_attempt(tmp_path: Path, server: SshServer) -> None:
    """The first attempt's client dies at the limit; the second attempt (no limit) finishes."""
    src = make_subset(tmp_path / "src", {"a_big.bin": 3 * MB})
    attempts: list[tuple[int, str]] = []
    server.limit_file_size(MB)

    def on_attempt(n: int, previous: str) -> None:
        attempts.append((n, previous))
        if n == 2:
            server.limit_file_size(None)  # read by the next SFTP session only

    res = SftpBackend(openssh_settings(server, tmp_path, max_attempts=3)).upload(src, "ds", None, on_attempt)
    assert res.attempts == 2
    assert "OpenSSH's sftp client failed" in attempts[1][1]
    # the first MiB was resumed; bytes of the file the client failed on are not counted
    assert res.sent_bytes == subset_bytes(src) - MB
    same_tree(src, Path(res.remote_path))


def test_sftp_only_server(tmp_path: Path) -> None:
    server = SshServer.start(tmp_path / "sshd", sftp_only=True)
    try:
        src = make_subset(tmp_path / "src", {"a.bin": 2 * MB, "b.bin": 5000})
        res = SftpBackend(openssh_settings(server, tmp_path)).upload(src, "ds")
        assert res.verified == "size"
        same_tree(src, Path(res.remote_path))
    finally:
        server.stop()


def test_bandwidth_cap_becomes_dash_l(tmp_path: Path, server: SshServer) -> None:
    cap = 1_000_000  # bytes/s -> 7812 units of 1024 bit/s = 999,936 bytes/s: never above the cap
    settings = openssh_settings(server, tmp_path, bandwidth_limit_bps=cap)
    cmd = OpensshBulk(settings, SFTP).command("batch")
    assert cmd[cmd.index("-l") + 1] == "7812"
    src = make_subset(tmp_path / "src", {"a.bin": 2 * MB})
    t0 = time.monotonic()
    res = SftpBackend(settings).upload(src, "ds")
    wall = time.monotonic() - t0
    # a lower bound only (load can only make it slower): the client paced the bytes
    assert wall >= 0.8 * res.sent_bytes / cap, wall
    same_tree(src, Path(res.remote_path))


def test_the_client_refuses_an_unknown_host_key(tmp_path: Path, server: SshServer) -> None:
    """The exact command the upload runs checks the pinned key and nothing else."""
    other = tmp_path / "other_known_hosts"
    other.write_text(f"[127.0.0.1]:{server.port} ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIDlZ2ZhYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAx\n")
    settings = dataclasses.replace(openssh_settings(server, tmp_path), known_hosts=str(other))
    bulk = OpensshBulk(settings, SFTP)
    cmd = bulk.command(str(tmp_path / "batch"))
    (tmp_path / "batch").write_text("pwd\n")
    for opt in ("StrictHostKeyChecking=yes", f"UserKnownHostsFile={other}", "IdentitiesOnly=yes",
                "GlobalKnownHostsFile=/dev/null", "Ciphers=^aes128-gcm@openssh.com"):
        assert opt in cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "host key" in proc.stderr.lower() or "verification failed" in proc.stderr.lower(), proc.stderr
    assert f"{server.user}@" not in bulk.redact(f"Connection to {server.user}@{server.host} closed")


def _sftp_children() -> list[int]:
    """Our own child processes named sftp."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if comm == "sftp" and ppid == os.getpid():
            out.append(int(entry.name))
    return out


def test_cancel_stops_the_client_and_keeps_staging(tmp_path: Path, server: SshServer) -> None:
    src = make_subset(tmp_path / "src", {"a.bin": 2 * MB, "b.bin": 2 * MB, "c.bin": 2 * MB})

    def progress(fd: int, _ft: int, _bd: int, _bt: int) -> None:
        if fd >= 1:
            raise UploadCancelled("cancelled by the test")

    with pytest.raises(UploadCancelled, match="is kept"):
        SftpBackend(openssh_settings(server, tmp_path)).upload(src, "ds", progress)
    assert published(remote_root(tmp_path)) == []
    assert _sftp_children() == []  # the client was stopped, not left running
    res = SftpBackend(openssh_settings(server, tmp_path)).upload(src, "ds")
    same_tree(src, Path(res.remote_path))


def test_missing_client_and_bad_mode_are_refused(tmp_path: Path, server: SshServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="bulk 'scp' must be one of paramiko, openssh, auto"):
        openssh_settings(server, tmp_path, bulk="scp").check()
    src = make_subset(tmp_path / "src", {"a.bin": 5000})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sftp client on this PATH
    with pytest.raises(UploadError, match="OpenSSH's sftp client is not installed"):
        SftpBackend(openssh_settings(server, tmp_path)).upload(src, "ds")
    res = SftpBackend(openssh_settings(server, tmp_path, bulk="auto")).upload(src, "ds")  # paramiko then
    same_tree(src, Path(res.remote_path))


def test_batch_safe_paths() -> None:
    assert batch_safe("videos/chunk-000/observation.images.top/episode_000000.mp4")
    for bad in ("a b", 'a"b', "a\\b", "a*b", "a?b", "a[1]", "a\nb", "a'b"):
        assert not batch_safe(bad), bad


def test_nothing_for_the_client_stops_it(tmp_path: Path, server: SshServer) -> None:
    """Only an unsafe name and an in-memory manifest: paramiko sends all, the early client is stopped."""
    src = tmp_path / "src"
    write_tree(src, {"a b.bin": 3000})  # no manifest on disk: it is built and sent from memory
    res = SftpBackend(openssh_settings(server, tmp_path)).upload(src, "ds")
    assert _sftp_children() == []
    assert res.sent_bytes == res.bytes and res.verified == "sha256"
    assert (Path(res.remote_path) / "a b.bin").read_bytes() == (src / "a b.bin").read_bytes()


def test_a_host_key_mismatch_refuses_the_bulk_upload(tmp_path: Path, server: SshServer) -> None:
    """known_hosts pins another (real) key for the server: nothing is sent, no client is left."""
    other_key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    pub = " ".join(Path(f"{other_key}.pub").read_text().split()[:2])
    other = tmp_path / "other_known_hosts"
    other.write_text(f"[127.0.0.1]:{server.port} {pub}\n")
    settings = dataclasses.replace(openssh_settings(server, tmp_path), known_hosts=str(other))
    src = make_subset(tmp_path / "src", {"a.bin": 2 * MB, "b.bin": 5000})
    with pytest.raises(UploadError, match="does not match") as info:
        SftpBackend(settings).upload(src, "ds")
    assert "refused" in str(info.value) and "nothing was published" in str(info.value)
    root = remote_root(tmp_path)
    assert not root.exists() or list(root.iterdir()) == []  # not even a staging directory
    assert _sftp_children() == []
    assert other.read_text() == f"[127.0.0.1]:{server.port} {pub}\n"  # never written back


def _logins(server: SshServer) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey")


def test_two_streams_share_the_bytes(tmp_path: Path, server: SshServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_openssh, "STREAM_MIN_BYTES", 1)  # this small tree gets two clients too
    files = {"videos/a.mp4": 3 * MB, "videos/b.mp4": 2 * MB + 7, "data/c.parquet": 300_000,
             "meta/info.json": 700, "meta/more.json": 9}
    src = make_subset(tmp_path / "src", files)
    before = _logins(server)
    res = SftpBackend(openssh_settings(server, tmp_path)).upload(src, "ds")
    assert _logins(server) - before == 3  # paramiko's control connection and two clients
    same_tree(src, Path(res.remote_path))
    assert res.verified == "sha256" and res.sent_bytes == subset_bytes(src)
    assert _sftp_children() == []


def test_two_streams_broken_at_the_server_resume(tmp_path: Path, server: SshServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both clients' servers stop at 2 MiB of a file; the next upload sends every byte once."""
    monkeypatch.setattr(bulk_openssh, "STREAM_MIN_BYTES", 1)
    src = make_subset(tmp_path / "src", {"a_big.bin": 3 * MB, "b_big.bin": 3 * MB})
    settings = openssh_settings(server, tmp_path, max_attempts=1)
    error = _break_off(server, settings, src, 2 * MB)
    assert "OpenSSH's sftp client failed" in error
    assert published(remote_root(tmp_path)) == [] and _sftp_children() == []
    res = SftpBackend(settings).upload(src, "ds")
    # the file whose server died holds exactly 2 MiB, an intact prefix: continued, not re-sent
    assert res.skipped_bytes >= 2 * MB
    assert res.sent_bytes + res.skipped_bytes == subset_bytes(src)
    same_tree(src, Path(res.remote_path))


def test_hash_queue_hashes_every_file_on_the_server(tmp_path: Path, server: SshServer) -> None:
    root = tmp_path / "hashed"
    root.mkdir()
    want = {}
    for i in range(40):
        data = os.urandom(1000 + 997 * i)
        (root / f"f{i:02d}.bin").write_bytes(data)
        want[f"f{i:02d}.bin"] = hashlib.sha256(data).hexdigest()
    settings = server.sftp_settings(str(tmp_path))
    client = connect(settings)
    try:
        sftp = open_sftp(client, settings.transfer_timeout_s)
        hasher = RemoteHasher(client, sftp, settings.transfer_timeout_s)
        hasher.start()
        queue = HashQueue(hasher, str(root))
        for rel in [*want, "missing.bin"]:
            queue.add(rel, 1)
        got = queue.finish()
        hasher.close()
    finally:
        client.close()
    assert hasher.kind in ("openssl", "sha256sum")
    assert got == want  # every file, and nothing for the missing one
