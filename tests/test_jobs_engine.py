"""The job engine shared by the export and upload services (and a future ingest job)."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from eva_export.errors import ExportError
from eva_export.jobs import (
    BUSY,
    COMPLETED,
    FAILED,
    IDLE,
    QUEUED,
    RUNNING,
    Job,
    JobEngine,
    JobKind,
    JobState,
    JobStore,
    QueuePolicy,
)


def engine(tmp_path: Path, **kw: object) -> JobEngine:
    return JobEngine(JobStore(tmp_path / "jobs"), name="test", **kw)  # type: ignore[arg-type]


def test_job_is_frozen_and_stored_as_plain_strings(tmp_path: Path) -> None:
    job = Job.new(JobKind.INGEST, "/src", "bag")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = RUNNING  # type: ignore[misc]
    store = JobStore(tmp_path / "jobs")
    store.save(dataclasses.replace(job, state=RUNNING))
    on_disk = json.loads(store.path(job.job_id).read_text())
    assert on_disk["state"] == "running" and on_disk["kind"] == "ingest" and job.job_id.startswith("ingest-")
    back = store.get(job.job_id)
    assert back is not None and back.state is JobState.RUNNING and back.state == "running"


def test_serial_runs_in_order_and_reports_status(tmp_path: Path) -> None:
    eng = engine(tmp_path, policy=QueuePolicy.SERIAL)
    gate = threading.Event()
    order: list[str] = []

    def body(job_id: str) -> dict[str, int]:
        gate.wait(30)
        order.append(job_id)
        return {"episodes_done": 1}

    a, b = (eng.add(Job.new("export", f"/s{i}", "hdf5")) for i in range(2))
    eng.submit(a.job_id, body)
    eng.submit(b.job_id, body)
    eng.start_worker()
    try:
        st = eng.status()
        assert st.state == BUSY and st.queued + st.running == 2
        assert eng.get(b.job_id).state == QUEUED  # type: ignore[union-attr]
        gate.set()
        done = eng.wait(b.job_id, timeout=30)
        assert done is not None and done.state == COMPLETED and done.episodes_done == 1
        assert order == [a.job_id, b.job_id]
        st = eng.status()
        assert (st.state, st.queued, st.running) == (IDLE, 0, 0) and st.current == done
        assert JobStore(tmp_path / "jobs").get(b.job_id) == done  # recorded as it finished
    finally:
        eng.close()


def test_parallel_failure_crash_and_on_failure(tmp_path: Path) -> None:
    changes: list[Job] = []
    eng = engine(tmp_path, policy=QueuePolicy.PARALLEL, crash_prefix="unexpected ", on_change=changes.append)

    def refused(_job_id: str) -> None:
        raise ExportError("source changed")

    def crash(_job_id: str) -> None:
        raise KeyError("bug")

    a, b = (eng.add(Job.new("upload", f"/s{i}", "hdf5")) for i in range(2))
    eng.submit(a.job_id, refused, on_failure=lambda job: {"staging_dir": f"{job.source_dir}/.staging"})
    eng.submit(b.job_id, crash)
    fa, fb = eng.wait(a.job_id, 30), eng.wait(b.job_id, 30)
    assert fa is not None and (fa.state, fa.error, fa.staging_dir) == (FAILED, "source changed", "/s0/.staging")
    assert fb is not None and fb.state == FAILED and fb.error == "unexpected KeyError: 'bug'"
    assert fa.finished_at >= fa.created_at
    assert {j.state for j in changes if j.job_id == a.job_id} == {QUEUED, RUNNING, FAILED}


def test_saves_are_throttled_unless_forced(tmp_path: Path) -> None:
    eng = engine(tmp_path, save_period_s=3600)
    job = eng.add(Job.new("export", "/s", "hdf5"))
    store = JobStore(tmp_path / "jobs")
    eng.save(job.job_id, force=True)
    eng.count(job.job_id, episodes_done=2, bytes_done=10)
    eng.save(job.job_id)  # within the period: not written
    assert store.get(job.job_id).episodes_done == 0  # type: ignore[union-attr]
    assert eng.get(job.job_id).episodes_done == 2  # type: ignore[union-attr]  # the live snapshot
    eng.save(job.job_id, force=True)
    assert store.get(job.job_id).bytes_done == 10  # type: ignore[union-attr]


def test_restart_marks_unfinished_jobs_failed(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs")
    left = Job.new("export", "/s", "hdf5", state=RUNNING)
    done = Job.new("export", "/t", "hdf5", state=COMPLETED)
    store.save(left)
    store.save(done)
    eng = engine(tmp_path)
    assert [j.job_id for j in eng.interrupted] == [left.job_id]
    got = eng.get(left.job_id)
    assert got is not None and got.state == FAILED and "interrupted" in got.error
    assert eng.get(done.job_id).state == COMPLETED  # type: ignore[union-attr]
    assert engine(tmp_path, recover=False).interrupted == []
