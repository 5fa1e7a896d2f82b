"""A throwaway OpenSSH server on 127.0.0.1 for upload tests and the upload benchmark.

It runs ``/usr/sbin/sshd -D -e -f <own config>`` with a fresh ed25519 host key, a fresh
client key, its own authorized_keys and ``Subsystem sftp internal-sftp``, and writes a
known_hosts file that pins the host key. Nothing of the system's ssh setup is read or
changed (the only exception: as root, sshd needs its privilege separation directory
``/run/sshd``, which is created when missing, as the Debian service would).

Usage::

    server = SshServer.start(tmp_path / "sshd")
    try:
        settings = server.sftp_settings(remote_dir=str(tmp_path / "remote"))
    finally:
        server.stop()

or the ``server`` fixture of tests/conftest.py.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eva_export.config import SftpSettings

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"


class SshdMissing(RuntimeError):
    """OpenSSH's server is not installed; tests cannot run without a real server."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    """Make an ed25519 key pair at ``path``; return the public key line."""
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "eva-export-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return Path(f"{path}.pub").read_text().strip()


SFTP_SERVER = "/usr/lib/openssh/sftp-server"
FSIZE_FILE = "sftp_fsize_limit"


def _sftp_wrapper(root: Path) -> Path:
    """A script that starts OpenSSH's sftp-server, under RLIMIT_FSIZE when a limit is set.

    With the limit, the server's write that reaches it stops there and the next one kills the
    server with SIGXFSZ: a file on the server ends at exactly that many bytes, whatever the
    client's timing.
    """
    script = root / "sftp-server.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"limit=$(cat '{root / FSIZE_FILE}' 2>/dev/null)\n"
        f'[ -n "$limit" ] && exec /usr/bin/prlimit --fsize="$limit" -- {SFTP_SERVER}\n'
        f"exec {SFTP_SERVER}\n")
    script.chmod(0o755)
    return script


def _launch(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as log_fh:
        return subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                stdout=log_fh, stderr=subprocess.STDOUT)


def _children(pid: int) -> list[int]:
    """Every descendant pid of ``pid`` (read from /proc; sshd sessions call setsid)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid ..." - comm may contain spaces or parentheses
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        parents[int(entry)] = ppid
    out: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.extend(kids)
        frontier.extend(kids)
    return out


@dataclass
class SshServer:
    """One running throwaway sshd. Stop it with ``stop()`` (SIGTERM, then SIGKILL)."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    host_key_line: str  # "ssh-ed25519 AAAA..." of the server
    client_key: Path
    known_hosts: Path
    log: Path
    host: str = "127.0.0.1"
    user: str = field(default_factory=getpass.getuser)

    @classmethod
    def start(cls, root: Path, attempts: int = 3, sftp_only: bool = False) -> SshServer:
        """Start a server with its files under ``root``; fail loudly if sshd is missing.

        ``sftp_only``: every session runs the SFTP server (ForceCommand internal-sftp), as on
        hosts that allow no commands, so the upload cannot hash files on the server.
        """
        if not os.access(SSHD, os.X_OK):
            raise SshdMissing(
                f"{SSHD} not found: install OpenSSH's server (apt-get install -y openssh-server)"
            )
        root = Path(root).absolute()
        root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        (root / "home").mkdir(exist_ok=True)
        host_key = root / "ssh_host_ed25519_key"
        client_key = root / "client_ed25519"
        host_pub = _keygen(host_key)
        client_pub = _keygen(client_key)
        authorized = root / "authorized_keys"
        authorized.write_text(client_pub + "\n")
        authorized.chmod(0o600)
        host_key_line = " ".join(host_pub.split()[:2])
        wrapper = _sftp_wrapper(root)
        last_error = ""
        for _ in range(attempts):
            port = _free_port()
            config = root / "sshd_config"
            config.write_text("\n".join([
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "AllowTcpForwarding no",
                "X11Forwarding no",
                # the SFTP server runs under a wrapper that a test can give a file-size limit
                # (limit_file_size): the server itself stops at an exact byte, not a client count
                f"Subsystem sftp {wrapper}",
                # commands run by the upload (its hash shell) start without the account's
                # ~/.bashrc, which bash reads under sshd: on this machine root's runs pyenv
                # init, seconds of start-up and sometimes a wait on pyenv's lock
                f"SetEnv HOME={root / 'home'}",
                *([f"ForceCommand {wrapper}"] if sftp_only else []),
                "",
            ]))
            log = root / "sshd.log"
            proc = _launch(config, log)
            known_hosts = root / "known_hosts"
            known_hosts.write_text(f"[127.0.0.1]:{port} {host_key_line}\n")
            server = cls(root=root, port=port, proc=proc, host_key_line=host_key_line,
                         client_key=client_key, known_hosts=known_hosts, log=log)
            if server._wait_ready(10.0):
                return server
            server.stop()
            last_error = log.read_text(errors="replace")
        raise RuntimeError(f"sshd did not start after {attempts} attempts; its log:\n{last_error}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0) as s:
                    if s.recv(64).startswith(b"SSH-2.0"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def restart(self, timeout: float = 10.0) -> None:
        """Start the listener again on the same port and host key (after ``stop()`` or a kill)."""
        self.stop()
        for _ in range(50):  # the old socket may linger for a moment
            self.proc = _launch(self.root / "sshd_config", self.log)
            if self._wait_ready(timeout):
                return
            self.stop()
            time.sleep(0.1)
        raise RuntimeError(f"sshd did not restart on port {self.port}; see {self.log}")

    def sftp_settings(self, remote_dir: str, **kw: object) -> SftpSettings:
        """Settings of the project's SFTP backend that reach this server."""
        from eva_export.config import SftpSettings

        args: dict[str, object] = dict(host=self.host, port=self.port, user=self.user,
                                       identity_file=str(self.client_key),
                                       known_hosts=str(self.known_hosts), remote_dir=remote_dir,
                                       connect_timeout_s=10.0, transfer_timeout_s=15.0,
                                       retry_backoff_s=0.05, retry_backoff_max_s=0.5,
                                       create_remote_dir=True)  # tests upload into fresh tmp dirs
        args.update(kw)
        return SftpSettings(**args)  # type: ignore[arg-type]

    def limit_file_size(self, limit: int | None) -> None:
        """From the next SFTP session on, no file on the server grows past ``limit`` bytes."""
        path = self.root / FSIZE_FILE
        if limit is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(str(limit))

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener)."""
        if self.proc.poll() is not None:
            return []
        return _children(self.proc.pid)

    def signal_sessions(self, sig: int) -> list[int]:
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill_sessions(self) -> list[int]:
        """SIGKILL every open connection; the listener keeps accepting new ones."""
        return self.signal_sessions(signal.SIGKILL)

    def freeze_sessions(self) -> list[int]:
        """SIGSTOP every open connection: the server stops answering but keeps the socket."""
        return self.signal_sessions(signal.SIGSTOP)

    def stop(self) -> None:
        """SIGTERM the listener and its sessions, SIGKILL whatever is left after 5 s."""
        pids = self.session_pids()
        if self.proc.poll() is None:
            self.proc.terminate()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # stopped (frozen) sessions ignore SIGTERM
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5.0)

    def __enter__(self) -> SshServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
