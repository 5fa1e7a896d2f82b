"""Upload: the project's SftpBackend against OpenSSH's own ``sftp -b`` client, resume, cap.

One command (``python bench/bench_upload.py``): builds an export-like tree (~300 MB of
files of a few sizes, with its meta/manifest.json) in a temp dir, starts the throwaway sshd
of tests/sshd.py on 127.0.0.1 and measures

* throughput, four rows in interleaved rounds (the order rotates each round; medians, and
  the load average before every run): the project with ``bulk: paramiko``, the project with
  ``bulk: openssh`` (OpenSSH's sftp client sends the bytes; two clients for a tree this
  size, as configured by default) and the same with one client, and the anchor, OpenSSH's
  own ``sftp -b`` ``put -r`` of the same tree (same key, known_hosts and cipher). The
  project's uploads include their end-to-end check (every file hashed on the server against
  the manifest) before the rename; the anchor checks nothing. Goal: median >= 0.9x the anchor.
* resume (``bulk: paramiko``, whose byte count is exact): the connection is killed at 50% of
  the bytes; the retry resumes. Reported: the bytes sent beyond the tree's size (goal: at
  most one file's worth).
* bandwidth cap: MB/s over the wall clock against the configured cap (goal: within 10%),
  paramiko's limiter from its first byte, and ``sftp -l`` (``bulk: openssh``) from the batch
  handed to the client to the end of the upload.
* parallel small files (``bulk: paramiko``): many 16 KiB files with 1 and with 4 channels.

Prints Markdown tables and writes JSON to bench/out/upload.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import paramiko  # noqa: E402
from sshd import SshServer  # noqa: E402

from eva_export.manifest import write_manifest  # noqa: E402
from eva_export.upload import bulk_openssh  # noqa: E402
from eva_export.upload.sftp import PREFERRED_CIPHERS, SftpBackend  # noqa: E402

MB = 1 << 20
CIPHER = PREFERRED_CIPHERS[0]  # both clients use it


def build_tree(root: Path, total_mb: int) -> tuple[int, int]:
    """An export-like tree: big videos, mid-size parquet, small json; return (files, bytes)."""
    plan = [  # (relative dir, name pattern, size bytes, share of the total)
        ("videos/chunk-000/observation.images.top", "episode_{:06d}.mp4", 40 * MB, 0.55),
        ("videos/chunk-000/observation.images.wrist", "episode_{:06d}.mp4", 12 * MB, 0.30),
        ("data/chunk-000", "episode_{:06d}.parquet", 1 * MB, 0.14),
        ("meta", "part_{:03d}.json", 16 * 1024, 0.01),
    ]
    block = os.urandom(4 * MB)  # incompressible content, written without holding a file in memory
    files = size = 0
    for rel, pattern, fsize, share in plan:
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        count = max(1, int(total_mb * MB * share // fsize))
        for i in range(count):
            with open(d / pattern.format(i), "wb") as fh:
                left = fsize
                while left:
                    n = min(left, len(block))
                    fh.write(block[:n] if i % 2 else block[len(block) - n:])
                    left -= n
            files += 1
            size += fsize
    write_manifest(root)
    files += 1
    size += (root / "meta" / "manifest.json").stat().st_size
    return files, size


def run_project(server: SshServer, tree: Path, remote_dir: Path, bulk: str = "paramiko",
                streams: int = bulk_openssh.STREAMS) -> dict[str, float | str]:
    """One upload by the backend; ``bulk=openssh`` hands the bytes to OpenSSH's sftp client
    (``streams`` clients at once)."""
    default_streams, bulk_openssh.STREAMS = bulk_openssh.STREAMS, streams
    try:
        return _run_project(server, tree, remote_dir, bulk)
    finally:
        bulk_openssh.STREAMS = default_streams


def _run_project(server: SshServer, tree: Path, remote_dir: Path, bulk: str) -> dict[str, float | str]:
    settings = server.sftp_settings(str(remote_dir), bulk=bulk)
    backend = SftpBackend(settings)
    client = backend.connect()
    transport = client.get_transport()
    assert transport is not None
    cipher = transport.local_cipher
    client.close()
    ru0 = _cpu()
    t0 = time.perf_counter()
    result = backend.upload(tree, "bench_accepted")
    wall = time.perf_counter() - t0
    cpu = _cpu() - ru0  # this process and the sftp client it ran (openssh bulk)
    if result.verified != "sha256":
        raise RuntimeError(f"the upload was verified by {result.verified} only; the benchmark needs sha256")
    return {"seconds": wall, "bytes": result.bytes, "cpu_s": cpu, "cipher": cipher,
            "remote_path": result.remote_path}


def _cpu() -> float:
    """CPU seconds of this process plus its waited-for children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def run_resume(server: SshServer, tree: Path, remote_dir: Path, size: int) -> dict[str, float]:
    """Kill the connection at 50% of the bytes; the backend's next attempt resumes."""
    killed: list[int] = []

    def progress(_fd: int, _ft: int, done: int, total: int) -> None:
        if done >= total // 2 and not killed:
            killed.extend(server.kill_sessions() or [0])

    backend = SftpBackend(server.sftp_settings(str(remote_dir), retry_backoff_s=0.05, bulk="paramiko"))
    t0 = time.perf_counter()
    res = backend.upload(tree, "resume_accepted", progress)
    wall = time.perf_counter() - t0
    largest = max(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    if res.attempts != 2:
        raise RuntimeError(f"expected one break and one resume, got {res.attempts} attempts")
    return {"seconds": wall, "resent_bytes": res.sent_bytes - size, "largest_file": largest,
            "attempts": res.attempts}


def run_cap(server: SshServer, work: Path, remote_dir: Path, cap: int) -> dict[str, float]:
    tree = work / "cap"
    build_small(tree, 3, 12 * MB)
    backend = SftpBackend(server.sftp_settings(str(remote_dir), bandwidth_limit_bps=cap, bulk="paramiko"))
    res = backend.upload(tree, "cap_accepted")
    end = time.monotonic()
    lim = backend.last_limiter
    assert lim is not None and lim.first_at is not None
    wall = end - lim.first_at  # from the first byte (connection set-up is not data time)
    return {"cap_bps": cap, "bytes": res.sent_bytes, "seconds": wall,
            "measured_bps": res.sent_bytes / wall, "ratio": res.sent_bytes / wall / cap,
            "booked_ratio": lim.booked_rate() / cap}


def run_cap_openssh(server: SshServer, work: Path, remote_dir: Path, cap: int) -> dict[str, float]:
    """The cap as ``sftp -l``: bytes over the wall clock from the batch handed to the client (its
    connection is up by then) to the end of the upload (the verification included)."""
    tree = work / "cap"
    backend = SftpBackend(server.sftp_settings(str(remote_dir), bandwidth_limit_bps=cap, bulk="openssh"))
    res = backend.upload(tree, "cap_openssh_accepted")
    end = time.monotonic()
    job = backend.last_job
    assert job is not None and job.bulk_started_at is not None
    wall = end - job.bulk_started_at
    return {"cap_bps": cap, "bytes": res.sent_bytes, "seconds": wall, "measured_bps": res.sent_bytes / wall,
            "ratio": res.sent_bytes / wall / cap}


def build_small(root: Path, count: int, fsize: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"f_{i:05d}.bin").write_bytes(os.urandom(fsize))
    write_manifest(root)


def run_small(server: SshServer, work: Path, remote_dir: Path, count: int) -> dict[str, float]:
    tree = work / "small"
    build_small(tree, count, 16 * 1024)
    out: dict[str, float] = {}
    for n in (1, 4):
        backend = SftpBackend(server.sftp_settings(str(remote_dir), parallel_files=n, bulk="paramiko"))
        t0 = time.perf_counter()
        backend.upload(tree, f"small_{n}")
        out[f"files_per_s_{n}"] = (count + 1) / (time.perf_counter() - t0)
    return out


def run_openssh(server: SshServer, tree: Path, remote_dir: Path, size: int) -> dict[str, float | str]:
    target = remote_dir / "openssh_accepted"
    batch = f"put -r {tree} {target}\n"
    cmd = ["sftp", "-b", "-", "-q", "-i", str(server.client_key), "-P", str(server.port),
           "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "StrictHostKeyChecking=yes",
           "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
           "-o", f"Ciphers={CIPHER}", "-F", "/dev/null", f"{server.user}@127.0.0.1"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=batch.encode(), capture_output=True, timeout=600)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"sftp failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    got = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    if got != size:
        raise RuntimeError(f"sftp uploaded {got} bytes, expected {size}")
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"seconds": wall, "bytes": size, "cpu_s": cpu, "cipher": CIPHER, "remote_path": str(target)}


