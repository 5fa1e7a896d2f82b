"""Episode units in worker processes (export/pool.py) give the serial path's output.

Every format is exported once serially (export.workers 1) and once by two worker processes;
the files are byte-identical and the JSON metadata equal but for the job id and the time.
A worker that dies on one episode fails the job with that episode named, and the rerun
reuses what the other workers finished. SIGKILL of the exporting process at random moments
leaves no worker behind and the rerun completes.
"""

from __future__ import annotations

import contextvars
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from dsfactory import Ep, make_dataset, without_keys
from export_faults import faulty_service

from eva_export import pool, pool_meter
from eva_export.config import parse_config
from eva_export.errors import ConfigError
from eva_export.export.paths import ExportPaths
from eva_export.export.runner import ExportService
from eva_export.export.verify_pair import verify_staged
from eva_export.formats.common.card import CARD_FILE
from eva_export.formats.registry import get_exporter
from eva_export.jobs import COMPLETED, FAILED
from eva_export.manifest import MANIFEST_FILE, verify_manifest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap")
VOLATILE = {"job_id", "created_at", "source_dir"}  # the two runs differ only in these

pytestmark = pytest.mark.timeout(600)


def _eps(n: int = 7) -> list[Ep]:
    return [Ep(frames=6 + i, quality="green" if i % 3 else "red") for i in range(n)]


def _service(log_dir: Path, workers: int, **kw: Any) -> ExportService:
    cfg = parse_config({"collection": {"log_dir": str(log_dir)}, "export": {"workers": workers}})
    return faulty_service(cfg, background=False, recover=False, **kw)


def _content(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        rel = str(p.relative_to(root))
        if rel.endswith(MANIFEST_FILE):
            # hashes of files that legitimately differ (job ids, times, source dir in the JSON
            # records): checked by verify_manifest below instead of compared byte for byte
            continue
        if p.name == CARD_FILE:  # the card names the same volatile values as the JSON records
            marker = json.loads((p.parent / "meta/quality_split.json").read_text())
            text = p.read_text()
            for key in sorted(VOLATILE):
                if marker.get(key):
                    text = text.replace(str(marker[key]), f"<{key}>")
            out[rel] = text
        elif p.suffix == ".json":
            out[rel] = without_keys(json.loads(p.read_text()), VOLATILE)
        elif p.suffix == ".jsonl":
            out[rel] = [without_keys(json.loads(line), VOLATILE) for line in p.read_text().splitlines() if line]
        else:
            out[rel] = p.read_bytes()
    return out


@pytest.fixture(autouse=True)
def _workers_see_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes import the test exporters too."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))


def test_pool_output_equals_serial_for_every_format(tmp_path: Path) -> None:
    outputs: dict[int, dict[str, dict[str, Any]]] = {}
    for workers in (1, 2):
        log_dir = tmp_path / f"w{workers}"
        src = make_dataset(log_dir / "demo" / "raw", _eps(), cameras=2, width=32, height=24)
        svc = _service(log_dir, workers)
        outputs[workers] = {}
        for fmt in FORMATS:
            job = svc.run(src, fmt)
            assert job.state == COMPLETED, job.error
            assert job.episodes_done == job.episodes_total  # progress counted every unit of every worker
            paths = ExportPaths.of(src, fmt)
            verify_staged(fmt, paths.pair_dir, get_exporter(fmt))  # the format's verifier reads the published pair back
            for subset in ("accepted", "rejected"):
                assert verify_manifest(paths.pair_dir / subset, required=True) == [], (fmt, subset)
            outputs[workers][fmt] = _content(paths.pair_dir)
    for fmt in FORMATS:
        serial, pooled = outputs[1][fmt], outputs[2][fmt]
        assert sorted(serial) == sorted(pooled), fmt
        different = [k for k in serial if serial[k] != pooled[k]]
        assert different == [], f"{fmt}: {different}"
        assert any(isinstance(v, bytes) and len(v) > 1000 for v in pooled.values())


def test_units_really_run_in_other_processes(tmp_path: Path) -> None:
    seen: list[int] = []
    units = [pool.Unit(f"episode {i}", os.getpid, ()) for i in range(6)]
    with pool.LocalPool(2) as p, pool.using(p):
        pool.run_units(units, lambda u, pid: seen.append(pid))
    assert len(seen) == 6 and os.getpid() not in seen and len(set(seen)) == 2


def test_workers_outlive_the_thread_that_first_used_them() -> None:
    """The kernel kills a worker when the thread that started it ends (PR_SET_PDEATHSIG): units
    run first from a short-lived thread (the v3 job's read-ahead feed) must leave the workers to
    the units run after it (the next subset), not a broken pipe."""
    import threading

    first: list[int] = []
    with pool.LocalPool(2) as p, pool.using(p):
        ctx = contextvars.copy_context()
        t = threading.Thread(target=ctx.run, args=(pool.run_units, [pool.Unit(f"episode {i}", os.getpid, ())
                                                                    for i in range(4)],
                                                   lambda u, pid: first.append(pid)))
        t.start()
        t.join()
        workers = [w.proc for w in p._procs]
        assert len(first) == 4 and os.getpid() not in first and len(workers) == 2
        later: list[int] = []
        pool.run_units([pool.Unit(f"episode {i}", os.getpid, ()) for i in range(4)], lambda u, pid: later.append(pid))
        assert set(later) <= set(first) and all(w.poll() is None for w in workers)  # the same, living workers


def test_worker_exception_is_raised_in_the_job(tmp_path: Path) -> None:
    """A unit's own error (a fault at split unit 4) comes back from the worker unchanged."""
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", _eps(8), cameras=1, width=32, height=24)
    job = _service(log_dir, 2, fail_at="unit:4").run(src, "hdf5")
    assert job.state == FAILED and "source episode 4" in job.error and "injected failure at 'unit:4'" in job.error


def test_worker_crash_names_the_episode_and_rerun_resumes(tmp_path: Path) -> None:
    import pool_helpers

    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=8, quality="green") for _ in range(8)],
                       cameras=1, width=32, height=24)
    job = _service(log_dir, 2, exporters={"hdf5": pool_helpers.CrashingHdf5}).run(src, "hdf5")
    assert job.state == FAILED
    assert job.error.startswith("episode 3: the worker process") and "died while writing it" in job.error, job.error
    paths = ExportPaths.of(src, "hdf5")
    assert not paths.pair_dir.exists() and paths.staging.is_dir()  # nothing published, staging kept
    finished = list((paths.staging / "out" / "accepted").rglob("episode_*.hdf5"))
    assert 3 <= len(finished) < 8
    job = _service(log_dir, 2).run(src, "hdf5")
    assert job.state == COMPLETED, job.error
    rep = get_exporter("hdf5").verify(paths.accepted)
    assert rep.ok and rep.episodes == 8, rep.errors


