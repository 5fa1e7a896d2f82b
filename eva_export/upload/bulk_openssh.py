"""The bulk bytes of an upload handed to OpenSSH's ``sftp -b`` client (``bulk: openssh|auto``).

paramiko's Python packet loop costs about twice the CPU per GiB of OpenSSH's C client, and
on a robot's few cores that is the upload's speed limit. So, where the client is installed,
the files of a plan are sent by ``sftp -b`` clients (one batch each for all their files,
no process per file; two clients, two connections, for an upload of ``STREAM_MIN_BYTES``
or more without a bandwidth cap, the files balanced by bytes: on two shared cores one
stream's four processes leave CPU idle between them, and two took 0.91-1.10x of a single
``sftp -b`` against 0.86-0.92x for one) while paramiko keeps the control: staging, the resume plan,
the SHA-256 of every file on the server and the publication by one rename, exactly as in
paramiko mode. The server hashes each file, in batches, while the client sends the next
ones (remote.HashQueue), so what is left after the last byte is one short request.

The client runs under the same policy: ``StrictHostKeyChecking=yes`` against the configured
known_hosts only (never written: ``UpdateHostKeys=no``), the configured key only
(``IdentitiesOnly``, no agent, no ~/.ssh/config: ``-F /dev/null``), AES-GCM preferred. A
file whose remote prefix the plan proved intact is continued with ``reput``; any other is
sent with ``put`` (which truncates a corrupt copy). The bandwidth cap becomes ``-l`` (units of
1024 bit/s, rounded down: never above the cap), with one client.
Progress is reported per file: the client echoes each batch command as it starts it, so
the echo of one command means the one before it is complete. The client is started with
paramiko's connect (batch on stdin, written once the plan is known), so its handshake
overlaps paramiko's and the resume plan: both connections check the pinned host key, and
the client learns no file or directory name before paramiko's own check passed and the
remote lock is held. Large files go first, so the hashing of the last ones to arrive is short.

Files whose remote path could be misread by the batch parser (quotes, spaces, glob
characters) go through paramiko; the manifest, held in memory, is written to a private
temporary file for the client.
"""

from __future__ import annotations

import contextlib
import math
import os
import posixpath
import re
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..config import SftpSettings
from ..errors import UploadError
from ..manifest import MANIFEST_FILE
from .connection import PREFERRED_CIPHERS, user_of
from .job import PermanentError, UploadFile, UploadJob
from .remote import HashQueue, RemoteHasher
from .transfer import SMALL_FILE, Plan

# Paths the batch parser takes literally inside double quotes: no quote, backslash, glob
# character, whitespace or control character.
_SAFE = re.compile(r"[A-Za-z0-9._/+=,@%:~-]+\Z")
POLL_S = 0.5  # progress (and so cancellation) is checked at least this often
STDERR_MAX = 2000  # characters of the client's stderr kept in an error
STREAMS = 2  # client processes (connections) of a large upload
STREAM_MIN_BYTES = 64 << 20  # below this a second handshake costs more than it gains


def batch_safe(path: str) -> bool:
    return bool(_SAFE.match(path)) and "\n" not in path


def streams_for(settings: SftpSettings, total_bytes: int) -> int:
    """How many clients share an upload: one under a bandwidth cap (``-l`` is per client) or
    for a small upload, else ``STREAMS``."""
    if settings.bandwidth_limit_bps or total_bytes < STREAM_MIN_BYTES:
        return 1
    return STREAMS


def find_client(mode: str) -> str | None:
    """The ``sftp`` executable for ``bulk`` mode ``mode``; None: paramiko sends the bytes."""
    if mode == "paramiko":
        return None
    exe = shutil.which("sftp")
    if exe is None and mode == "openssh":
        raise PermanentError("collection.storage.sftp.bulk is 'openssh' but OpenSSH's sftp client is not "
                             "installed (Debian: openssh-client); install it or set bulk: auto or paramiko")
    return exe


