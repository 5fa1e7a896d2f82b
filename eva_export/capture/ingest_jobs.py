"""Bag ingest jobs of the capture engine (a part of Recorder): the request checks, the job on
the common JobEngine, and the background thread that runs ``BagIngest`` through the same
``EpisodeRun`` path as live capture.

A mixin, because "is capture idle?" and "is an ingest running?" are one decision under
Recorder's lock (START is refused while a bag is ingested, an ingest while recording).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import confine
from ..config import CollectionConfig
from ..errors import EvaError, UnsafeNameError
from ..jobs import Job, JobEngine, JobStore
from .episode import EpisodeRun
from .writer_cache import DatasetWriters

if TYPE_CHECKING:  # imported where an ingest starts
    from .ingest import BagIngest, IngestProgress


class IngestJobs:
    """Ingest jobs (mixed into Recorder)."""

    col: CollectionConfig
    last_message: str
    _lock: threading.Lock
    _episode: EpisodeRun | None
    _save_depth: int
    _ingesting: str
    _jobs: JobEngine | None
    datasets: DatasetWriters

    @property
    def jobs(self) -> JobEngine:
        """Ingest jobs on the same engine as export and upload jobs (states, claims, saves);
        a job a previous process left unfinished is failed as interrupted when it opens."""
        if self._jobs is None:
            self._jobs = JobEngine(JobStore(self.col.log_dir / ".jobs" / "ingest"), name="ingest", claim=True)
        return self._jobs

    def ingest_roots(self) -> list[Path]:
        return [Path(r).expanduser().absolute() for r in self.col.capture.ingest_roots] or [self.col.log_dir]

    def ingest(self, bag_path: str, dataset_name: str = "", task: str = "", episodes: str = "") -> Job:
        """Check the request and the bag, then ingest it in a background thread; returns the job.

        Raises EvaError (with the reason) when refused: recording, another ingest running, a
        bag outside the ingest roots, a bag that is not a ROS 2 MCAP bag, a missing topic.
        """
        from .ingest import BagIngest

        confine.check_request_path(bag_path, "bag_path")
        path = Path(bag_path)
        roots = self.ingest_roots()
        if not path.is_absolute() or not any(confine.is_inside(r, path) for r in roots):
            raise UnsafeNameError(f"bag_path {confine.short_repr(bag_path)} is not inside the ingest roots "
                                  f"{[str(r) for r in roots]} (collection.capture.ingest_roots)")
        with self._lock:
            if self._episode is not None or self._save_depth:
                raise EvaError("an episode is being recorded or saved; ingest when capture is idle")
            if self._ingesting:
                raise EvaError(f"another bag is being ingested (job {self._ingesting})")
            self._ingesting = "starting"
        try:
            job = Job.new("ingest", str(path), "lerobot_v21")
            job_id = job.job_id
            ing = BagIngest(self.col, path, dataset_name, task, episodes, roots=roots,
                            writer_for=lambda name: self.datasets.writer_for(name, create=True),
                            progress=lambda p: self._ingest_progress(job_id, p))
            job = self.jobs.add(dataclasses.replace(job, accepted_dir=str(self.col.dataset_dir(ing.dataset_name)),
                                                    bytes_total=ing.progress.bytes_total))
        except BaseException:
            with self._lock:
                self._ingesting = ""
            raise
        with self._lock:
            self._ingesting = job_id
        threading.Thread(target=self._run_ingest, args=(job_id, ing), name="capture-ingest", daemon=True).start()
        return job

    def _ingest_progress(self, job_id: str, p: IngestProgress) -> None:
        self.jobs.update(job_id, messages_done=p.messages_done, episodes_done=p.episodes_done,
                         bytes_done=p.bytes_done,
                         accepted_episodes=sum(1 for e in p.episodes if e["quality"] == "green"),
                         rejected_episodes=sum(1 for e in p.episodes if e["quality"] == "red"),
                         reused_episodes=p.episodes_skipped)
        self.jobs.save(job_id)

    def _run_ingest(self, job_id: str, ing: BagIngest) -> None:
        def body(_job_id: str) -> dict[str, object]:
            res = ing.run()
            self._ingest_progress(job_id, res)
            self.last_message = res.message
            return {"last_error": res.damage}

        try:
            job = self.jobs.execute(job_id, body)  # RUNNING (claimed), then COMPLETED or FAILED with the reason
            if job.error:
                self.last_message = f"ingest failed: {job.error}"
        finally:
            with self._lock:
                self._ingesting = ""

    def wait_ingested(self, timeout: float = 120.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self._ingesting:
                return True
            time.sleep(0.05)
        return False