def test_workers_config_and_cli(tmp_path: Path) -> None:
    for bad in (-1, "2", 1.5, True):
        with pytest.raises(ConfigError, match="export.workers"):
            parse_config({"collection": {"log_dir": str(tmp_path)}, "export": {"workers": bad}})
    assert parse_config({"collection": {"log_dir": str(tmp_path)}}).export.workers == 0
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", _eps(4), cameras=1, width=32, height=24)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "eva_export.cli", "export", str(src), "--format", "mcap",
                          "--workers", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["state"] == COMPLETED
    out = subprocess.run([sys.executable, "-m", "eva_export.cli", "export", str(src), "--format", "mcap",
                          "--workers", "-3"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "--workers" in out.stderr


def _pool_workers_of(pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "eva_export.pool" in cmd and cmd[-1] == str(pid):
            found.append(p)
    return found


def test_sigkill_with_workers_leaves_no_worker_and_resumes(tmp_path: Path) -> None:
    rng = random.Random(18)
    log_dir = tmp_path / "logs"
    n = 12
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=24, quality="green" if i % 4 else "red") for i in range(n)],
                       cameras=2, width=64, height=48)
    cmd = [sys.executable, "-m", "eva_export.cli", "export", str(src), "--format", "hdf5", "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    paths = ExportPaths.of(src, "hdf5")
    t0 = time.monotonic()
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    full_s = time.monotonic() - t0
    assert first.returncode == 0, first.stderr
    reused_total = 0
    for trial in range(6):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if trial % 2:
            k = rng.randrange(1, n)
            deadline = time.monotonic() + 120
            while (time.monotonic() < deadline and proc.poll() is None
                   and len(list(paths.staging.glob("out/*/data/*/episode_*.hdf5"))) < k):
                time.sleep(0.005)
        else:
            time.sleep(rng.uniform(0.0, full_s))
        workers = _pool_workers_of(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == [], f"trial {trial}: workers outlived the killed export: {alive}"
        time.sleep(0.3)  # a worker started just before the kill: the kernel ends it too (PDEATHSIG)
        late = [p for p in _pool_workers_of(proc.pid) if p.status() != psutil.STATUS_ZOMBIE]
        assert late == [], f"trial {trial}: workers outlived the killed export: {late}"
        rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        job = json.loads(rerun.stdout)
        reused_total += job["reused_episodes"]
        for sub in (paths.accepted, paths.rejected):
            rep = get_exporter("hdf5").verify(sub)
            assert rep.ok, rep.errors
        assert not paths.staging.exists()
    print(f"6 kills with 2 workers; reruns reused {reused_total} split units; full run {full_s:.1f}s")


def test_auto_pool_runs_cheap_units_in_the_caller_and_starts_workers_for_heavy_ones() -> None:
    """export.workers 0 (auto): a worker's start-up costs more than a millisecond unit; units of
    seconds go to the workers, after the first ones ran in the caller."""
    import pool_helpers

    with pool.LocalPool(2, auto=True) as p, pool.using(p):
        cheap: list[int] = []
        pool.run_units([pool.Unit(f"episode {i}", os.getpid, ()) for i in range(5)], lambda u, pid: cheap.append(pid))
        assert cheap == [os.getpid()] * 5 and p.serial_units == 5 and not p._procs  # no worker started
        heavy: list[int] = []
        units = [pool.Unit(f"episode {i}", pool_helpers.sleep_then_pid, (0.3,)) for i in range(8)]
        pool.run_units(units, lambda u, pid: heavy.append(pid))
    assert len(heavy) == 8 and heavy[0] == os.getpid()  # the first one measured the cost ...
    assert os.getpid() not in heavy[-4:] and len(set(heavy) - {os.getpid()}) >= 1  # ... then workers



def test_units_that_compute_get_the_larger_serial_budget() -> None:
    """Units busy on the CPU in the caller stay there up to SERIAL_BUDGET_CPU_S of projected
    work (workers would compete for the same cores and pay their imports); units that wait
    (I/O, sleep) keep the small budget, where workers overlap the waits."""
    assert pool_meter.SERIAL_BUDGET_CPU_S > pool_meter.SERIAL_BUDGET_S
    assert pool_meter.serial_budget_s(2.0, 1.9) == pool_meter.SERIAL_BUDGET_CPU_S
    assert pool_meter.serial_budget_s(2.0, 0.1) == pool_meter.SERIAL_BUDGET_S
    assert pool_meter.serial_budget_s(0.0, 0.0) == pool_meter.SERIAL_BUDGET_S
