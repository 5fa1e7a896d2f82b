"""The SFTP upload backend (collection.storage.sftp; registered in backends.py).

The SFTP backend uploads a subset described by its content manifest (meta/manifest.json,
see eva_export/manifest.py) into a hidden staging directory next to the target,
``<remote_dir>/.<name>.staging-<first 16 hex of the manifest's SHA-256>``, so the same
version of an export always stages into the same directory and a broken upload resumes:

* files already complete on the server (size and SHA-256 match) are skipped;
* a partial file continues from its remote size once the remote prefix's hash matches the
  local prefix (else it is sent again from the start);
* before publication every remote file's size, and its SHA-256 where the server can compute
  it (see remote.py), must match the manifest, which is uploaded too;
* publication is one remote rename to ``<remote_dir>/<name>``. An existing target is never
  replaced: the upload is published as ``<name>_<YYYYmmddTHHMMSS>`` (``_2``, ``_3``...).

Connection failures and timeouts are retried (``max_attempts``, exponential backoff from
``retry_backoff_s``), each attempt on a fresh connection. When the attempts run out, or the
upload is cancelled, the staging directory stays for the next upload of the same export to
resume; staging directories of other versions of the export (or of older client versions)
are removed by the next upload, and the result's notes say so. A permanent failure
(host key, authentication, permissions, a local file that changed) removes the staging
directory (best effort). Nothing is ever published partially.

The bytes go over OpenSSH's ``sftp -b`` client (bulk_openssh.py) with ``bulk: auto`` (the
default) where it is installed and with ``bulk: openssh``, else over paramiko
(transfer.py: small files over ``parallel_files`` channels at once, large ones
pipelined); either way paramiko does the control, the verification and the rename.
``bandwidth_limit_bps`` caps the bytes written per second (limiter.py; ``-l`` for the
OpenSSH client).

The rooms: job.py (an upload's files, state, result, errors), connection.py (the SSH
connection), transfer.py (resume plan and paramiko's sending), bulk_openssh.py,
remotefs.py (inventory, publish, rmtree), remote.py (remote SHA-256).
"""

from __future__ import annotations

import posixpath
import time
from pathlib import Path

import paramiko

from ..config import SftpSettings, StorageSection, parse_sftp
from ..errors import UploadError
from ..manifest import MANIFEST_FILE, ManifestEntry, manifest_digest, sha256_file
from . import connection, remotefs, remotelock, transfer
from .bulk_openssh import ClientRun, OpensshBulk, find_client, streams_for
from .connection import PREFERRED_CIPHERS, describe_error
from .job import (
    STAGING_MARK,
    AttemptFn,
    PermanentError,
    ProgressFn,
    UploadBackend,
    UploadCancelled,
    UploadFile,
    UploadJob,
    UploadResult,
    directories,
    load_manifest,
    staging_name,
)
from .limiter import RateLimiter
from .remote import RemoteHasher
from .transfer import Plan

__all__ = [
    "PREFERRED_CIPHERS",
    "AttemptFn",
    "ProgressFn",
    "SftpBackend",
    "UploadBackend",
    "UploadCancelled",
    "UploadResult",
    "from_section",
    "load_manifest",
    "staging_name",
]