LABELS = {
    "project": "eva_export SftpBackend, bulk: paramiko",
    "project_openssh": f"eva_export SftpBackend, bulk: openssh ({bulk_openssh.STREAMS} sftp -b clients send, "
                       "paramiko verifies + renames)",
    "project_openssh_1": "eva_export SftpBackend, bulk: openssh, 1 sftp -b client",
    "openssh": "anchor: OpenSSH sftp -b put -r (no verification)",
}


def _row(rs: list[dict[str, float | str]], gb: float) -> dict[str, Any]:
    speeds = [float(r["bytes"]) / MB / float(r["seconds"]) for r in rs]
    return {"cipher": rs[0]["cipher"], "median_mb_s": round(statistics.median(speeds), 1),
            "best_mb_s": round(max(speeds), 1), "all_mb_s": [round(x, 1) for x in speeds],
            "median_cpu_s_per_gb": round(statistics.median(float(r["cpu_s"]) for r in rs) / gb, 2)}


def _print_rows(report: dict[str, Any], files: int, size: int) -> None:
    loads = report["load_avg_1m_during_pairs"]
    print(f"upload of {files} files, {size / MB:.0f} MiB over loopback, {report['repeats']} interleaved "
          f"rounds (order rotated), medians; load average (1 min) {min(loads)}-{max(loads)} "
          f"on {report['cpus']} CPUs\n")
    print("| client | cipher | median MiB/s | best | CPU s/GiB (client side) | median ratio to sftp -b |")
    print("|---|---|---:|---:|---:|---:|")
    for name, r in report["rows"].items():
        print(f"| {LABELS[name]} | {r['cipher']} | {r['median_mb_s']:.1f} | {r['best_mb_s']:.1f} "
              f"| {r['median_cpu_s_per_gb']} | {r['median_ratio']:.2f} |")
    lo, hi = min(loads), max(loads)
    print()
    for name, label in (("project_openssh", f"bulk: openssh ({bulk_openssh.STREAMS} clients, the default "
                                             "client count)"),
                        ("project_openssh_1", "bulk: openssh, 1 client"), ("project", "bulk: paramiko")):
        ratio = report["rows"][name]["median_ratio"]
        print(f"ratio {label}: {ratio:.2f}x sftp -b (medians of {report['repeats']}, load {lo}-{hi}); "
              f"goal >= 0.9x sftp: {'met' if ratio >= 0.9 else 'NOT met'}")
    print(f"max RSS {report['max_rss_kb_before_uploads'] // 1024} MiB before, "
          f"{report['max_rss_kb_after_uploads'] // 1024} MiB after the uploads")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs of each client")
    ap.add_argument("--cap-mb-s", type=float, default=8.0, help="bandwidth cap of the cap run (MB/s)")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "upload.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="eva-bench-upload-"))
    server = None
    try:
        tree = work / "export" / "accepted"
        files, size = build_tree(tree, args.total_mb)
        server = SshServer.start(work / "sshd")
        remote = work / "remote"
        names = ("openssh", "project", "project_openssh", "project_openssh_1")
        runs: dict[str, list[dict[str, float | str]]] = {n: [] for n in names}
        loads: list[float] = []
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for i in range(args.repeats):
            # the order rotates so that no row always runs first (or right after another)
            for name in names[i % len(names):] + names[:i % len(names)]:
                remote.mkdir(parents=True, exist_ok=True)
                loads.append(os.getloadavg()[0])
                if name == "openssh":
                    runs[name].append(run_openssh(server, tree, remote, size))
                elif name == "project":
                    runs[name].append(run_project(server, tree, remote, "paramiko"))
                else:
                    runs[name].append(run_project(server, tree, remote, "openssh",
                                                  1 if name == "project_openssh_1" else bulk_openssh.STREAMS))
                shutil.rmtree(remote)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        remote.mkdir(parents=True, exist_ok=True)
        resume = run_resume(server, tree, remote, size)
        shutil.rmtree(remote)
        remote.mkdir(parents=True, exist_ok=True)
        cap = run_cap(server, work, remote, int(args.cap_mb_s * 1e6))
        cap_openssh = run_cap_openssh(server, work, remote, int(args.cap_mb_s * 1e6))
        small = run_small(server, work, remote, 400)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)

    gb = size / (1 << 30)
    rows = {n: _row(runs[n], gb) for n in names}
    anchor = rows["openssh"]["median_mb_s"]
    for r in rows.values():
        r["median_ratio"] = round(r["median_mb_s"] / anchor, 3)
    report = {
        "files": files,
        "bytes": size,
        "repeats": args.repeats,
        "rows": rows,
        "goal_median_ratio": 0.9,
        "goal_met_paramiko": rows["project"]["median_ratio"] >= 0.9,
        "goal_met_openssh_bulk": rows["project_openssh"]["median_ratio"] >= 0.9,
        "goal_met_openssh_bulk_1_client": rows["project_openssh_1"]["median_ratio"] >= 0.9,
        "openssh_bulk_clients": bulk_openssh.STREAMS,
        "max_rss_kb_before_uploads": rss0,
        "max_rss_kb_after_uploads": rss1,
        "python": platform.python_version(),
        "paramiko": paramiko.__version__,
        "openssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
        "cpus": os.cpu_count(),
        "load_avg_1m_during_pairs": [round(x, 1) for x in loads],
        "load_avg_1m": os.getloadavg()[0],
        "resume": resume,
        "resume_goal_met": resume["resent_bytes"] <= resume["largest_file"],
        "bandwidth_cap": cap,
        "bandwidth_goal_met": abs(cap["ratio"] - 1) <= 0.1,
        "bandwidth_cap_openssh": cap_openssh,
        "bandwidth_goal_met_openssh": abs(cap_openssh["ratio"] - 1) <= 0.1,
        "small_files": small,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _print_rows(report, files, size)
    print("\n| measure | value | goal | met |")
    print("|---|---|---|---|")
    print(f"| bytes re-sent after a break at 50% | {resume['resent_bytes'] / MB:.2f} MiB "
          f"(largest file {resume['largest_file'] / MB:.0f} MiB) | <= one file | {report['resume_goal_met']} |")
    print(f"| bandwidth cap {cap['cap_bps'] / 1e6:.1f} MB/s: measured | {cap['measured_bps'] / 1e6:.2f} MB/s "
          f"({cap['ratio']:.3f}x; limiter books {cap['booked_ratio']:.3f}x) | within 10% "
          f"| {report['bandwidth_goal_met']} |")
    print(f"| bandwidth cap {cap['cap_bps'] / 1e6:.1f} MB/s, bulk: openssh (sftp -l) | "
          f"{cap_openssh['measured_bps'] / 1e6:.2f} MB/s ({cap_openssh['ratio']:.3f}x) | within 10% "
          f"| {report['bandwidth_goal_met_openssh']} |")
    print(f"| 400 x 16 KiB files, 1 / 4 channels | {small['files_per_s_1']:.0f} / "
          f"{small['files_per_s_4']:.0f} files/s | | |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
