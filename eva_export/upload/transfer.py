"""The bytes of an upload over paramiko: what to send from where (resume), and the sending.

``plan`` compares the staging directory with the manifest: complete files whose remote
SHA-256 matches are skipped, an intact remote prefix is continued from its size, anything
else is sent from the start. Small files go over ``parallel_files`` SFTP channels at once
(their open/close round trips overlap); large ones one after another with pipelined
writes. Every file is hashed on the server (remote.HashQueue, in batches) while the next
ones are sent.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import paramiko

from ..manifest import MANIFEST_FILE, sha256_file
from .connection import open_sftp
from .job import PermanentError, UploadFile, UploadJob
from .remote import HashQueue, RemoteHasher

READ_CHUNK = 1 << 20  # local read size; written as SFTP writes of one SSH packet each
PROGRESS_EVERY = 4 << 20  # report progress at least every 4 MiB and after every file
SMALL_FILE = 1 << 20  # files below this go through the parallel channels

Plan = list[tuple[UploadFile, int]]  # (file, offset to send it from)


def local_prefix_hash(f: UploadFile, n: int) -> str:
    if f.data is not None:
        return hashlib.sha256(f.data[:n]).hexdigest()
    assert f.path is not None
    try:
        return sha256_file(f.path, limit=n)
    except OSError as exc:
        raise PermanentError(f"cannot read {f.path}: {exc}") from exc


def _triage(job: UploadJob, remote_files: dict[str, int]) -> tuple[Plan, list[UploadFile]]:
    """Files to send from 0, and files whose remote copy must be hashed to decide."""
    check: list[UploadFile] = []
    plan: Plan = []
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
    return plan, check


def plan(job: UploadJob, sftp: paramiko.SFTPClient, hasher: RemoteHasher, remote_files: dict[str, int]) -> Plan:
    """Which files to send and from which offset; removes remote files not in the manifest."""
    job.remote_hashes.clear()  # an earlier attempt's digests: the plan decides afresh
    wanted = {f.rel for f in job.files}
    for rel in sorted(set(remote_files) - wanted):
        sftp.remove(posixpath.join(job.staging, rel))
    out, check = _triage(job, remote_files)
    if check and not hasher.remote:  # size-only servers: complete sizes trusted, prefixes read back
        for f in [f for f in check if remote_files[f.rel] == f.size]:
            job.verified_remote.add(f.rel)
        check = [f for f in check if remote_files[f.rel] < f.size]
    remote_hash = hasher.hash_files(job.staging, [f.rel for f in check], sum(remote_files[f.rel] for f in check))
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
            out.append((f, 0))
        elif got is not None and got == local_prefix_hash(f, have):
            out.append((f, have))
            skipped += have
        else:
            job.notes.append(f"{f.rel}: the partial copy on the server ({have} bytes) does not match "
                             "the local file: sent again from the start")
            out.append((f, 0))
    job.skipped_bytes += skipped
    with job.lock:
        job.done_files = sum(1 for f in job.files if f.rel in job.verified_remote)
        job.done_bytes = sum(f.size for f in job.files if f.rel in job.verified_remote)
        job.done_bytes += sum(off for _f, off in out)
        job.inflight.clear()
    job.report()
    out.sort(key=lambda p: (p[0].rel == MANIFEST_FILE, p[0].size >= SMALL_FILE, p[0].rel))
    return out


def send_all(job: UploadJob, client: paramiko.SSHClient, sftp: paramiko.SFTPClient, items: Plan,
             hasher: RemoteHasher, parallel_files: int, timeout_s: float) -> None:
    small = [p for p in items if p[0].size < SMALL_FILE and p[0].path is not None]
    rest = [p for p in items if not (p[0].size < SMALL_FILE and p[0].path is not None)]
    workers = min(parallel_files, len(small))
    # every file is hashed on the server (in batches) while the next ones are sent
    queue = HashQueue(hasher, job.staging)
    try:
        if workers > 1:
            _send_parallel(job, client, small, workers, timeout_s, queue)
        else:
            rest = small + rest
        for f, offset in rest:
            send_one(job, sftp, f, offset)
            queue.add(f.rel, f.size)
        job.remote_hashes.update(queue.finish())
    finally:
        queue.close()


def _send_parallel(job: UploadJob, client: paramiko.SSHClient, items: Plan, workers: int,
                   timeout_s: float, queue: HashQueue) -> None:
    """Small files over ``workers`` SFTP channels of the same connection."""
    todo = list(reversed(items))
    qlock = threading.Lock()
    stop = threading.Event()

    def worker() -> None:
        own = open_sftp(client, timeout_s)
        try:
            while not stop.is_set():
                with qlock:
                    if not todo:
                        return
                    f, offset = todo.pop()
                send_one(job, own, f, offset)
                queue.add(f.rel, f.size)
        except BaseException:
            stop.set()
            raise
        finally:
            own.close()

    with ThreadPoolExecutor(workers, thread_name_prefix="upload-small") as pool:
        futures = [pool.submit(worker) for _ in range(workers)]
        wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            exc = fut.exception()
            if exc is not None:
                stop.set()
                raise exc


def send_one(job: UploadJob, sftp: paramiko.SFTPClient, f: UploadFile, offset: int) -> None:
    remote = posixpath.join(job.staging, f.rel)
    job.verified_remote.discard(f.rel)

    def on_bytes(n: int) -> None:
        with job.lock:
            job.inflight[f.rel] = n
        job.report()

    sent = put(sftp, f, remote, offset, on_bytes, job)
    if offset + sent != f.size:
        raise PermanentError(f"{f.path} changed size during the upload ({f.size} -> {offset + sent} bytes)")
    job.file_done(f, offset)


def _write_size(sftp: paramiko.SFTPClient, dst: paramiko.SFTPFile) -> int:
    """Largest write whose SFTP packet fits one SSH channel packet (no 30-byte tail packet)."""
    channel = sftp.get_channel()
    assert channel is not None
    # paramiko sends at most out_max_packet_size - 64 bytes per channel packet; an SFTP write
    # adds 4 (length) + 1 (type) + 4 (id) + 4 + len(handle) + 8 (offset) + 4 (data length)
    room = int(channel.out_max_packet_size) - 64 - (25 + len(dst.handle))
    return max(4096, min(int(dst.MAX_REQUEST_SIZE), room))


def _write_chunk(dst: paramiko.SFTPFile, chunk: memoryview, step: int, job: UploadJob) -> None:
    n = len(chunk)
    for off in range(0, n, step):
        piece = chunk[off:min(n, off + step)]
        if job.limiter is not None:
            job.limiter.consume(len(piece))
        dst.write(piece)
        with job.lock:
            job.sent_bytes += len(piece)


def put(sftp: paramiko.SFTPClient, f: UploadFile, remote: str, offset: int, on_bytes: Callable[[int], None],
        job: UploadJob) -> int:
    """Stream one file from ``offset`` (constant memory); return the bytes sent."""
    sent = last = 0
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    try:
        src: Any = open(f.path, "rb") if f.path is not None else None  # noqa: SIM115 - closed below
    except OSError as exc:
        raise PermanentError(f"cannot read {f.path}: {exc}") from exc
    try:
        if src is not None and offset:
            src.seek(offset)
        data = memoryview(f.data or b"")[offset:] if src is None else None
        with sftp.open(remote, "r+b" if offset else "wb", bufsize=0) as dst:
            if offset:
                dst.seek(offset)
            dst.set_pipelined(True)
            step = _write_size(sftp, dst)
            while True:
                if src is not None:
                    try:
                        n = src.readinto(buf)
                    except OSError as exc:
                        raise PermanentError(f"cannot read {f.path}: {exc}") from exc
                    chunk = view[:n]
                else:
                    assert data is not None
                    chunk = data[sent:sent + READ_CHUNK]
                    n = len(chunk)
                if not n:
                    break
                _write_chunk(dst, chunk, step, job)
                sent += n
                if sent - last >= PROGRESS_EVERY:
                    on_bytes(offset + sent)
                    last = sent
        # leaving the ``with`` closes the handle, which waits for every pipelined write ack
    finally:
        if src is not None:
            src.close()
    return sent
