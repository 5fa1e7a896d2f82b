"""Upload backends: a small Protocol and the SFTP backend (collection.storage.sftp).

The SFTP backend uploads a subset described by its content manifest (meta/manifest.json,
see export/manifest.py) into a hidden staging directory next to the target,
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

Small files go over ``parallel_files`` SFTP channels at once (their open/close round trips
overlap); large ones one after another with pipelined writes. ``bandwidth_limit_bps`` caps
the bytes written per second over all channels (limiter.py).
"""

from __future__ import annotations

import errno
import getpass
import json
import posixpath
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import paramiko

from ..config import SftpSettings
from ..errors import UploadError
from ..export.manifest import MANIFEST_FILE, Manifest, ManifestEntry, build_manifest, manifest_digest, sha256_file
from .limiter import RateLimiter
from .remote import RemoteHasher

#: ``progress(files_done, files_total, bytes_done, bytes_total)``
ProgressFn = Callable[[int, int, int, int], None]
#: ``on_attempt(attempt_number, error_of_the_previous_attempt)``
AttemptFn = Callable[[int, str], None]

# Client cipher preference: AES-GCM first (loopback: ~197 MB/s against ~173 with
# paramiko's default aes128-ctr + HMAC), then paramiko's own order.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")

READ_CHUNK = 1 << 20  # local read size; written as SFTP writes of one SSH packet each
PROGRESS_EVERY = 4 << 20  # report progress at least every 4 MiB and after every file
SMALL_FILE = 1 << 20  # files below this go through the parallel channels
STAGING_MARK = ".staging-"


class UploadCancelled(UploadError):
    """The caller stopped the upload (service shutdown); the staging directory is kept."""


class _Permanent(UploadError):
    """A failure that another attempt cannot fix."""


@dataclass(frozen=True)
class UploadResult:
    """What a backend published."""

    remote_path: str  # the published directory
    files: int
    bytes: int
    preferred_name_taken: bool  # True when ``remote_path`` is a timestamped copy name
    attempts: int = 1
    sent_bytes: int = 0  # file bytes written to the server over all attempts
    skipped_bytes: int = 0  # bytes found complete (or as a verified prefix) on the server
    verified: str = "sha256"  # "sha256": every remote file hashed; "size": sizes only
    notes: tuple[str, ...] = ()  # resumed / leftovers removed / corrupt copies re-sent


class UploadBackend(Protocol):
    """Publishes a local directory as ``name`` on some storage, all or nothing."""

    def describe(self) -> str:
        """Where uploads go, for messages (no secrets)."""
        ...

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        """Upload ``local_dir`` and publish it as ``name``; raise UploadError on failure."""
        ...


@dataclass(frozen=True)
class _File:
    entry: ManifestEntry
    path: Path | None  # local file; None for the manifest itself (sent from memory)
    data: bytes | None = None

    @property
    def rel(self) -> str:
        return self.entry.path

    @property
    def size(self) -> int:
        return self.entry.size


@dataclass
class _Job:
    """State of one upload across its attempts."""

    local_dir: Path
    name: str
    manifest: Manifest
    files: list[_File]  # the manifest's files, then the manifest itself
    staging: str
    progress: ProgressFn
    limiter: RateLimiter | None
    attempt: int = 0
    sent_bytes: int = 0
    skipped_bytes: int = 0  # counted on the first attempt that looked at the server
    notes: list[str] = field(default_factory=list)
    verified_remote: set[str] = field(default_factory=set)  # hashed complete on the server
    staging_ours: bool = False  # True once an attempt of this job created or adopted it
    publishing: bool = False  # the last attempt failed while renaming
    verified_kind: str = "sha256"
    lock: threading.Lock = field(default_factory=threading.Lock)
    # live progress of the current attempt
    done_files: int = 0
    done_bytes: int = 0
    inflight: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, Future[dict[str, str]]] = field(default_factory=dict)  # hashed after sending

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def report(self) -> None:
        with self.lock:
            args = (self.done_files, len(self.files), self.done_bytes + sum(self.inflight.values()),
                    self.total_bytes)
        self.progress(*args)


