"""A running job whose process stops (SIGSTOP) is shown as stalled, not only as running.

A real child process runs a job through the JobEngine (the body waits on its stdin, so the job
stays running for as long as the test wants) with a short heartbeat. The listing
(``eva-export jobs``) and what GetJob answers (the export service's ``get`` and ``state_text``)
say "running" while the heartbeat advances, "stalled" once the stopped process has missed it
for longer than the stated time, and "running" again after SIGCONT.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eva_export.config import parse_config
from eva_export.export.runner import ExportService
from eva_export.jobs import RUNNING, Job, JobStore, state_text

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT_S = 0.2
#: Far above the heartbeat (a busy core delays a thread by far less), far below a test's patience.
STALLED_AFTER_S = 4.0
DEADLINE_S = 60.0

CHILD = r"""
import sys
from pathlib import Path
from eva_export.jobs import Job, JobEngine, JobStore

store = JobStore(Path(sys.argv[1]))
engine = JobEngine(store, name="export", claim=True, recover=False, heartbeat_s=float(sys.argv[2]))
job = engine.add(Job.new("export", sys.argv[3], "hdf5"))
print(job.job_id, flush=True)
engine.execute(job.job_id, lambda _id: sys.stdin.read() and None)
"""


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    log_dir = tmp_path / "logs"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"collection": {"log_dir": str(log_dir)}}))
    jobs_dir = parse_config({"collection": {"log_dir": str(log_dir)}}).export.jobs_dir
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(jobs_dir), str(HEARTBEAT_S), str(tmp_path / "raw")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        yield proc, job_id, config
    finally:
        if proc.poll() is None:  # a failed test: resume and end the child it started
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(30)


def record(config: Path, job_id: str) -> Job:
    jobs_dir = parse_config(yaml.safe_load(config.read_text())).export.jobs_dir
    job = JobStore(jobs_dir).get(job_id)
    assert job is not None
    return job


def wait_for(what: str, check: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def listed_status(config: Path, job_id: str) -> str:
    out = subprocess.run([sys.executable, "-m", "eva_export.cli", "jobs", "--config", str(config),
                          "--stalled-after", str(STALLED_AFTER_S)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    (job,) = [j for j in json.loads(out.stdout) if j["job_id"] == job_id]
    assert job["state"] == "running"  # the record keeps its state: the job may resume
    return str(job["status"])


def test_a_stopped_job_is_shown_stalled_and_running_again_after_it_resumes(
        runner: tuple[subprocess.Popen[str], str, Path]) -> None:
    proc, job_id, config = runner
    wait_for("the job to run", lambda: record(config, job_id).state == RUNNING)
    first = record(config, job_id).heartbeat_at
    wait_for("a heartbeat without progress", lambda: record(config, job_id).heartbeat_at > first)
    assert listed_status(config, job_id) == "running"

    os.kill(proc.pid, signal.SIGSTOP)
    wait_for("the heartbeat to age", lambda: time.time() - record(config, job_id).heartbeat_at > STALLED_AFTER_S + 0.5)
    status = listed_status(config, job_id)
    assert status.startswith("stalled") and f"process {proc.pid}" in status, status
    # what GetJob answers for a job of another process: the export service reads the record
    service = ExportService(parse_config(yaml.safe_load(config.read_text())), background=False, recover=False)
    job = service.get(job_id)
    assert job is not None and state_text(job, STALLED_AFTER_S).startswith("stalled")

    os.kill(proc.pid, signal.SIGCONT)
    wait_for("the heartbeat to resume", lambda: time.time() - record(config, job_id).heartbeat_at < 1.0)
    assert listed_status(config, job_id) == "running"
    assert proc.stdin is not None
    proc.stdin.close()  # the body returns: the job completes
    assert proc.wait(DEADLINE_S) == 0
    done = record(config, job_id)
    assert done.state == "completed" and state_text(done, 0.0) == "completed"


@pytest.mark.timeout(180)
def test_get_job_of_the_export_node_answers_stalled(node_factory, ros_client, config_file: Path,  # type: ignore[no-untyped-def]
                                                    tmp_path: Path) -> None:
    """A job record left by a process that is stopped (alive, SIGSTOP) and last recorded it
    120 s ago: the export node's GetJob answers "stalled" and keeps the state running."""
    from eva_export_interfaces.srv import GetJob

    jobs_dir = parse_config(yaml.safe_load(config_file.read_text())).export.jobs_dir
    stopped = subprocess.Popen(["sleep", "600"])
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        job = dataclasses.replace(Job.new("export", str(tmp_path / "datasets" / "demo" / "raw"), "hdf5"),
                                  state=RUNNING, pid=stopped.pid, host=socket.gethostname())
        store = JobStore(jobs_dir)
        store.save(job)
        d = json.loads(store.path(job.job_id).read_text())
        d["heartbeat_at"] -= 120  # as the stopped process left it
        store.path(job.job_id).write_text(json.dumps(d))
        node = node_factory("export_node", params={"config_file": str(config_file)})
        ros_client.wait_for_services([node.service("get_job")], procs=[node])
        reply = ros_client.call(GetJob, node.service("get_job"), GetJob.Request(job_id=job.job_id))
        assert reply.success and reply.job.state == "running", reply.message
        assert reply.message.startswith("stalled") and f"process {stopped.pid}" in reply.message, reply.message
    finally:
        stopped.kill()  # SIGKILL ends a stopped process too
        stopped.wait(30)
