"""A large job's warm worker (pool.warm_for): it says READY once started, takes two units in
flight in order, proves the source's last episodes while the first ones are validated
(formats/lerobot_v21/prove_ahead.py), then reads episodes for the direct v3 writer or builds
the native split's units. The published pair is byte for byte the serial job's; a fault is reported as validation reports it;
a file changed after the worker proved it is checked again, not trusted."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset
from export_faults import faulty_service
from test_export_pool import _content

from eva_export import pool
from eva_export.config import parse_config
from eva_export.errors import ExportError
from eva_export.export.paths import ExportPaths
from eva_export.export.verify_pair import verify_staged
from eva_export.formats.lerobot_v21 import prove_ahead
from eva_export.formats.registry import get_exporter
from eva_export.jobs import COMPLETED, FAILED

pytestmark = pytest.mark.timeout(600)
EPISODES = 14


@pytest.fixture(autouse=True)
def _small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thresholds of a large job, scaled to a test's dataset (the worker reads none of them)."""
    monkeypatch.setattr(pool, "WARM_EPISODES", 8)
    monkeypatch.setattr(prove_ahead, "BATCH", 3)
    monkeypatch.setattr(prove_ahead, "MIN_EPISODES", 6)


def dataset(root: Path) -> Path:
    """The source, its files dated a minute back: a file written in the last seconds is never
    keyed by its identity (video_facts.RACY_MARGIN_NS), so nothing about it is proven or kept."""
    raw = make_dataset(root / "ds" / "raw", [Ep(frames=3 + i % 4, quality="red" if i % 5 == 2 else "green")
                                             for i in range(EPISODES)], width=32, height=24)
    past = time.time() - 60
    for p in raw.rglob("*"):
        if p.is_file():
            os.utime(p, (past, past))
    return raw


def export(raw: Path, workers: int, fmt: str = "lerobot_v3") -> Any:
    """The job on ``raw`` (its data root: the dataset's parent, ds/)."""
    cfg = parse_config({"collection": {"log_dir": str(raw.parent)}, "export": {"workers": workers}})
    return faulty_service(cfg, background=False, recover=False).run(raw, fmt)


def wait_for_proofs(prover: prove_ahead.ProveAhead) -> None:
    """Until the worker's first batch of proofs arrived (it is started: the prover has a thread)."""
    deadline = time.monotonic() + 120
    while (not prover._pending and prover._thread is not None and prover._thread.is_alive()
           and time.monotonic() < deadline):
        time.sleep(0.01)


def test_a_worker_says_ready_and_keeps_two_units_in_order() -> None:
    with pool.LocalPool(2, auto=True) as p, pool.using(p):
        p.warm_up()
        assert p.warm and len(p._procs) == 1
        deadline = time.monotonic() + 120
        while not p.worker_ready() and time.monotonic() < deadline:  # a process starting: no timing asserted
            time.sleep(0.01)
        assert p.worker_ready()
        p.prestart(1)  # the units go to it (no serial start in the caller)
        got: list[int] = []
        p.run([pool.Unit(f"episode {i}", int, (i,)) for i in range(9)], lambda u, r: got.append(r), workers=1, depth=2)
        pids: list[int] = []
        p.run([pool.Unit(f"episode {i}", os.getpid, ()) for i in range(4)], lambda u, r: pids.append(r),
              workers=1, depth=2)
    assert got == list(range(9))  # in the order sent, none lost
    assert len(set(pids)) == 1 and os.getpid() not in pids  # the one warm worker ran them


def test_a_worker_dying_with_two_units_in_flight_names_the_first() -> None:
    with pool.LocalPool(2, auto=True) as p:
        p.warm_up()
        p.prestart(1)
        units = [pool.Unit("episode 0", int, (0,)), pool.Unit("episode 1", os._exit, (3,)),
                 pool.Unit("episode 2", int, (2,))]
        done: list[int] = []
        with pytest.raises(pool.UnitError, match="episode 1: .*died"):
            p.run(units, lambda u, r: done.append(r), workers=1, depth=2)
    assert done == [0]