@dataclass(frozen=True)
class OpensshBulk:
    """Sends the files of a plan with one ``sftp -b`` process."""

    settings: SftpSettings
    executable: str

    def command(self, batch: str) -> list[str]:
        s = self.settings
        host = f"[{s.host}]" if ":" in s.host else s.host
        # not -q: it hides ssh's own reasons ("Host key verification failed") from the error;
        # the progress meter is off anyway (stdout is not a terminal)
        # LogLevel INFO (ssh's default): it is the level of "Timeout, server ... not responding"
        cmd = [self.executable, "-b", batch, "-o", "LogLevel=INFO", "-F", "/dev/null", "-P", str(s.port), "-i", s.identity_file,
               "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={s.known_hosts}",
               "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no",
               "-o", f"Ciphers=^{PREFERRED_CIPHERS[0]}",
               "-o", f"ConnectTimeout={max(1, math.ceil(s.connect_timeout_s))}",
               # a frozen server ends the client after about transfer_timeout_s, as in paramiko mode
               "-o", f"ServerAliveInterval={max(1, math.ceil(s.transfer_timeout_s / 3))}",
               "-o", "ServerAliveCountMax=3"]
        if s.bandwidth_limit_bps:  # -l N is N * 1024 bit/s (sftp.c: limit_kbps *= 1024): 128 bytes/s
            cmd += ["-l", str(max(1, s.bandwidth_limit_bps // 128))]
        return [*cmd, f"{user_of(s)}@{host}"]

    def redact(self, text: str) -> str:
        s = self.settings
        for who in (f"{user_of(s)}@[{s.host}]", f"{user_of(s)}@{s.host}"):
            text = text.replace(who, "<user>@<host>")
        return text


@dataclass
class _Stream:
    """One client process and the files of its batch, in batch order."""

    proc: subprocess.Popen[bytes]
    err: IO[bytes]
    items: Plan = field(default_factory=list)
    done: int = 0  # files known complete
    started: int = 0  # batch commands echoed
    buf: bytes = b""
    rc: int | None = None


def balance(items: Plan, n: int) -> list[Plan]:
    """``items`` over ``n`` batches of about equal bytes; in each, large files first, the
    manifest last (the hashing of the last files to arrive is then short)."""
    groups: list[Plan] = [[] for _ in range(n)]
    load = [0] * n
    for item in sorted(items, key=lambda p: -(p[0].size - p[1])):
        i = load.index(min(load))
        groups[i].append(item)
        load[i] += item[0].size - item[1]
    for g in groups:
        g.sort(key=lambda p: (p[0].rel == MANIFEST_FILE, p[0].size < SMALL_FILE, p[0].rel))
    return groups


class ClientRun:
    """The ``sftp -b -`` processes of an attempt, started before paramiko connects so that their
    SSH handshakes overlap paramiko's and the resume plan; the batches are written once the
    plan is known. ``streams`` processes (connections) share the bytes: on a small machine
    one stream's four processes (sftp, ssh, sshd, sftp-server) leave CPU unused between them."""

    def __init__(self, bulk: OpensshBulk, cwd: Path, streams: int = 1) -> None:
        self.bulk = bulk
        self._tmp = Path(tempfile.mkdtemp(prefix="eva-upload-"))  # files held in memory, for the client
        self._streams: list[_Stream] = []
        self._spawn_error: OSError | None = None
        # spawned beside paramiko's connect: a fork and exec under load cost tens of ms each
        self._spawner = threading.Thread(target=self._spawn, args=(cwd, max(1, streams)),
                                         name="upload-sftp-spawn", daemon=True)
        self._spawner.start()

    def _spawn(self, cwd: Path, streams: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        for _ in range(streams):
            err = tempfile.TemporaryFile(dir=self._tmp)  # noqa: SIM115 - closed by close()
            try:
                proc = subprocess.Popen(self.bulk.command("-"), cwd=cwd, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err, env=env)
            except OSError as exc:
                err.close()
                self._spawn_error = exc
                return
            self._streams.append(_Stream(proc, err))

    def _spawned(self) -> None:
        self._spawner.join()
        if self._spawn_error is not None:
            raise UploadError(f"cannot start OpenSSH's sftp client: {self._spawn_error}")

    def close(self) -> None:
        """Stop the clients that still run (nothing to send, or the attempt failed)."""
        self._spawner.join()
        for st in self._streams:
            proc = st.proc
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            st.err.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def split(self, job: UploadJob, items: Plan) -> tuple[Plan, Plan]:
        """(files for the clients; files for paramiko)."""
        if not batch_safe(job.staging) or not batch_safe(str(self._tmp)):
            return [], items
        mine: Plan = []
        rest: Plan = []
        for p in items:
            (mine if batch_safe(p[0].rel) and not p[0].rel.startswith("-") else rest).append(p)
        return mine, rest

    def _source(self, f: UploadFile, index: int) -> str:
        """The local path the batch names for ``f``."""
        if f.path is not None:
            return f"./{f.rel}"
        tmp = self._tmp / f"data-{index}"
        tmp.write_bytes(f.data or b"")
        return str(tmp)

    def send(self, job: UploadJob, items: Plan, hasher: RemoteHasher) -> None:
        """Send ``items`` (resuming where the plan says); raise UploadError when a client fails."""
        self._spawned()
        for f, _off in items:
            job.verified_remote.discard(f.rel)
        index = 0
        for st, group in zip(self._streams, balance(items, len(self._streams)), strict=True):
            st.items = group
            lines = []
            for f, off in group:
                lines.append(f'{"reput" if off else "put"} "{self._source(f, index)}" '
                             f'"{posixpath.join(job.staging, f.rel)}"\n')
                index += 1
            assert st.proc.stdin is not None
            try:
                st.proc.stdin.write("".join(lines).encode("utf-8"))  # empty: the client just exits
                st.proc.stdin.close()
            except BrokenPipeError:
                pass  # the client is gone already: its exit code and stderr say why
        job.bulk_started_at = time.monotonic()
        queue = HashQueue(hasher, job.staging)
        try:
            failed = self._follow(job, lambda f: queue.add(f.rel, f.size))
            if failed is None:
                job.remote_hashes.update(queue.finish())
        finally:
            queue.close()
        if failed is not None:
            failed.err.seek(0)
            text = self.bulk.redact(failed.err.read().decode(errors="replace").strip())[-STDERR_MAX:]
            at = failed.items[failed.done][0].rel if failed.done < len(failed.items) else "the end"
            if "Timeout, server" in text:  # ServerAlive* ended it, as the channel timeout ends paramiko
                text = f"the server stopped answering (transfer timeout): {text}"
            raise UploadError(f"OpenSSH's sftp client failed (exit {failed.rc}) at {at}: {text or 'no message'}")

    def _follow(self, job: UploadJob, on_file: Callable[[UploadFile], None]) -> _Stream | None:
        """Follow the clients' echo until they exit; return the first that failed, if any."""
        with selectors.DefaultSelector() as sel:
            for each in self._streams:
                assert each.proc.stdout is not None
                sel.register(each.proc.stdout, selectors.EVENT_READ, each)
            live = len(self._streams)
            while live:
                for key, _events in sel.select(POLL_S):
                    st: _Stream = key.data
                    data = os.read(key.fd, 65536)
                    if not data:  # the client ended
                        sel.unregister(key.fileobj)
                        live -= 1
                        st.rc = st.proc.wait()
                        if st.rc != 0:
                            return st  # close() stops the others
                        st.started = len(st.items) + 1
                    else:
                        st.buf += data
                        st.started += st.buf.count(b"\n")
                        st.buf = st.buf[st.buf.rfind(b"\n") + 1:]
                    while st.done < min(st.started - 1, len(st.items)):  # the echo of command k+1: k is complete
                        _complete(job, st.items[st.done], on_file)
                        st.done += 1
                job.report()  # raises UploadCancelled when the caller stops the upload
        return None


def _complete(job: UploadJob, item: tuple[UploadFile, int], on_file: Callable[[UploadFile], None]) -> None:
    f, off = item
    with job.lock:
        job.sent_bytes += f.size - off
    job.file_done(f, off)
    on_file(f)
