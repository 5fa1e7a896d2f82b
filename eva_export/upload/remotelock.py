"""One uploader per remote version: a lock file beside the staging directory.

The local lock (runner.claim_upload) keeps two uploaders of one export on one machine apart.
This one covers the remote: ``.<name>.uploading-<digest>`` beside the staging directory
``.<name>.staging-<digest>`` is created exclusively (SFTP's EXCL open) and
names the host and process holding it. A lock of this host is taken over: the local lock
proves that no other uploader of this export runs here, so it was left by a killed or failed
attempt. A lock of another host refuses the upload before anything is sent or removed, naming
the holder. Publication removes the lock, so the published tree never holds it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

import paramiko

from .. import jsonbound
from .job import PermanentError

LOCK_MARK = ".uploading-"  # in place of the staging directory's ".staging-"
MAX_LOCK_BYTES = 4096  # a lock file is one short JSON object; a bigger one is not ours


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    since: float

    def to_bytes(self) -> bytes:
        return json.dumps({"host": self.host, "pid": self.pid, "since": self.since}).encode()

    @classmethod
    def parse(cls, data: bytes) -> LockHolder | None:
        """The holder a lock file names; None when it names none (damaged or foreign)."""
        try:  # the exact types (a pid is an integer, not "123" or true): anything else is not ours
            d = jsonbound.as_dict(jsonbound.loads(jsonbound.decode(data)), "a lock file")
            since = d["since"]
            if isinstance(since, bool) or not isinstance(since, (int, float)):
                return None
            return cls(jsonbound.as_str(d["host"], "host", 255), jsonbound.as_int(d["pid"], "pid", 0), float(since))
        except (ValueError, KeyError):
            return None

    @classmethod
    def me(cls) -> LockHolder:
        return cls(socket.gethostname(), os.getpid(), time.time())


def lock_path(staging: str) -> str:
    head, _, digest = staging.rpartition(".staging-")
    return f"{head}{LOCK_MARK}{digest}"


def _read(sftp: paramiko.SFTPClient, path: str) -> bytes:
    with sftp.open(path, "rb") as fh:
        return bytes(fh.read(MAX_LOCK_BYTES))


def acquire(sftp: paramiko.SFTPClient, staging: str) -> str:
    """Hold the lock of ``staging``; return a note when a lock left on this host was taken over.

    Raises PermanentError when another host holds it (nothing sent, nothing removed).
    """
    path = lock_path(staging)
    me = LockHolder.me()
    try:
        with sftp.open(path, "wbx") as fh:  # EXCL: exactly one creator wins
            fh.write(me.to_bytes())
        return ""
    except OSError:
        try:
            holder = LockHolder.parse(_read(sftp, path))
        except FileNotFoundError:
            raise  # the create failed for another reason than an existing lock
    if holder is not None and holder.host != me.host:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.since))
        raise PermanentError(f"{path}: host {holder.host} (process {holder.pid}) has been uploading this "
                             f"version since {since}; nothing was sent. Remove {path} on the server when "
                             "that upload is gone for good")
    with sftp.open(path, "wb") as fh:
        fh.write(me.to_bytes())
    if holder is None or holder.pid == me.pid:
        return ""
    return f"took over {path}, left by process {holder.pid} of this host (killed or failed)"


def release(sftp: paramiko.SFTPClient, staging: str) -> None:
    try:
        sftp.remove(lock_path(staging))
    except FileNotFoundError:
        pass