class SftpBackend:
    """Upload over SFTP with pinned host keys and a key file; see the module docstring."""

    def __init__(self, settings: SftpSettings) -> None:
        settings.check()
        self.settings = settings
        self.last_limiter: RateLimiter | None = None
        self.last_job: UploadJob | None = None
        self._no_exec = False  # learnt from the server: it runs no commands (read back instead)

    def describe(self) -> str:
        s = self.settings
        return f"sftp://{s.user + '@' if s.user else ''}{s.host}:{s.port}{s.remote_dir}"

    # -- connection -------------------------------------------------------------------

    def connect(self) -> paramiko.SSHClient:
        """An authenticated SSH client; the server's key must be in known_hosts."""
        return connection.connect(self.settings)

    def _open_sftp(self, client: paramiko.SSHClient) -> paramiko.SFTPClient:
        return connection.open_sftp(client, self.settings.transfer_timeout_s)

    def _send(self, job: UploadJob, client: paramiko.SSHClient, sftp: paramiko.SFTPClient, items: Plan,
              hasher: RemoteHasher, run: ClientRun | None) -> None:
        """The bulk bytes: OpenSSH's client where configured, paramiko for the rest."""
        rest = items
        if run is not None:
            mine, rest = run.split(job, items)
            if mine:
                run.send(job, mine, hasher)
        if rest:
            transfer.send_all(job, client, sftp, rest, hasher, self.settings.parallel_files,
                              self.settings.transfer_timeout_s)

    # -- upload -----------------------------------------------------------------------

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise UploadError(f"{local_dir} is not a directory")
        if not name or "/" in name or name.startswith(".") or name in ("..",):
            raise UploadError(f"remote name {name!r} is not a plain directory name")
        manifest, manifest_bytes, _built = load_manifest(local_dir)
        files = [UploadFile(e, local_dir / e.path) for e in manifest.files]
        files.append(UploadFile(ManifestEntry(MANIFEST_FILE, len(manifest_bytes),
                                              manifest_digest(manifest_bytes)), None, manifest_bytes))
        s = self.settings
        try:
            bulk_exe = find_client(s.bulk)  # None: paramiko sends the bytes too
        except PermanentError as exc:
            raise UploadError(f"upload to {self.describe()} failed: {exc}; nothing was published") from exc
        job = UploadJob(local_dir=local_dir, name=name, manifest=manifest, files=files,
                        staging=posixpath.join(s.remote_dir, staging_name(name, manifest_digest(manifest_bytes))),
                        progress=progress or (lambda *_: None),
                        limiter=RateLimiter(s.bandwidth_limit_bps) if s.bandwidth_limit_bps else None,
                        bulk_exe=bulk_exe)
        self.last_limiter = job.limiter  # its accounting shows the cap held (tests, benchmark)
        self.last_job = job  # bytes sent etc. of the last upload, also a failed one
        job.report()
        last_error = ""
        while True:
            job.attempt += 1
            if on_attempt is not None:
                on_attempt(job.attempt, last_error)
            try:
                return self._attempt(job)
            except UploadCancelled as exc:
                raise UploadCancelled(self._kept(job, str(exc))) from exc
            except PermanentError as exc:
                raise UploadError(self._cleanup_after(job, str(exc))) from exc
            except UploadError as exc:
                last_error = str(exc)
            if job.attempt >= s.max_attempts:
                raise UploadError(self._kept(job, f"{last_error} (a transient error: attempt {job.attempt} of "
                                                  f"{s.max_attempts}, giving up)"))
            delay = min(s.retry_backoff_max_s, s.retry_backoff_s * 2 ** (job.attempt - 1))
            deadline = time.monotonic() + delay
            try:
                while time.monotonic() < deadline:  # the progress callback may cancel meanwhile
                    job.report()
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            except UploadCancelled as exc:
                raise UploadCancelled(self._kept(job, f"{exc} (after: {last_error})")) from exc

    def _kept(self, job: UploadJob, reason: str) -> str:
        msg = f"upload to {self.describe()} failed: {reason}; nothing was published"
        if job.staging_ours:
            msg += (f"; the staging directory {job.staging} is kept: the next upload of this export "
                    "resumes from it")
        return msg

    def _cleanup_after(self, job: UploadJob, reason: str) -> str:
        """A permanent failure: remove the staging directory (best effort), return the message."""
        msg = f"upload to {self.describe()} failed: {reason} (a permanent error: not retried)"
        if not job.staging_ours:
            return msg + "; nothing was published"
        cleaned = False
        try:
            client = self.connect()
        except UploadError:
            client = None
        if client is not None:
            try:
                sftp = self._open_sftp(client)
                cleaned = remotefs.try_rmtree(sftp, job.staging)
                cleaned = remotefs.try_rmtree(sftp, remotelock.lock_path(job.staging)) and cleaned
            except (OSError, EOFError, paramiko.SSHException):
                cleaned = False
            finally:
                client.close()
        if cleaned:
            return msg + "; the staging directory was removed and nothing was published"
        return msg + f"; nothing was published, but the staging directory {job.staging} could not be removed"

    def _attempt(self, job: UploadJob) -> UploadResult:
        """One connection's worth of work; raises UploadError (retryable) or PermanentError."""
        run = self._start_client(job)
        client = self._connect_or_stop(run)
        phase = "opening the SFTP session"
        hasher: RemoteHasher | None = None
        sftp: paramiko.SFTPClient | None = None
        try:
            sftp = self._open_sftp(client)
            # the server-side hash shell starts now: its start-up overlaps what follows
            hasher = RemoteHasher(client, sftp, self.settings.transfer_timeout_s, allow_exec=not self._no_exec)
            hasher.start_in_background()
            remote_dir = self.settings.remote_dir
            if job.publishing:
                phase = "checking an earlier publication"
                found = remotefs.find_published(sftp, remote_dir, job)
                if found is not None:
                    remotelock.release(sftp, job.staging)
                    return self._result(job, found, posixpath.basename(found) != job.name)
            phase = f"checking {remote_dir}"
            remotefs.check_remote_dir(sftp, remote_dir, self.settings.create_remote_dir)
            phase = f"locking {remotelock.lock_path(job.staging)}"
            note = remotelock.acquire(sftp, job.staging)
            if note:
                job.notes.append(note)
            phase = "looking for earlier staging directories"
            self._leftovers(sftp, job)
            phase = f"creating the staging directory {job.staging} and its directories"
            remote_files = self._staging(sftp, job)
            phase = "checking what the server already has"
            plan = transfer.plan(job, sftp, hasher, remote_files)
            phase = "uploading" + (" with OpenSSH's sftp client" if job.bulk_exe else "")
            self._send(job, client, sftp, plan, hasher, run)
            phase = "verifying the uploaded files"
            self._verify(job, sftp, hasher, {f.rel for f, _off in plan})
            phase = "publishing"
            job.publishing = True
            target, taken = remotefs.publish(sftp, job.staging, remote_dir, job.name)
            job.publishing = False
            remotelock.release(sftp, job.staging)
            return self._result(job, target, taken)
        except UploadError as exc:
            if isinstance(exc, (PermanentError, UploadCancelled)):
                raise
            raise self._disk_full(job, sftp, phase) or UploadError(f"while {phase}: {exc}") from exc
        except PermissionError as exc:
            raise PermanentError(f"while {phase}: permission denied on the server ({exc})") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._disk_full(job, sftp, phase) or UploadError(f"while {phase}: {describe_error(exc)}") from exc
        finally:
            if run is not None:
                run.close()
            if hasher is not None:
                self._no_exec = self._no_exec or hasher.kind == "readback"
                hasher.close()
            client.close()

    def _disk_full(self, job: UploadJob, sftp: paramiko.SFTPClient | None, phase: str) -> PermanentError | None:
        """A failed write on a server whose disk has less room than the rest of the upload is
        permanent: SFTP reports ENOSPC as a bare "Failure", so the server is asked its free space."""
        if sftp is None:
            return None
        free = remotefs.free_space(sftp, job.staging)
        with job.lock:
            need = job.total_bytes - job.done_bytes - sum(job.inflight.values())
        if free is None or free >= max(need, 1):
            return None
        return PermanentError(f"while {phase}: the server's disk is full: {free} bytes free under "
                              f"{self.settings.remote_dir}, {need} more needed")

    def _start_client(self, job: UploadJob) -> ClientRun | None:
        """OpenSSH's client for the bulk bytes, started before paramiko connects: its handshake
        overlaps paramiko's. It checks the same pinned host key and is told nothing (no batch)
        before paramiko's own check passed and the remote lock is held."""
        if job.bulk_exe is None:
            return None
        try:
            return ClientRun(OpensshBulk(self.settings, job.bulk_exe), job.local_dir,
                             streams_for(self.settings, job.total_bytes))
        except OSError as exc:  # its temporary directory
            raise UploadError(f"while starting OpenSSH's sftp client: {describe_error(exc)}") from exc

    def _connect_or_stop(self, run: ClientRun | None) -> paramiko.SSHClient:
        try:
            return self.connect()
        except BaseException:
            if run is not None:  # paramiko refused (host key, key) or failed: so does the attempt
                run.close()
            raise

    @staticmethod
    def _staging(sftp: paramiko.SFTPClient, job: UploadJob) -> dict[str, int]:
        """Create (or adopt) the staging directory and its directories; return its files' sizes."""
        if not remotefs.exists(sftp, job.staging):
            sftp.mkdir(job.staging)
        job.staging_ours = True
        remote_files, remote_dirs = remotefs.inventory(sftp, job.staging)
        for rel in directories(job):
            if rel not in remote_dirs:
                sftp.mkdir(posixpath.join(job.staging, rel))
        return remote_files

    def _result(self, job: UploadJob, target: str, taken: bool) -> UploadResult:
        return UploadResult(target, len(job.files), job.total_bytes, taken, attempts=job.attempt,
                            sent_bytes=job.sent_bytes, skipped_bytes=job.skipped_bytes,
                            verified=job.verified_kind, notes=tuple(job.notes))

    def _leftovers(self, sftp: paramiko.SFTPClient, job: UploadJob) -> None:
        """Remove staging directories of other versions of this export; adopt our own."""
        prefixes = (f".{job.name}{STAGING_MARK}", f".{job.name}{remotelock.LOCK_MARK}")
        ours = (posixpath.basename(job.staging), posixpath.basename(remotelock.lock_path(job.staging)))
        for entry in sftp.listdir_attr(self.settings.remote_dir):
            fname = entry.filename
            if not fname.startswith(prefixes) or fname in ours:
                continue
            path = posixpath.join(self.settings.remote_dir, fname)
            if remotefs.try_rmtree(sftp, path):
                job.notes.append(f"removed {path}, left by an earlier upload of another version of this export")
            else:
                job.notes.append(f"could not remove {path}, left by an earlier upload of this export")
        if not job.staging_ours and remotefs.exists(sftp, job.staging):
            job.notes.append(f"resumed into {job.staging}, left by an earlier upload of this export")

    def _verify(self, job: UploadJob, sftp: paramiko.SFTPClient, hasher: RemoteHasher, sent: set[str]) -> None:
        """Every remote file's SHA-256 (where computed remotely, else its size) against the manifest."""
        if not hasher.remote:
            self._check_sizes(job, sftp)
            job.verified_kind = "size"
            job.verified_remote.update(f.rel for f in job.files)
            return
        job.verified_kind = "sha256"
        todo = [f for f in job.files if f.rel not in job.verified_remote or f.rel in sent]
        got = {f.rel: job.remote_hashes[f.rel] for f in todo if f.rel in job.remote_hashes}  # hashed while sending
        job.remote_hashes.clear()
        left = [f for f in todo if f.rel not in got]
        got.update(hasher.hash_files(job.staging, [f.rel for f in left], sum(f.size for f in left)))
        bad = [f for f in todo if got.get(f.rel) != f.entry.sha256]
        if not bad:  # equal digests imply equal sizes: no listing needed
            job.verified_remote.update(f.rel for f in todo)
            return
        self._check_sizes(job, sftp)  # a missing or short file is named as such
        job.verified_remote.update(f.rel for f in todo if f not in bad)
        f = bad[0]
        if f.path is not None and sha256_file(f.path) != f.entry.sha256:
            raise PermanentError(f"local {f.path} does not match its manifest entry (changed after the "
                                 "export?): export again")
        # the next attempt sends it again: its remote copy is not the manifest's content
        sftp.remove(posixpath.join(job.staging, f.rel))
        raise UploadError(f"remote {job.staging}/{f.rel} has SHA-256 {got.get(f.rel)}, the manifest says "
                          f"{f.entry.sha256}: removed, to be sent again")

    @staticmethod
    def _check_sizes(job: UploadJob, sftp: paramiko.SFTPClient) -> None:
        remote_files, _dirs = remotefs.inventory(sftp, job.staging)
        for f in job.files:
            have = remote_files.get(f.rel)
            if have != f.size:
                raise UploadError(f"remote {job.staging}/{f.rel} has {have} bytes after the upload, "
                                  f"the manifest says {f.size}")


def from_section(section: StorageSection) -> SftpBackend:
    """The SFTP backend of collection.storage.sftp (registered in backends.py)."""
    return SftpBackend(parse_sftp(section.values))
