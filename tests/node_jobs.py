"""Polling a node's GetJob until a job finishes (the export node tests share it)."""

from __future__ import annotations

import time

from eva_export_interfaces.srv import GetJob


def wait_job(ros_client, node, job_id: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        reply = ros_client.call(GetJob, node.service("get_job"), GetJob.Request(job_id=job_id))
        assert reply.success, reply.message
        if reply.job.state in ("completed", "failed"):
            return reply.job
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")
