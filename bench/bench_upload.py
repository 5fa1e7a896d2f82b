"""Upload throughput: the project's SftpBackend against OpenSSH's own ``sftp -b`` client.

One command (``python bench/bench_upload.py``): builds an export-like tree (~300 MB of
files of a few sizes) in a temp dir, starts the throwaway sshd of tests/sshd.py on
127.0.0.1, uploads the tree with both clients (same key, same known_hosts, same cipher),
prints a Markdown table and writes JSON to bench/out/upload.json.

Goal: the project reaches at least 0.75 of the sftp client's MB/s.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import paramiko  # noqa: E402
from sshd import SshServer  # noqa: E402

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
    return files, size


def run_project(server: SshServer, tree: Path, remote_dir: Path) -> dict[str, float | str]:
    settings = server.sftp_settings(str(remote_dir))
    backend = SftpBackend(settings)
    client = backend.connect()
    transport = client.get_transport()
    assert transport is not None
    cipher = transport.local_cipher
    client.close()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    result = backend.upload(tree, "bench_accepted")
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"seconds": wall, "bytes": result.bytes, "cpu_s": cpu, "cipher": cipher,
            "remote_path": result.remote_path}


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each client; best is kept")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "upload.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="eva-bench-upload-"))
    server = None
    try:
        tree = work / "export" / "accepted"
        files, size = build_tree(tree, args.total_mb)
        server = SshServer.start(work / "sshd")
        remote = work / "remote"
        runs: dict[str, list[dict[str, float | str]]] = {"project": [], "openssh": []}
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(args.repeats):
            for name in ("openssh", "project"):
                remote.mkdir(parents=True, exist_ok=True)
                if name == "project":
                    runs[name].append(run_project(server, tree, remote))
                else:
                    runs[name].append(run_openssh(server, tree, remote, size))
                shutil.rmtree(remote)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)

    def best(rs: list[dict[str, float | str]]) -> dict[str, float | str]:
        return min(rs, key=lambda r: float(r["seconds"]))

    def mbps(r: dict[str, float | str]) -> float:
        return float(r["bytes"]) / MB / float(r["seconds"])

    proj, ossh = best(runs["project"]), best(runs["openssh"])
    ratio = mbps(proj) / mbps(ossh)
    med_p = statistics.median(mbps(r) for r in runs["project"])
    med_o = statistics.median(mbps(r) for r in runs["openssh"])
    gb = size / (1 << 30)
    report = {
        "files": files,
        "bytes": size,
        "repeats": args.repeats,
        "cipher": {"project": proj["cipher"], "openssh": ossh["cipher"]},
        "project_mb_s": round(mbps(proj), 1),
        "openssh_sftp_mb_s": round(mbps(ossh), 1),
        "ratio": round(ratio, 3),
        "goal_ratio": 0.75,
        "goal_met": ratio >= 0.75,
        "project_median_mb_s": round(med_p, 1),
        "openssh_sftp_median_mb_s": round(med_o, 1),
        "median_ratio": round(med_p / med_o, 3),
        "project_cpu_s_per_gb": round(float(proj["cpu_s"]) / gb, 2),
        "openssh_client_cpu_s_per_gb": round(float(ossh["cpu_s"]) / gb, 2),
        "project_all_mb_s": [round(mbps(r), 1) for r in runs["project"]],
        "openssh_all_mb_s": [round(mbps(r), 1) for r in runs["openssh"]],
        "max_rss_kb_before_uploads": rss0,
        "max_rss_kb_after_uploads": rss1,
        "python": platform.python_version(),
        "paramiko": paramiko.__version__,
        "openssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"upload of {files} files, {size / MB:.0f} MiB over loopback, best of {args.repeats}\n")
    print("| client | cipher | MB/s | CPU s/GB (client process) |")
    print("|---|---|---:|---:|")
    print(f"| eva_export SftpBackend (paramiko) | {proj['cipher']} | {mbps(proj):.1f} "
          f"| {report['project_cpu_s_per_gb']} |")
    print(f"| OpenSSH sftp -b | {ossh['cipher']} | {mbps(ossh):.1f} "
          f"| {report['openssh_client_cpu_s_per_gb']} |")
    print(f"\nmedian of {args.repeats}: project {med_p:.1f} MB/s, sftp {med_o:.1f} MB/s, "
          f"ratio {med_p / med_o:.2f}")
    print(f"best-of ratio {ratio:.2f} (goal >= 0.75: {'met' if report['goal_met'] else 'NOT met'}); "
          f"max RSS {rss0 // 1024} MiB before, {rss1 // 1024} MiB after the uploads")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
