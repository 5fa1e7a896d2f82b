"""Remote file system helpers over SFTP: inventory, remote_dir check, publish, rmtree.

``publish`` is the one remote rename that makes an upload visible; it never replaces a
directory (SFTP's plain rename refuses an existing target).
"""

from __future__ import annotations

import errno
import posixpath
import stat
import time
from collections.abc import Iterator

import paramiko

from ..errors import UploadError
from ..manifest import MANIFEST_FILE, manifest_digest
from .job import PermanentError, UploadJob


def free_space(sftp: paramiko.SFTPClient, path: str) -> int | None:
    """Bytes free to unprivileged users on the server's file system holding ``path``, from
    OpenSSH's statvfs@openssh.com extension; None when the server does not answer it."""
    try:
        kind, msg = sftp._request(paramiko.sftp.CMD_EXTENDED, "statvfs@openssh.com", path)
    except (OSError, EOFError, paramiko.SSHException):
        return None
    if kind != paramiko.sftp.CMD_EXTENDED_REPLY or msg is None:
        return None
    _bsize, frsize, _blocks, _bfree, bavail = (msg.get_int64() for _ in range(5))
    return int(bavail * frsize)


def inventory(sftp: paramiko.SFTPClient, root: str) -> tuple[dict[str, int], set[str]]:
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


def find_published(sftp: paramiko.SFTPClient, remote_dir: str, job: UploadJob) -> str | None:
    """After a failure during the rename: the directory it published, if it reached the server."""
    if exists(sftp, job.staging):
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


def exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def check_remote_dir(sftp: paramiko.SFTPClient, remote_dir: str, create: bool) -> None:
    """remote_dir is an existing directory (created only when the config says so); a missing
    or non-directory remote_dir is a permanent error, not something to retry."""
    try:
        st = sftp.stat(remote_dir)
    except FileNotFoundError as exc:  # paramiko's ENOENT status
        if not create:
            raise PermanentError(f"remote_dir {remote_dir} does not exist on the server; create it there or "
                                 "set collection.storage.sftp.create_remote_dir: true") from exc
        makedirs(sftp, remote_dir)
        return
    if st.st_mode is None or not stat.S_ISDIR(st.st_mode):
        raise PermanentError(f"remote_dir {remote_dir} on the server is not a directory")


def makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    if path == "/" or exists(sftp, path):
        return
    makedirs(sftp, posixpath.dirname(path))
    try:
        sftp.mkdir(path)
    except OSError:
        if not exists(sftp, path):  # another writer may have made it meanwhile
            raise


def _candidates(name: str) -> Iterator[str]:
    yield name
    stamp = f"{name}_{time.strftime('%Y%m%dT%H%M%S')}"
    yield stamp
    for i in range(2, 1000):
        yield f"{stamp}_{i}"


def publish(sftp: paramiko.SFTPClient, staging: str, remote_dir: str, name: str) -> tuple[str, bool]:
    """Rename ``staging`` to the first free candidate name; never replace a directory.

    SFTP's plain rename (not posix-rename) refuses an existing target, so a target that
    appears between the check and the rename is not replaced either: the next name is tried.
    """
    for candidate in _candidates(name):
        target = posixpath.join(remote_dir, candidate)
        if exists(sftp, target):
            continue
        try:
            sftp.rename(staging, target)
        except OSError:
            if exists(sftp, target) and exists(sftp, staging):
                continue  # lost a race for this name
            raise
        return target, candidate != name
    raise UploadError(f"no free name for {name} in {remote_dir}")


def try_rmtree(sftp: paramiko.SFTPClient, path: str) -> bool:
    """Remove a directory tree or a file (another version's lock); True when it is gone."""
    try:
        if not exists(sftp, path):
            return True
        mode = sftp.lstat(path).st_mode or 0
        if stat.S_ISDIR(mode):
            rmtree(sftp, path)
        else:
            sftp.remove(path)
    except (OSError, EOFError, paramiko.SSHException):
        return False
    return not exists(sftp, path)


def rmtree(sftp: paramiko.SFTPClient, path: str) -> None:
    for entry in sftp.listdir_attr(path):
        child = posixpath.join(path, entry.filename)
        if entry.st_mode is not None and stat.S_ISDIR(entry.st_mode):
            rmtree(sftp, child)
        else:
            sftp.remove(child)
    sftp.rmdir(path)