def load_manifest(local_dir: Path) -> tuple[Manifest, bytes, bool]:
    """The subset's manifest and its bytes; built here when the subset has none (older export).

    The third value is True when it was built (then it is uploaded from memory). A manifest
    whose file list or sizes disagree with the directory is refused: the directory changed
    after the export (the upload works from a snapshot, so this means something is wrong).
    """
    path = local_dir / MANIFEST_FILE
    if not path.is_file():
        built = build_manifest(local_dir)
        return built, built.to_bytes(), True
    try:
        data = path.read_bytes()
        manifest = Manifest.from_dict(json.loads(data))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UploadError(f"{path} is unreadable ({exc}); export again") from exc
    from ..export.manifest import scan_tree

    try:
        _dirs, files = scan_tree(local_dir)
    except (OSError, ValueError) as exc:
        raise UploadError(f"cannot list {local_dir}: {exc}") from exc
    present = {rel: p.stat().st_size for rel, p in files if rel != MANIFEST_FILE}
    listed = {e.path: e.size for e in manifest.files}
    if present != listed:
        diff = sorted(set(present.items()) ^ set(listed.items()))[:3]
        raise UploadError(f"{local_dir} does not match its {MANIFEST_FILE} (first differences: {diff}); "
                          "it changed after the export: export again")
    return manifest, data, False


def staging_name(name: str, digest: str) -> str:
    """The hidden staging directory of one version (manifest digest) of an export."""
    return f".{name}{STAGING_MARK}{digest[:16]}"


def _prefer_ciphers(sock: Any, /, **kw: Any) -> paramiko.Transport:
    t = paramiko.Transport(sock, **kw)
    opts = t.get_security_options()
    available = tuple(opts.ciphers)
    opts.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in available) + tuple(
        c for c in available if c not in PREFERRED_CIPHERS
    )
    return t


