"""Permanent upload errors fail at once, transient ones are retried, and the error says which.

Against a real OpenSSH server: a missing key file and a full remote disk (a 1 MiB tmpfs as the
remote directory) are permanent; a server that is not there is transient.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from diskfull import tmpfs
from sshd import SshServer

from eva_export.errors import UploadError
from eva_export.manifest import write_manifest
from eva_export.upload import SftpBackend


def local_subset(root: Path, size: int) -> Path:
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text("{}")
    (root / "data.bin").write_bytes(os.urandom(size))
    write_manifest(root)
    return root


def upload(backend: SftpBackend, local: Path) -> tuple[str, list[int]]:
    attempts: list[int] = []
    with pytest.raises(UploadError) as info:
        backend.upload(local, "subset", on_attempt=lambda n, _err: attempts.append(n))
    return str(info.value), attempts


def test_missing_identity_file_is_permanent(tmp_path: Path, server: SshServer) -> None:
    settings = server.sftp_settings(str(tmp_path / "remote"), identity_file=str(tmp_path / "no_such_key"),
                                    max_attempts=5)
    error, attempts = upload(SftpBackend(settings), local_subset(tmp_path / "local", 1000))
    assert attempts == [1], error
    assert "no_such_key" in error and "permanent" in error and "nothing was published" in error


@pytest.mark.parametrize("bulk", ["paramiko", "openssh"])
def test_full_remote_disk_is_permanent_and_names_the_space(tmp_path: Path, server: SshServer, bulk: str) -> None:
    with tmpfs(tmp_path / "remote", 1) as remote:
        settings = server.sftp_settings(str(remote), max_attempts=5, bulk=bulk)
        error, attempts = upload(SftpBackend(settings), local_subset(tmp_path / "local", 3 << 20))
        assert attempts == [1], error
        assert "disk is full" in error and "bytes free" in error and "more needed" in error, error
        assert "permanent" in error
        assert [p.name for p in remote.iterdir() if not p.name.startswith(".")] == []  # nothing published


def test_an_absent_server_is_transient_and_retried(tmp_path: Path, server: SshServer) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = server.sftp_settings(str(tmp_path / "remote"), port=port, max_attempts=3)
    error, attempts = upload(SftpBackend(settings), local_subset(tmp_path / "local", 1000))
    assert attempts == [1, 2, 3], error
    assert "transient" in error and "attempt 3 of 3" in error
