"""SIGKILL the direct lerobot_v3 job at points it surely reaches; the pair is never half
published, and the rerun keeps the shards the killed run completed.

Each killed run is held at a named point (``faults.env(v3_hold=...)``: the job writes
``started`` there and blocks on a FIFO) and killed while it waits: after the k-th shard record,
before an episode is read, after each subset, after verification and at each publication step.
The rerun must publish the same pair a clean run publishes, with every shard recorded before
the kill still the same file (inode and mtime), the others written anew.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset
from test_v3_direct import _tree

from eva_export import faults
from eva_export.export.paths import ExportPaths
from eva_export.export.v3_records import ShardRecord
from eva_export.formats.common.records import QualitySplit
from eva_export.formats.lerobot_v3.verify import verify_v3

REPO = Path(__file__).resolve().parents[1]
N_EPISODES = 12

pytestmark = pytest.mark.timeout(600)

POINTS = ["shard#1", "shard#4", "unit:9", "shard#9", "convert_accepted", "convert_rejected", "verified",
          "check_staged", "backup_old", "move_new"]


def _cmd(config: Path, src: Path) -> list[str]:
    return [sys.executable, "-m", "eva_export.cli", "export", "--config", str(config), "--source", str(src),
            "--format", "lerobot_v3"]


def _env(**points: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(faults.env(**points) if points else {})
    return env


def _pair(paths: ExportPaths) -> str | None:
    """The job id of the complete pair in place, or None (then the old one waits in a backup)."""
    if not paths.pair_dir.exists():
        assert paths.backups(), "no pair and no backup to restore"
        return None
    assert sorted(os.listdir(paths.pair_dir)) == ["accepted", "rejected"]
    qa, qr = QualitySplit.read(paths.accepted), QualitySplit.read(paths.rejected)
    assert qa.job_id == qr.job_id, f"half pair: accepted {qa.job_id} beside rejected {qr.job_id}"
    for d in (paths.accepted, paths.rejected):
        rep = verify_v3(d)
        assert rep.ok, rep.errors
    return qa.job_id


def _recorded(staging: Path) -> dict[str, tuple[int, int]]:
    """Shard (path in the pair) -> (inode, mtime ns) of every staged shard with a record (none
    once the publication moved the staged pair into place: that pair is published)."""
    out: dict[str, tuple[int, int]] = {}
    base = staging / "out"
    if not base.exists():
        return out
    for rec_path in sorted(staging.glob("v3/*/*/*.json")):
        if rec_path.name == "settings.json":
            continue
        rec = ShardRecord.from_dict(json.loads(rec_path.read_text()))
        subset = rec_path.parent.parent.name
        if rec.stream == "data":
            rel = f"{subset}/data/chunk-{rec.chunk_index:03d}/file-{rec.file_index:03d}.parquet"
        else:
            rel = f"{subset}/videos/{rec.stream}/chunk-{rec.chunk_index:03d}/file-{rec.file_index:03d}.mp4"
        st = os.stat(base / rel)
        assert (st.st_size, st.st_mtime_ns) == (rec.size, rec.mtime_ns)
        out[rel] = (st.st_ino, st.st_mtime_ns)
    return out


def _held(config: Path, src: Path, hold: Path, point: str) -> subprocess.Popen[bytes]:
    hold.mkdir()
    os.mkfifo(hold / "release")
    proc = subprocess.Popen(_cmd(config, src), env=_env(v3_hold=f"{hold}@{point}"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (hold / "started").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"never reached {point}: {proc.communicate()[1].decode()[-2000:]}")
        time.sleep(0.01)
    return proc


@pytest.mark.parametrize("workers", [0, 2], ids=["auto", "2-workers"])
def test_kill_at_each_point_leaves_the_pair_whole_and_the_rerun_keeps_complete_shards(tmp_path: Path,
                                                                                     workers: int) -> None:
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw",
                       [Ep(frames=6 + i % 5, quality="green" if i % 3 else "red") for i in range(N_EPISODES)],
                       cameras=2, width=32, height=24)
    config = tmp_path / "config.yaml"
    # shards of two or three episodes: many shard boundaries to be killed between
    config.write_text(f'collection:\n  log_dir: "{log_dir}"\nexport:\n  v3_data_file_mb: 0.001\n'
                      f'  v3_video_file_mb: 0.003\n  workers: {workers}\n')
    paths = ExportPaths.of(src, "lerobot_v3")
    done = subprocess.run(_cmd(config, src), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    old = json.loads(done.stdout)["job_id"]
    want = _tree(paths.pair_dir)
    assert len([k for k in want if k.endswith(".parquet") and "/data/" in k]) >= 4

    report = []
    for n, point in enumerate(POINTS):
        proc = _held(config, src, tmp_path / f"hold{n}", point)
        try:
            kept = _recorded(paths.staging)
        finally:  # never leave a held job behind a failed check
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        state = _pair(paths)
        assert state in (None, old) or point == "move_new", (point, state)
        rerun = subprocess.run(_cmd(config, src), env=_env(), capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        job = json.loads(rerun.stdout)
        assert _pair(paths) == job["job_id"]
        assert paths.backups() == [] and not paths.staging.exists()
        assert _tree(paths.pair_dir) == want, point  # the same pair a clean run publishes
        now = {rel: (os.stat(paths.pair_dir / rel).st_ino, os.stat(paths.pair_dir / rel).st_mtime_ns)
               for rel in kept}
        assert now == kept, f"{point}: a complete shard was written again"
        if point.startswith("shard#"):
            assert len(kept) == int(point.split("#")[1])
        shards = [k for k in want if k.endswith((".parquet", ".mp4")) and "/meta/" not in k]
        report.append((point, state == old, len(kept), len(shards), job["reused_episodes"]))
        old = job["job_id"]
    for r in report:
        print("kill at {:<16} old pair in place: {!s:<5} shards kept {:2d}/{:2d}, episodes reused {}".format(*r))
    # killed after both subsets: the rerun reads no source episode again
    assert dict((r[0], r[4]) for r in report)["verified"] == N_EPISODES
