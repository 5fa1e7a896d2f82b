"""collection.storage.sftp's settings: where and how the SFTP upload backend sends an export."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .errors import ConfigError

BULK_MODES = ("paramiko", "openssh", "auto")


@dataclass(frozen=True)
class SftpSettings:
    host: str
    port: int = 22
    user: str = ""
    identity_file: str = ""
    known_hosts: str = ""
    remote_dir: str = ""
    connect_timeout_s: float = 10.0
    transfer_timeout_s: float = 30.0
    # flaky links: attempts per job, exponential backoff between them
    max_attempts: int = 5
    retry_backoff_s: float = 2.0  # first wait; doubles after every failed attempt
    retry_backoff_max_s: float = 60.0
    bandwidth_limit_bps: int = 0  # bytes/s over all transfers of a job; 0: no cap
    parallel_files: int = 4  # small files (< 1 MiB) sent over this many SFTP channels at once
    # remote_dir must exist (a typo must not create a tree somewhere else); True creates it
    create_remote_dir: bool = False
    # who sends the file bytes: paramiko, OpenSSH's sftp client (half the CPU per GiB; paramiko
    # still connects, verifies, renames) or auto (OpenSSH's where installed: 1.1x sftp -b, not 0.8x)
    bulk: str = "auto"

    def check(self) -> None:
        if self.bulk not in BULK_MODES:
            raise ConfigError(f"collection.storage.sftp.bulk {self.bulk!r} must be one of {', '.join(BULK_MODES)}")
        if self.max_attempts < 1 or self.parallel_files < 1:
            raise ConfigError("collection.storage.sftp.max_attempts and parallel_files must be at least 1")
        if self.retry_backoff_s < 0 or self.retry_backoff_max_s < 0 or self.bandwidth_limit_bps < 0:
            raise ConfigError("collection.storage.sftp retry_backoff_s, retry_backoff_max_s and "
                              "bandwidth_limit_bps must not be negative")
        rd = self.remote_dir
        if not rd.startswith("/"):
            raise ConfigError(f"collection.storage.sftp.remote_dir {rd!r} must be absolute")
        if posixpath.normpath(rd) != rd or "/../" in rd + "/" or (rd.endswith("/") and rd != "/"):
            raise ConfigError(f"collection.storage.sftp.remote_dir {rd!r} must be canonical (no '..', '.', "
                              f"'//' or trailing '/'); did you mean {posixpath.normpath(rd)!r}?")
        if not self.known_hosts:
            raise ConfigError("collection.storage.sftp.known_hosts is required: host keys are verified")
