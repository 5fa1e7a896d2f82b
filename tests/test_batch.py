"""``eva-export batch``: every raw dataset under a root, one failing never stops the others.

The local-pool batch runs through the CLI in a subprocess; the Ray batch runs in a local Ray
instance (``ray.init(num_cpus=2)``, started once for this module: it costs ~10-15 s here)
through the CLI entry point with ``--ray auto`` (the already initialised instance).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export import cli
from eva_export.export.batch import find_datasets
from eva_export.export.paths import ExportPaths
from eva_export.export.records import QualitySplit
from eva_export.formats.registry import get_exporter

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(900)


def fleet_day(root: Path, n: int, broken: int | None) -> list[Path]:
    """``n`` small datasets (robot_k/raw and one with another name), dataset ``broken`` with a
    truncated episode Parquet (validation refuses it)."""
    out = []
    for k in range(n):
        name = f"robot_{k}/raw" if k % 2 == 0 else f"robot_{k}/take_{k}"
        src = make_dataset(root / name, [Ep(frames=5 + j, quality="green" if (j + k) % 2 else "red")
                                         for j in range(3 + k % 3)], cameras=1, width=32, height=24)
        out.append(src)
    if broken is not None:
        p = sorted((out[broken] / "data").rglob("*.parquet"))[1]
        p.write_bytes(p.read_bytes()[:64])
    return out


def check_published(src: Path, fmt: str) -> None:
    paths = ExportPaths.of(src, fmt)
    for sub in (paths.accepted, paths.rejected):
        rep = get_exporter(fmt).verify(sub)
        assert rep.ok, rep.errors


def test_find_datasets_skips_exports_and_hidden(tmp_path: Path) -> None:
    srcs = fleet_day(tmp_path, 3, None)
    (tmp_path / ".hidden" / "x" / "meta").mkdir(parents=True)
    (tmp_path / ".hidden" / "x" / "meta" / "info.json").write_text("{}")
    assert find_datasets(tmp_path) == sorted(srcs)


def test_local_batch_cli(tmp_path: Path) -> None:
    srcs = fleet_day(tmp_path / "day", 4, broken=2)
    cmd = [sys.executable, "-m", "eva_export.cli", "batch", str(tmp_path / "day"), "--format", "mcap",
           "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr  # one dataset failed
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["dataset", "accepted", "rejected", "time", "s", "result"]
    assert lines[-1] == "4 datasets: 3 published, 0 skipped, 1 failed"
    bad = next(ln for ln in lines if "robot_2/raw" in ln)
    assert "failed" in bad and "episode 1" in bad and "episode_000001.parquet" in bad
    for i, src in enumerate(srcs):
        if i != 2:
            check_published(src, "mcap")
    assert not ExportPaths.of(srcs[2], "mcap").pair_dir.exists()
    out = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=600)
    res = json.loads(out.stdout)
    assert [r["result"] for r in res] == ["skipped", "skipped", "failed", "skipped"]


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()


def test_ray_batch_one_broken_rerun_skips(tmp_path: Path, ray_local: None, capsys: pytest.CaptureFixture[str]) -> None:
    srcs = fleet_day(tmp_path / "day", 5, broken=3)
    rc = cli.main(["batch", str(tmp_path / "day"), "--format", "hdf5", "--ray", "auto", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [r["result"] for r in res] == ["published", "published", "published", "failed", "published"]
    assert "episode_000001.parquet" in res[3]["error"]
    for i, src in enumerate(srcs):
        if i != 3:
            check_published(src, "hdf5")
            q = QualitySplit.read(ExportPaths.of(src, "hdf5").accepted)
            assert q.job_id == res[i]["job_id"]
    # a review of one dataset: the rerun exports that one again and skips the others
    ep = srcs[0] / "meta" / "episodes.jsonl"
    rows = [json.loads(x) for x in ep.read_text().splitlines()]
    rows[0]["qc_verdict"] = "pass"
    ep.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = cli.main(["batch", str(tmp_path / "day"), "--format", "hdf5", "--ray", "auto", "--json"])
    res2 = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [r["result"] for r in res2] == ["published", "skipped", "skipped", "failed", "skipped"]
    assert res2[0]["job_id"] != res[0]["job_id"]
    check_published(srcs[0], "hdf5")


def test_ray_pool_runs_units_in_ray_workers_and_names_a_crash(ray_local: None) -> None:
    from eva_export import pool
    from eva_export.export.batch import RayPool

    rp = RayPool.connect("auto", 2)
    seen: list[int] = []
    rp.run([pool.Unit(f"episode {i}", os.getpid, ()) for i in range(4)], lambda u, pid: seen.append(pid))
    assert len(seen) == 4 and os.getpid() not in seen
    with pytest.raises(pool.UnitError, match=r"^episode 7: the Ray worker died while writing it"):
        rp.run([pool.Unit("episode 6", os.getpid, ()), pool.Unit("episode 7", os._exit, (3,))],
               lambda u, r: None)
    rp.close()  # joined an existing instance: leaves it running
    import ray

    assert ray.is_initialized()
