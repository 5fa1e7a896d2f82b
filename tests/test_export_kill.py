"""SIGKILL ``eva-export export`` at random moments; the final pair is never half-published.

After each kill the final paths hold no pair, the old complete pair or the new complete pair;
then a rerun completes, and reuses the episode units the killed run finished.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export.export.paths import ExportPaths
from eva_export.export.records import QualitySplit
from eva_export.formats.common.meta import read_info
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.formats.lerobot_v21.writer import DatasetWriter

REPO = Path(__file__).resolve().parents[1]
TRIALS = int(os.environ.get("EVA_KILL_TRIALS", "24"))
N_EPISODES = 20

pytestmark = pytest.mark.timeout(600)


def _cmd(config: Path, src: Path) -> list[str]:
    return [sys.executable, "-m", "eva_export.cli", "export", "--config", str(config), "--source", str(src),
            "--format", "lerobot_v21"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _wait_for(proc: subprocess.Popen[bytes], cond) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None and not cond():
        time.sleep(0.0005)


def _pair(paths: ExportPaths) -> str | None:
    """The job id of the complete pair in place, or None; fails on a half pair."""
    if not paths.pair_dir.exists():
        assert not paths.accepted.exists() and not paths.rejected.exists()
        return None
    assert sorted(os.listdir(paths.pair_dir)) == ["accepted", "rejected"], os.listdir(paths.pair_dir)
    qa, qr = QualitySplit.read(paths.accepted), QualitySplit.read(paths.rejected)
    assert qa.job_id == qr.job_id, f"half pair: accepted {qa.job_id} beside rejected {qr.job_id}"
    assert sorted(qa.source_episode_indices + qr.source_episode_indices) == list(range(N_EPISODES))
    for d in (paths.accepted, paths.rejected):
        rep = verify_v21(d, decode_frames=False)
        assert rep.ok, rep.errors
    return qa.job_id


def test_sigkill_never_leaves_half_a_pair(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("EVA_KILL_SEED", "7")))
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw",
                       [Ep(frames=20, quality="green" if i % 3 else "red") for i in range(N_EPISODES)],
                       cameras=2, width=32, height=24)
    config = tmp_path / "config.yaml"
    config.write_text(f'collection:\n  log_dir: "{log_dir}"\n')
    paths = ExportPaths.of(src, "lerobot_v21")

    t0 = time.monotonic()
    done = subprocess.run(_cmd(config, src), env=_env(), capture_output=True, text=True, timeout=120)
    full_s = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    old = json.loads(done.stdout)["job_id"]
    assert _pair(paths) == old

    results = []
    kinds: set[str] = set()
    for trial in range(TRIALS):
        if trial % 2 == 0:  # a review changes the source: the killed run would publish a new pair
            w = DatasetWriter.open(src, fps=30, features=read_info(src).features, robot_type="test")
            w.review(rng.randrange(N_EPISODES), "", f"note {trial}")
        proc = subprocess.Popen(_cmd(config, src), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        mode = trial % 4
        if mode == 2:
            delay = rng.uniform(0.0, full_s * 1.1)  # any moment of the run
            time.sleep(delay)
            how = f"after {delay:.2f}s"
        elif mode == 3:  # around the publication: once both subsets are assembled in staging
            delay = rng.uniform(0.0, 0.01)
            _wait_for(proc, lambda: (paths.staging / "native/rejected/meta/quality_split.json").is_file())
            time.sleep(delay)
            how = f"publish+{delay * 1000:.1f}ms"
        else:  # a moment inside the split: once k units are renamed into place
            k = rng.randrange(1, N_EPISODES)
            _wait_for(proc, lambda: len(list(paths.staging.glob("units/*/ep_*"))) >= k)  # noqa: B023 - waited on here
            how = f"after {k} units"
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        state = _pair(paths)  # never half: none, the old pair or a new complete pair
        kind = "none" if state is None else ("old" if state == old else "new")
        rerun = subprocess.run(_cmd(config, src), env=_env(), capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr
        job = json.loads(rerun.stdout)
        assert _pair(paths) == job["job_id"]
        assert paths.backups() == [] and not paths.staging.exists()
        results.append((trial, how, proc.returncode, kind, job["reused_episodes"]))
        kinds.add(kind)
        old = job["job_id"]
    for r in results:
        print("trial {:2d} kill {!s:<14} rc={} final after kill: {!s:<4} rerun reused {:d} episodes".format(*r))
    reused = [r[4] for r in results]
    print(f"{len(results)} kills; reruns reused episodes in {sum(1 for x in reused if x)} trials "
          f"(total {sum(reused)}); final states seen after kills: {sorted(kinds)}; full run {full_s:.2f}s")
    assert len(results) == TRIALS  # every trial killed a run and checked its rerun
    assert any(x > 0 for x in reused)