class SftpBackend:
    """Upload over SFTP with pinned host keys and a key file; see the module docstring."""

    def __init__(self, settings: SftpSettings) -> None:
        settings.check()
        self.settings = settings
        self.last_limiter: RateLimiter | None = None
        self.last_job: _Job | None = None
        self._no_exec = False  # learnt from the server: it runs no commands (read back instead)

    def describe(self) -> str:
        s = self.settings
        return f"sftp://{s.user + '@' if s.user else ''}{s.host}:{s.port}{s.remote_dir}"

    # -- connection -------------------------------------------------------------------

    def connect(self) -> paramiko.SSHClient:
        """An authenticated SSH client; the server's key must be in known_hosts."""
        s = self.settings
        if not s.identity_file:
            raise _Permanent(
                "collection.storage.sftp.identity_file is empty: uploads authenticate with a key file "
                "only (no agent, no ~/.ssh keys)"
            )
        client = paramiko.SSHClient()
        try:
            client.get_host_keys().load(s.known_hosts)  # not load_host_keys: never written back
        except OSError as exc:
            client.close()
            raise _Permanent(f"cannot read known_hosts {s.known_hosts}: {exc.strerror or exc}") from exc
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                s.host, port=s.port, username=s.user or getpass.getuser(),
                key_filename=s.identity_file, look_for_keys=False, allow_agent=False,
                timeout=s.connect_timeout_s, banner_timeout=s.connect_timeout_s,
                auth_timeout=s.connect_timeout_s, channel_timeout=s.connect_timeout_s,
                transport_factory=_prefer_ciphers,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise _Permanent(
                f"host key of {s.host}:{s.port} does not match {s.known_hosts} "
                f"(got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}); refused. "
                "If the server's key changed on purpose, update known_hosts"
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise _Permanent(
                f"{s.host}:{s.port} refused key {s.identity_file} for user "
                f"{s.user or getpass.getuser()!r}: {exc}"
            ) from exc
        except paramiko.SSHException as exc:
            client.close()
            msg = str(exc)
            if "not found in known_hosts" in msg:
                raise _Permanent(
                    f"host key of {s.host}:{s.port} is not in {s.known_hosts}; refused "
                    "(unknown hosts are never trusted: add the server's key to known_hosts)"
                ) from exc
            raise UploadError(f"SSH connection to {s.host}:{s.port} failed: {msg}") from exc
        except (OSError, EOFError) as exc:
            client.close()
            raise UploadError(f"cannot connect to {s.host}:{s.port}: {exc}") from exc
        return client

    def _open_sftp(self, client: paramiko.SSHClient) -> paramiko.SFTPClient:
        sftp = client.open_sftp()
        # Transfers have no timeout of their own: without this a frozen server hangs put().
        channel = sftp.get_channel()
        assert channel is not None
        channel.settimeout(self.settings.transfer_timeout_s)
        return sftp

    # -- upload -----------------------------------------------------------------------

    def upload(self, local_dir: Path, name: str, progress: ProgressFn | None = None,
               on_attempt: AttemptFn | None = None) -> UploadResult:
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise UploadError(f"{local_dir} is not a directory")
        if not name or "/" in name or name.startswith(".") or name in ("..",):
            raise UploadError(f"remote name {name!r} is not a plain directory name")
        manifest, manifest_bytes, _built = load_manifest(local_dir)
        files = [_File(e, local_dir / e.path) for e in manifest.files]
        files.append(_File(ManifestEntry(MANIFEST_FILE, len(manifest_bytes),
                                         manifest_digest(manifest_bytes)), None, manifest_bytes))
        s = self.settings
        job = _Job(local_dir=local_dir, name=name, manifest=manifest, files=files,
                   staging=posixpath.join(s.remote_dir, staging_name(name, manifest_digest(manifest_bytes))),
                   progress=progress or (lambda *_: None),
                   limiter=RateLimiter(s.bandwidth_limit_bps) if s.bandwidth_limit_bps else None)
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
            except _Permanent as exc:
                raise UploadError(self._cleanup_after(job, str(exc))) from exc
            except UploadError as exc:
                last_error = str(exc)
            if job.attempt >= s.max_attempts:
                raise UploadError(self._kept(job, f"{last_error} (attempt {job.attempt} of {s.max_attempts}, "
                                                  "giving up)"))
            delay = min(s.retry_backoff_max_s, s.retry_backoff_s * 2 ** (job.attempt - 1))
            deadline = time.monotonic() + delay
            try:
                while time.monotonic() < deadline:  # the progress callback may cancel meanwhile
                    job.report()
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            except UploadCancelled as exc:
                raise UploadCancelled(self._kept(job, f"{exc} (after: {last_error})")) from exc

    def _kept(self, job: _Job, reason: str) -> str:
        msg = f"upload to {self.describe()} failed: {reason}; nothing was published"
        if job.staging_ours:
            msg += (f"; the staging directory {job.staging} is kept: the next upload of this export "
                    "resumes from it")
        return msg

    def _cleanup_after(self, job: _Job, reason: str) -> str:
        """A permanent failure: remove the staging directory (best effort), return the message."""
        msg = f"upload to {self.describe()} failed: {reason}"
        if not job.staging_ours:
            return msg + "; nothing was published"
        cleaned = False
        try:
            client = self.connect()
        except UploadError:
            client = None
        if client is not None:
            try:
                cleaned = _try_rmtree(self._open_sftp(client), job.staging)
            except (OSError, EOFError, paramiko.SSHException):
                cleaned = False
            finally:
                client.close()
        if cleaned:
            return msg + "; the staging directory was removed and nothing was published"
        return msg + f"; nothing was published, but the staging directory {job.staging} could not be removed"

    def _attempt(self, job: _Job) -> UploadResult:
        """One connection's worth of work; raises UploadError (retryable) or _Permanent."""
        client = self.connect()
        phase = "opening the SFTP session"
        hasher: RemoteHasher | None = None
        try:
            sftp = self._open_sftp(client)
            # the server-side hash shell starts now: its start-up overlaps what follows
            hasher = RemoteHasher(client, sftp, self.settings.transfer_timeout_s, allow_exec=not self._no_exec)
            hasher.start()
            remote_dir = self.settings.remote_dir
            if job.publishing:
                phase = "checking an earlier publication"
                found = _find_published(sftp, remote_dir, job)
                if found is not None:
                    return self._result(job, found, posixpath.basename(found) != job.name)
            phase = f"checking {remote_dir}"
            _check_remote_dir(sftp, remote_dir, self.settings.create_remote_dir)
            phase = "looking for earlier staging directories"
            self._leftovers(sftp, job)
            phase = f"creating the staging directory {job.staging}"
            if not _exists(sftp, job.staging):
                sftp.mkdir(job.staging)
            job.staging_ours = True
            remote_files, remote_dirs = _inventory(sftp, job.staging)
            for rel in _directories(job):
                if rel not in remote_dirs:
                    phase = f"creating {job.staging}/{rel}"
                    sftp.mkdir(posixpath.join(job.staging, rel))
            phase = "checking what the server already has"
            plan = self._plan(job, sftp, hasher, remote_files)
            phase = "uploading"
            self._send_all(job, client, sftp, plan, hasher)
            phase = "verifying the uploaded files"
            self._verify(job, sftp, hasher, {f.rel for f, _off in plan})
            phase = "publishing"
            job.publishing = True
            target, taken = _publish(sftp, job.staging, remote_dir, job.name)
            job.publishing = False
            return self._result(job, target, taken)
        except UploadError as exc:
            if isinstance(exc, (_Permanent, UploadCancelled)):
                raise
            raise UploadError(f"while {phase}: {exc}") from exc
        except PermissionError as exc:
            raise _Permanent(f"while {phase}: permission denied on the server ({exc})") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise UploadError(f"while {phase}: {_describe(exc)}") from exc
        finally:
            if hasher is not None:
                self._no_exec = self._no_exec or hasher.kind == "readback"
                hasher.close()
            client.close()

    def _result(self, job: _Job, target: str, taken: bool) -> UploadResult:
        return UploadResult(target, len(job.files), job.total_bytes, taken, attempts=job.attempt,
                            sent_bytes=job.sent_bytes, skipped_bytes=job.skipped_bytes,
                            verified=job.verified_kind, notes=tuple(job.notes))

    def _leftovers(self, sftp: paramiko.SFTPClient, job: _Job) -> None:
        """Remove staging directories of other versions of this export; adopt our own."""
        prefix = f".{job.name}{STAGING_MARK}"
        ours = posixpath.basename(job.staging)
        for entry in sftp.listdir_attr(self.settings.remote_dir):
            fname = entry.filename
            if not fname.startswith(prefix) or fname == ours:
                continue
            path = posixpath.join(self.settings.remote_dir, fname)
            if _try_rmtree(sftp, path):
                job.notes.append(f"removed {path}, left by an earlier upload of another version of this export")
            else:
                job.notes.append(f"could not remove {path}, left by an earlier upload of this export")
        if not job.staging_ours and _exists(sftp, job.staging):
            job.notes.append(f"resumed into {job.staging}, left by an earlier upload of this export")

    def _plan(self, job: _Job, sftp: paramiko.SFTPClient, hasher: RemoteHasher,
              remote_files: dict[str, int]) -> list[tuple[_File, int]]:
        """Which files to send and from which offset; removes remote files not in the manifest."""
        job.hashes.clear()  # futures of a failed attempt belong to its dead connection
        wanted = {f.rel for f in job.files}
        for rel in sorted(set(remote_files) - wanted):
            sftp.remove(posixpath.join(job.staging, rel))
        check: list[_File] = []
        plan: list[tuple[_File, int]] = []
        for f in job.files:
            have = remote_files.get(f.rel)
            if have is None or have > f.size:
                plan.append((f, 0))
            elif have == f.size and f.rel in job.verified_remote:
                continue  # hashed complete by an earlier attempt of this job
            elif have == 0:
                if f.size == 0:
                    job.verified_remote.add(f.rel)
                else:
                    plan.append((f, 0))
            else:
                check.append(f)
        if check and not hasher.remote:  # size-only servers: complete sizes trusted, prefixes read back
            for f in [f for f in check if remote_files[f.rel] == f.size]:
                job.verified_remote.add(f.rel)
            check = [f for f in check if remote_files[f.rel] < f.size]
        remote_hash = hasher.hash_files(job.staging, [f.rel for f in check],
                                        sum(remote_files[f.rel] for f in check))
        skipped = 0
        for f in check:
            have = remote_files[f.rel]
            got = remote_hash.get(f.rel)
            if have == f.size:
                if got == f.entry.sha256:
                    job.verified_remote.add(f.rel)
                    skipped += have
                    continue
                job.notes.append(f"{f.rel}: the copy on the server differs from the manifest: sent again")
                plan.append((f, 0))
            else:
                local = _local_prefix_hash(f, have)
                if got is not None and got == local:
                    plan.append((f, have))
                    skipped += have
                else:
                    job.notes.append(f"{f.rel}: the partial copy on the server ({have} bytes) does not match "
                                     "the local file: sent again from the start")
                    plan.append((f, 0))
        job.skipped_bytes += skipped
        with job.lock:
            job.done_files = sum(1 for f in job.files if f.rel in job.verified_remote)
            job.done_bytes = sum(f.size for f in job.files if f.rel in job.verified_remote)
            job.done_bytes += sum(off for _f, off in plan)
            job.inflight.clear()
        job.report()
        plan.sort(key=lambda p: (p[0].rel == MANIFEST_FILE, p[0].size >= SMALL_FILE, p[0].rel))
        return plan

    def _send_all(self, job: _Job, client: paramiko.SSHClient, sftp: paramiko.SFTPClient,
                  plan: list[tuple[_File, int]], hasher: RemoteHasher) -> None:
        small = [p for p in plan if p[0].size < SMALL_FILE and p[0].path is not None]
        rest = [p for p in plan if not (p[0].size < SMALL_FILE and p[0].path is not None)]
        workers = min(self.settings.parallel_files, len(small))
        if workers > 1:
            self._send_parallel(job, client, small, workers)
        else:
            rest = small + rest
        # large files are hashed on the server while the next one is sent
        with ThreadPoolExecutor(1, thread_name_prefix="upload-hash") as pool:
            for f, offset in rest:
                self._send_one(job, sftp, f, offset)
                if f.size >= SMALL_FILE:
                    job.hashes[f.rel] = pool.submit(hasher.hash_files, job.staging, [f.rel], f.size, False)

    def _send_parallel(self, job: _Job, client: paramiko.SSHClient, items: list[tuple[_File, int]],
                       workers: int) -> None:
        """Small files over ``workers`` SFTP channels of the same connection."""
        queue = list(reversed(items))
        qlock = threading.Lock()
        stop = threading.Event()

        def worker() -> None:
            own = self._open_sftp(client)
            try:
                while not stop.is_set():
                    with qlock:
                        if not queue:
                            return
                        f, offset = queue.pop()
                    self._send_one(job, own, f, offset)
            except BaseException:
                stop.set()
                raise
            finally:
                own.close()

        with ThreadPoolExecutor(workers, thread_name_prefix="upload-small") as pool:
            futures = [pool.submit(worker) for _ in range(workers)]
            _done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in futures:
                exc = fut.exception()
                if exc is not None:
                    stop.set()
                    raise exc

    def _send_one(self, job: _Job, sftp: paramiko.SFTPClient, f: _File, offset: int) -> None:
        remote = posixpath.join(job.staging, f.rel)
        job.verified_remote.discard(f.rel)

        def on_bytes(n: int) -> None:
            with job.lock:
                job.inflight[f.rel] = n
            job.report()

        sent = _put(sftp, f, remote, offset, on_bytes, job)
        if offset + sent != f.size:
            raise _Permanent(f"{f.path} changed size during the upload ({f.size} -> {offset + sent} bytes)")
        with job.lock:
            job.inflight.pop(f.rel, None)
            job.done_files += 1
            job.done_bytes += f.size - offset
        job.report()

    def _verify(self, job: _Job, sftp: paramiko.SFTPClient, hasher: RemoteHasher, sent: set[str]) -> None:
        """Every remote file's size (and hash where computed remotely) against the manifest."""
        remote_files, _dirs = _inventory(sftp, job.staging)
        for f in job.files:
            have = remote_files.get(f.rel)
            if have != f.size:
                raise UploadError(f"remote {job.staging}/{f.rel} has {have} bytes after the upload, "
                                  f"the manifest says {f.size}")
        if not hasher.remote:
            job.verified_kind = "size"
            job.verified_remote.update(f.rel for f in job.files)
            return
        job.verified_kind = "sha256"
        todo = [f for f in job.files if f.rel not in job.verified_remote or f.rel in sent]
        got: dict[str, str] = {}
        for f in todo:
            fut = job.hashes.pop(f.rel, None)
            if fut is not None:
                got.update(fut.result())
        got.update(hasher.hash_files(job.staging, [f.rel for f in todo if f.rel not in got],
                                     sum(f.size for f in todo if f.rel not in got)))
        for f in todo:
            if got.get(f.rel) == f.entry.sha256:
                job.verified_remote.add(f.rel)
                continue
            if f.path is not None and sha256_file(f.path) != f.entry.sha256:
                raise _Permanent(f"local {f.path} does not match its manifest entry (changed after the "
                                 "export?): export again")
            # the next attempt sends it again: its remote copy is not the manifest's content
            sftp.remove(posixpath.join(job.staging, f.rel))
            raise UploadError(f"remote {job.staging}/{f.rel} has SHA-256 {got.get(f.rel)}, the manifest says "
                              f"{f.entry.sha256}: removed, to be sent again")


def _directories(job: _Job) -> list[str]:
    """Every remote directory to create, parents first: the manifest's (empty ones too) and
    the parents of every file (the manifest may list no directories, e.g. meta/ of itself)."""
    dirs = set(job.manifest.directories)
    for f in job.files:
        parent = posixpath.dirname(f.rel)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    return sorted(dirs, key=lambda d: (d.count("/"), d))


def _local_prefix_hash(f: _File, n: int) -> str:
    if f.data is not None:
        import hashlib

        return hashlib.sha256(f.data[:n]).hexdigest()
    assert f.path is not None
    try:
        return sha256_file(f.path, limit=n)
    except OSError as exc:
        raise _Permanent(f"cannot read {f.path}: {exc}") from exc


def _inventory(sftp: paramiko.SFTPClient, root: str) -> tuple[dict[str, int], set[str]]:
    """Files (relative path -> size) and directories under a remote directory."""
    files: dict[str, int] = {}
    dirs: set[str] = set()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        for entry in sftp.listdir_attr(posixpath.join(root, rel_dir) if rel_dir else root):
            rel = posixpath.join(rel_dir, entry.filename) if rel_dir else entry.filename
            mode = entry.st_mode or 0
            if stat.S_ISDIR(mode):
                dirs.add(rel)
                stack.append(rel)
            else:
                files[rel] = entry.st_size or 0
    return files, dirs


def _find_published(sftp: paramiko.SFTPClient, remote_dir: str, job: _Job) -> str | None:
    """After a failure during the rename: the directory it published, if it reached the server."""
    if _exists(sftp, job.staging):
        return None
    want = job.files[-1].entry.sha256  # the manifest's own digest
    for fname in sorted(sftp.listdir(remote_dir), reverse=True):
        if fname != job.name and not fname.startswith(job.name + "_"):
            continue
        path = posixpath.join(remote_dir, fname, MANIFEST_FILE)
        try:
            with sftp.open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if manifest_digest(data) == want:
            job.notes.append(f"the rename to {posixpath.dirname(posixpath.dirname(path))} had reached the "
                             "server before the connection broke")
            return posixpath.join(remote_dir, fname)
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the server stopped answering (transfer timeout)"
    if isinstance(exc, EOFError):
        return "the server closed the connection"
    text = str(exc) or type(exc).__name__
    return text


def _write_size(sftp: paramiko.SFTPClient, dst: paramiko.SFTPFile) -> int:
    """Largest write whose SFTP packet fits one SSH channel packet (no 30-byte tail packet)."""
    channel = sftp.get_channel()
    assert channel is not None
    # paramiko sends at most out_max_packet_size - 64 bytes per channel packet; an SFTP write
    # adds 4 (length) + 1 (type) + 4 (id) + 4 + len(handle) + 8 (offset) + 4 (data length)
    room = int(channel.out_max_packet_size) - 64 - (25 + len(dst.handle))
    return max(4096, min(int(dst.MAX_REQUEST_SIZE), room))


def _put(sftp: paramiko.SFTPClient, f: _File, remote: str, offset: int, on_bytes: Callable[[int], None],
         job: _Job) -> int:
    """Stream one file from ``offset`` (constant memory); return the bytes sent."""
    sent = 0
    last = 0
    limiter = job.limiter
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    mode = "r+b" if offset else "wb"
    try:
        src: Any = open(f.path, "rb") if f.path is not None else None  # noqa: SIM115 - closed below
    except OSError as exc:
        raise _Permanent(f"cannot read {f.path}: {exc}") from exc
    try:
        if src is not None and offset:
            src.seek(offset)
        data = memoryview(f.data or b"")[offset:] if src is None else None
        with sftp.open(remote, mode, bufsize=0) as dst:
            if offset:
                dst.seek(offset)
            dst.set_pipelined(True)
            step = _write_size(sftp, dst)
            while True:
                if src is not None:
                    try:
                        n = src.readinto(buf)
                    except OSError as exc:
                        raise _Permanent(f"cannot read {f.path}: {exc}") from exc
                    chunk = view[:n]
                else:
                    assert data is not None
                    chunk = data[sent:sent + READ_CHUNK]
                    n = len(chunk)
                if not n:
                    break
                for off in range(0, n, step):
                    piece = chunk[off:min(n, off + step)]
                    if limiter is not None:
                        limiter.consume(len(piece))
                    dst.write(piece)
                    with job.lock:
                        job.sent_bytes += len(piece)
                sent += n
                if sent - last >= PROGRESS_EVERY:
                    on_bytes(offset + sent)
                    last = sent
        # leaving the ``with`` closes the handle, which waits for every pipelined write ack
    finally:
        if src is not None:
            src.close()
    return sent


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def _check_remote_dir(sftp: paramiko.SFTPClient, remote_dir: str, create: bool) -> None:
    """remote_dir is an existing directory (created only when the config says so); a missing
    or non-directory remote_dir is a permanent error, not something to retry."""
    try:
        st = sftp.stat(remote_dir)
    except FileNotFoundError as exc:  # paramiko's ENOENT status
        if not create:
            raise _Permanent(f"remote_dir {remote_dir} does not exist on the server; create it there or "
                             "set collection.storage.sftp.create_remote_dir: true") from exc
        _makedirs(sftp, remote_dir)
        return
    if st.st_mode is None or not stat.S_ISDIR(st.st_mode):
        raise _Permanent(f"remote_dir {remote_dir} on the server is not a directory")


def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    if path == "/" or _exists(sftp, path):
        return
    _makedirs(sftp, posixpath.dirname(path))
    try:
        sftp.mkdir(path)
    except OSError:
        if not _exists(sftp, path):  # another writer may have made it meanwhile
            raise


def _candidates(name: str) -> Iterator[str]:
    yield name
    stamp = f"{name}_{time.strftime('%Y%m%dT%H%M%S')}"
    yield stamp
    for i in range(2, 1000):
        yield f"{stamp}_{i}"


def _publish(sftp: paramiko.SFTPClient, staging: str, remote_dir: str, name: str) -> tuple[str, bool]:
    """Rename ``staging`` to the first free candidate name; never replace a directory.

    SFTP's plain rename (not posix-rename) refuses an existing target, so a target that
    appears between the check and the rename is not replaced either: the next name is tried.
    """
    for candidate in _candidates(name):
        target = posixpath.join(remote_dir, candidate)
        if _exists(sftp, target):
            continue
        try:
            sftp.rename(staging, target)
        except OSError:
            if _exists(sftp, target) and _exists(sftp, staging):
                continue  # lost a race for this name
            raise
        return target, candidate != name
    raise UploadError(f"no free name for {name} in {remote_dir}")


def _try_rmtree(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        if not _exists(sftp, path):
            return True
        _rmtree(sftp, path)
    except (OSError, EOFError, paramiko.SSHException):
        return False
    return not _exists(sftp, path)


def _rmtree(sftp: paramiko.SFTPClient, path: str) -> None:
    for entry in sftp.listdir_attr(path):
        child = posixpath.join(path, entry.filename)
        if entry.st_mode is not None and stat.S_ISDIR(entry.st_mode):
            _rmtree(sftp, child)
        else:
            sftp.remove(child)
    sftp.rmdir(path)


def backend_for(settings: SftpSettings | None) -> UploadBackend | None:
    """The configured upload backend, or None when no backend is configured."""
    if settings is None:
        return None
    return SftpBackend(settings)