@pytest.mark.parametrize("fmt", ["lerobot_v3", "lerobot_v21"])
def test_the_warm_job_publishes_the_serial_jobs_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     fmt: str) -> None:
    applied: list[int] = []
    real_apply = prove_ahead.ProveAhead.apply

    def counting(self: prove_ahead.ProveAhead, n: int) -> None:
        if n == 0:
            wait_for_proofs(self)  # a test's source is validated before a worker starts
        applied.append(len(self._pending))
        real_apply(self, n)

    monkeypatch.setattr(prove_ahead.ProveAhead, "apply", counting)
    serial_raw = dataset(tmp_path / "a")
    warm_raw = tmp_path / "b" / "ds" / "raw"
    shutil.copytree(serial_raw, warm_raw)
    assert export(serial_raw, workers=1, fmt=fmt).state == COMPLETED
    assert sum(applied) == 0  # serial: no worker, nothing proven ahead
    job = export(warm_raw, workers=0, fmt=fmt)
    assert job.state == COMPLETED, job.error
    assert sum(applied) > 0  # the warm worker proved files the validating thread then found
    a = _content(ExportPaths.of(serial_raw, fmt).pair_dir)
    b = _content(ExportPaths.of(warm_raw, fmt).pair_dir)
    assert sorted(a) == sorted(b) and [k for k in a if a[k] != b[k]] == []


def break_table(path: Path) -> None:
    """A table one row short of its episodes.jsonl length (a new file: a new identity)."""
    t = pq.read_table(path)
    tmp = path.with_suffix(".tmp")
    pq.write_table(t.slice(0, t.num_rows - 1), tmp)
    os.replace(tmp, path)


def test_a_fault_is_reported_as_the_serial_job_reports_it(tmp_path: Path) -> None:
    errors = []
    for name, workers in (("serial", 1), ("warm", 0)):
        raw = dataset(tmp_path / name)
        break_table(raw / "data" / "chunk-000" / f"episode_{EPISODES - 2:06d}.parquet")
        job = export(raw, workers)
        assert job.state == FAILED
        errors.append(str(job.error).replace(str(tmp_path / name), "<root>"))
    assert errors[0] == errors[1] and f"episode {EPISODES - 2}" in errors[0]


def test_a_file_changed_after_its_proof_is_checked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = dataset(tmp_path)
    last = raw / "data" / "chunk-000" / f"episode_{EPISODES - 1:06d}.parquet"
    changed = threading.Event()
    real_apply = prove_ahead.ProveAhead.apply

    def change_once_proven(self: prove_ahead.ProveAhead, n: int) -> None:
        if not changed.is_set():  # first call: wait for the worker's first batch (the last episodes)
            wait_for_proofs(self)
            if any(f":{EPISODES - 1}:" in p.kind for p in self._pending):
                break_table(last)  # proven as it was; now one row short
                changed.set()
        real_apply(self, n)

    monkeypatch.setattr(prove_ahead.ProveAhead, "apply", change_once_proven)
    job = export(raw, workers=0)
    assert changed.is_set()  # the worker's proof of the old file had arrived
    assert job.state == FAILED and f"episode {EPISODES - 1}" in str(job.error) and str(last) in str(job.error)


def test_the_rejected_subset_is_verified_on_the_worker_with_the_same_findings(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    asides: list[object] = []
    real_beside = pool.beside

    def counting(unit: pool.Unit) -> pool.Aside | None:
        got = real_beside(unit)
        asides.append(got)
        return got

    monkeypatch.setattr(pool, "beside", counting)
    raw = dataset(tmp_path)
    assert export(raw, workers=0).state == COMPLETED
    assert [a is not None for a in asides] == [True]  # the warm worker verified the rejected subset
    pair = ExportPaths.of(raw, "lerobot_v3").pair_dir
    info = pair / "rejected" / "meta" / "info.json"
    info.write_text(info.read_text().replace('"fps": 30', '"fps": 29'))
    exporter = get_exporter("lerobot_v3")
    messages = []
    for workers in (1, 2):  # here alone, then with the rejected subset on a worker that is up
        with pool.LocalPool(workers) as p, pool.using(p):
            if workers > 1:
                p.prestart(1)
                deadline = time.monotonic() + 120
                while not p.worker_ready() and time.monotonic() < deadline:
                    time.sleep(0.01)
            with pytest.raises(ExportError) as err:
                verify_staged("lerobot_v3", pair, exporter)
            messages.append(str(err.value))
    assert [a is not None for a in asides] == [True, False, True]
    assert messages[0] == messages[1] and "rejected:" in messages[0]

    class Local(type(exporter)):  # type: ignore[misc]  # a class of a function's: it does not pickle
        pass

    with pool.LocalPool(2) as p, pool.using(p):
        p.prestart(1)
        deadline = time.monotonic() + 120
        while not p.worker_ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ExportError) as err:
            verify_staged("lerobot_v3", pair, Local())
    assert asides[-1] is not None and str(err.value) == messages[0]  # sent, refused on its way, verified here
