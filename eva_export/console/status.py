"""The status line and the jobs of one dataset, as the dataset's own pages show them.

The export and upload nodes publish one queue status each (with their current or last job);
a page about dataset A must not show dataset B's last export, so the line keeps a job only
when its source_dir is this dataset's root, and the jobs this console started are booked per
dataset so that a reloaded page can follow them again.
"""

from __future__ import annotations

import threading

KINDS = ("export", "upload")


class JobBook:
    """Jobs started from this console, per dataset name (latest last), in memory only."""

    def __init__(self, keep: int = 20) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, list[dict[str, str]]] = {}
        self._keep = keep

    def started(self, dataset: str, kind: str, job_id: str) -> None:
        with self._lock:
            jobs = self._jobs.setdefault(dataset, [])
            jobs.append({"kind": kind, "job_id": job_id})
            del jobs[:-self._keep]

    def of(self, dataset: str) -> list[dict[str, str]]:
        with self._lock:
            return [dict(j) for j in self._jobs.get(dataset, [])]


def status_for(raw: dict[str, object], source_dir: str | None) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(status line parts, jobs of this dataset seen on the topics) from the backend's status.

    ``raw`` maps capture to a string and export/upload to ``{"queue": str, "job": {...}}``."""
    line: dict[str, str] = {"capture": str(raw.get("capture", "no status yet"))}
    seen: list[dict[str, str]] = []
    for kind in KINDS:
        entry = raw.get(kind)
        if not isinstance(entry, dict):
            line[kind] = str(entry or "no status yet")
            continue
        text = str(entry.get("queue", "no status yet"))
        job = entry.get("job") or {}
        if source_dir and isinstance(job, dict) and job.get("source_dir") == source_dir and job.get("job_id"):
            text += f", last {job['job_id']} {job.get('state', '')}"
            seen.append({"kind": kind, "job_id": str(job["job_id"])})
        line[kind] = text
    return line, seen
