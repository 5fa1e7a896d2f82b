"""The bulk bytes of an upload handed to OpenSSH's ``sftp -b`` client (``bulk: openssh|auto``).

paramiko's Python packet loop costs about twice the CPU per GiB of OpenSSH's C client, and
on a robot's few cores that is the upload's speed limit. So, where the client is installed,
the files of a plan are sent by one ``sftp -b`` process per attempt while paramiko keeps the
control: it connects first (host key, key, staging, the resume plan) and afterwards
verifies every size and SHA-256 and publishes by one rename, exactly as in paramiko mode.

The client runs under the same policy: ``StrictHostKeyChecking=yes`` against the configured
known_hosts only (never written: ``UpdateHostKeys=no``), the configured key only
(``IdentitiesOnly``, no agent, no ~/.ssh/config: ``-F /dev/null``), AES-GCM preferred. A
file whose remote prefix the plan proved intact is continued with ``reput``; any other is
sent with ``put`` (which truncates a corrupt copy). The bandwidth cap becomes ``-l`` (Kbit/s).
Progress is reported per file: the client echoes each batch command as it starts it, so
the echo of one command means the one before it is complete. The client is started right
after paramiko's connect (batch on stdin), so its handshake overlaps the resume plan.

Files whose path could be misread by the batch parser (quotes, spaces, glob characters) or
that exist only in memory (a manifest built for an older export) go through paramiko.
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..config import SftpSettings
from ..errors import UploadError
from .connection import PREFERRED_CIPHERS, user_of
from .job import PermanentError, UploadFile, UploadJob
from .remote import RemoteHasher
from .transfer import SMALL_FILE, Plan

# Paths the batch parser takes literally inside double quotes: no quote, backslash, glob
# character, whitespace or control character.
_SAFE = re.compile(r"[A-Za-z0-9._/+=,@%:~-]+\Z")
POLL_S = 0.5  # progress (and so cancellation) is checked at least this often
STDERR_MAX = 2000  # characters of the client's stderr kept in an error


def batch_safe(path: str) -> bool:
    return bool(_SAFE.match(path)) and "\n" not in path


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

    def split(self, job: UploadJob, items: Plan) -> tuple[Plan, Plan]:
        """(files for the client, files for paramiko)."""
        if not batch_safe(job.staging):
            return [], items
        mine = [p for p in items if p[0].path is not None and batch_safe(p[0].rel)
                and not p[0].rel.startswith("-")]
        return mine, [p for p in items if p not in mine]

    def command(self, batch: str) -> list[str]:
        s = self.settings
        host = f"[{s.host}]" if ":" in s.host else s.host
        # not -q: it hides ssh's own reasons ("Host key verification failed") from the error;
        # the progress meter is off anyway (stdout is not a terminal)
        cmd = [self.executable, "-b", batch, "-o", "LogLevel=ERROR", "-F", "/dev/null", "-P", str(s.port), "-i", s.identity_file,
               "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={s.known_hosts}",
               "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no",
               "-o", f"Ciphers=^{PREFERRED_CIPHERS[0]}",
               "-o", f"ConnectTimeout={max(1, math.ceil(s.connect_timeout_s))}",
               # a frozen server ends the client after about transfer_timeout_s, as in paramiko mode
               "-o", f"ServerAliveInterval={max(1, math.ceil(s.transfer_timeout_s / 3))}",
               "-o", "ServerAliveCountMax=3"]
        if s.bandwidth_limit_bps:
            cmd += ["-l", str(max(1, s.bandwidth_limit_bps * 8 // 1000))]
        return [*cmd, f"{user_of(s)}@{host}"]

    def redact(self, text: str) -> str:
        s = self.settings
        for who in (f"{user_of(s)}@[{s.host}]", f"{user_of(s)}@{s.host}"):
            text = text.replace(who, "<user>@<host>")
        return text


class ClientRun:
    """One ``sftp -b -`` process of an attempt, started right after paramiko's connect so that
    its SSH handshake overlaps the resume plan; the batch is written once the plan is known."""

    def __init__(self, bulk: OpensshBulk, cwd: Path) -> None:
        self.bulk = bulk
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        try:
            self.proc = subprocess.Popen(bulk.command("-"), cwd=cwd, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._err, env=env)
        except BaseException:
            self._err.close()
            raise

    def close(self) -> None:
        """Stop the client if it still runs (nothing to send, or the attempt failed)."""
        proc = self.proc
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._err.close()

    def send(self, job: UploadJob, items: Plan, hasher: RemoteHasher) -> None:
        """Send ``items`` (resuming where the plan says); raise UploadError when the client fails."""
        lines = "".join(f'{"reput" if off else "put"} "./{f.rel}" "{posixpath.join(job.staging, f.rel)}"\n'
                        for f, off in items)
        for f, _off in items:
            job.verified_remote.discard(f.rel)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(lines.encode("utf-8"))
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # the client is gone already: its exit code and stderr say why
        with ThreadPoolExecutor(1, thread_name_prefix="upload-hash") as pool:
            rc, done = self._follow(job, items, lambda f: _hash_later(job, f, hasher, pool))
        if rc != 0:
            self._err.seek(0)
            text = self.bulk.redact(self._err.read().decode(errors="replace").strip())[-STDERR_MAX:]
            at = items[done][0].rel if done < len(items) else "the end"
            raise UploadError(f"OpenSSH's sftp client failed (exit {rc}) at {at}: {text or 'no message'}")

    def _follow(self, job: UploadJob, items: Plan, on_file: Callable[[UploadFile], None]) -> tuple[int, int]:
        """Follow the client's echo until it exits; return (exit code, files known complete)."""
        out = self.proc.stdout
        assert out is not None
        done = started = 0
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            while True:
                if sel.select(POLL_S):
                    data = os.read(out.fileno(), 65536)
                    if not data:
                        break
                    buf += data
                    started += buf.count(b"\n")
                    buf = buf[buf.rfind(b"\n") + 1:]
                while done < started - 1:  # the echo of command k+1: command k is complete
                    _complete(job, items[done], on_file)
                    done += 1
                job.report()  # raises UploadCancelled when the caller stops the upload
        rc = self.proc.wait()
        if rc == 0:
            while done < len(items):
                _complete(job, items[done], on_file)
                done += 1
        return rc, done


def _hash_later(job: UploadJob, f: UploadFile, hasher: RemoteHasher, pool: ThreadPoolExecutor) -> None:
    if f.size >= SMALL_FILE:  # hashed on the server while the client sends the next files
        job.hashes[f.rel] = pool.submit(hasher.hash_files, job.staging, [f.rel], f.size, False)


def _complete(job: UploadJob, item: tuple[UploadFile, int], on_file: Callable[[UploadFile], None]) -> None:
    f, off = item
    with job.lock:
        job.sent_bytes += f.size - off
    job.file_done(f, off)
    on_file(f)
