"""``eva-export batch ROOT --format F``: export every raw dataset under ROOT (a fleet's day).

Each dataset goes through the same ExportService job as ``eva-export export`` (validation,
resumable split units, format conversion units, verification of the staged pair, one
publication); only the executor of the episode units changes:

* without ``--ray``: one LocalPool of worker processes, shared by the datasets in turn;
* with ``--ray ADDRESS|auto|local``: the units are Ray tasks (``RayPool``) and several
  datasets are in flight at once, each driven by a thread of this (driver) process, which
  plans, assembles, verifies and publishes it. Ray is an optional extra, imported here only.

Resumable: a dataset whose published pair came from the batch's last export of the same
source state (``<export>/.batch-<format>.json`` records the source hash and the job id, the
pair's quality_split.json must carry that job id) is skipped; an interrupted one resumes from
its staging (finished units are reused). One failing dataset is reported and never stops the
others. Assumes every worker sees the same filesystem paths (see README, Shared storage).

With ``--merge`` the datasets are grouped by their task (a dataset's set of task texts) and each
group is one merged export (export/merge.py) named after the task, under ROOT: one verified
set per task of the day. Its record covers every source of the group.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import confine, pool
from ..config import Config, parse_config
from ..errors import DatasetError, EvaError, ExportError
from ..formats.common.meta import TASKS
from ..formats.common.records import TaskRow
from ..formats.lerobot_v21.validate import source_hash
from ..fsutil import atomic_write_json, iter_jsonl, read_json
from ..jobs import COMPLETED
from .paths import ExportPaths
from .records import QUALITY_SPLIT_FILE, QualitySplit

log = logging.getLogger(__name__)

SKIP_DIRS = {".jobs", "__pycache__"}


@dataclass
class DatasetResult:
    dataset: str  # relative to ROOT
    result: str  # published | skipped | failed
    accepted: int = 0
    rejected: int = 0
    seconds: float = 0.0
    reused_units: int = 0
    error: str = ""
    job_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def find_datasets(root: Path) -> list[Path]:
    """Every raw v2.1 dataset under ``root``: a directory with meta/info.json that is not an
    export (no quality_split.json, not inside an export tree); exports, staging and hidden
    directories are not searched."""
    found: list[Path] = []
    for dirpath, dirs, _files in os.walk(root):
        d = Path(dirpath)
        if (d / "meta" / "info.json").is_file():
            dirs[:] = []
            try:
                confine.check_is_source(d)
            except EvaError:
                continue
            found.append(d)
            continue
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in SKIP_DIRS
                         and x != "export" and not x.endswith("_export"))
    return sorted(found)


@dataclass(frozen=True)
class BatchItem:
    """One export of the batch: a dataset, or (``--merge``) a task's datasets merged as ``name``."""

    label: str  # what the summary calls it: the dataset relative to ROOT, or the merged set's name
    sources: tuple[Path, ...]
    name: str = ""
    error: str = ""  # why it cannot be exported (reported as failed, the others go on)

    def paths(self, root: Path, fmt: str) -> ExportPaths:
        return ExportPaths.named(root / self.name, fmt) if self.name else ExportPaths.of(self.sources[0], fmt)

    def state_hash(self) -> str:
        """The sources' state (a single dataset: its source hash, as records before --merge have)."""
        if not self.name:
            return source_hash(self.sources[0])
        return "+".join(f"{os.path.realpath(s)}={source_hash(s)}" for s in self.sources)


def dataset_tasks(src: Path) -> tuple[str, ...]:
    """A dataset's task texts from its metadata (tasks.jsonl, or a v3.0 tasks.parquet)."""
    if (src / TASKS).is_file():
        try:
            return tuple(sorted(TaskRow.from_dict(d).task for d in iter_jsonl(src / TASKS)))
        except (KeyError, ValueError) as exc:
            raise DatasetError(f"{src / TASKS}: {exc}") from None
    import pyarrow.parquet as pq

    table = pq.read_table(src / "meta" / "tasks.parquet")
    col = "task" if "task" in table.column_names else "__index_level_0__"
    return tuple(sorted(str(t) for t in table.column(col).to_pylist()))


def task_slug(tasks: tuple[str, ...]) -> str:
    """A merged set's name from its task texts, within the dataset name rule (confine.check_name)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "+".join(tasks)).strip("._-")[:confine.NAME_MAX - 12] or "task"
    return f"merged_{slug}"


def merge_groups(root: Path, datasets: list[Path]) -> list[BatchItem]:
    """The datasets grouped by task set (first appearance order); one item per group."""
    groups: dict[tuple[str, ...], list[Path]] = {}
    failed: list[BatchItem] = []
    for src in datasets:
        try:
            groups.setdefault(dataset_tasks(src), []).append(src)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # reported as a failed item
            failed.append(BatchItem(str(src.relative_to(root)), (src,), error=f"{src / TASKS}: unreadable ({exc})"))
    items, used = [], set()
    for tasks, srcs in groups.items():
        name = task_slug(tasks)
        while name in used:
            name += "_"
        used.add(name)
        items.append(BatchItem(name, tuple(srcs), name))
    return items + failed


def _record_path(paths: ExportPaths) -> Path:
    return paths.root / f".batch-{paths.fmt}.json"


def is_current(src: Path | BatchItem, fmt: str, root: Path | None = None) -> str | None:
    """The job id of a published pair made by the batch from this exact source state, or None."""
    item = src if isinstance(src, BatchItem) else BatchItem(str(src), (src,))
    paths = item.paths(root or item.sources[0], fmt)
    try:
        rec = read_json(_record_path(paths))
        if rec.get("source_hash") != item.state_hash():
            return None
        for sub in (paths.accepted, paths.rejected):
            if not (sub / QUALITY_SPLIT_FILE).is_file() or QualitySplit.read(sub).job_id != rec.get("job_id"):
                return None
        return str(rec["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def batch_config(root: Path, workers: int) -> Config:
    return parse_config({"collection": {"log_dir": str(root)}, "export": {"workers": workers}})


def export_one(config: Config, root: Path, src: Path | BatchItem, fmt: str) -> DatasetResult:
    """Export one dataset (or merged group) with the active executor; never raises (the result
    says what failed)."""
    from .runner import ExportService

    item = src if isinstance(src, BatchItem) else BatchItem(
        str(src.relative_to(root)) if src.is_relative_to(root) else str(src), (src,))
    name = item.label
    t0 = time.monotonic()
    try:
        if item.error:
            raise ExportError(item.error)
        done = is_current(item, fmt, root)
        if done is not None:
            paths = item.paths(root, fmt)
            qa, qr = QualitySplit.read(paths.accepted), QualitySplit.read(paths.rejected)
            return DatasetResult(name, "skipped", qa.episode_count, qr.episode_count,
                                 time.monotonic() - t0, job_id=done)
        h = item.state_hash()  # before the export: a review during it makes the record stale
        job = ExportService(config, background=False, recover=False).run(list(item.sources), fmt, item.name)
    except Exception as exc:  # noqa: BLE001 - one dataset never stops the others
        return DatasetResult(name, "failed", seconds=time.monotonic() - t0, error=f"{type(exc).__name__}: {exc}"
                             if not isinstance(exc, EvaError) else str(exc))
    res = DatasetResult(name, "published" if job.state == COMPLETED else "failed", job.accepted_episodes,
                        job.rejected_episodes, time.monotonic() - t0, job.reused_episodes, job.error, job.job_id)
    if job.state == COMPLETED:
        try:
            atomic_write_json(_record_path(item.paths(root, fmt)),
                              {"source_hash": h, "job_id": job.job_id, "format": fmt, "finished_at": time.time()})
        except OSError as exc:  # the pair is published; only the skip on rerun is lost
            log.warning("%s: cannot record the batch result: %s", name, exc)
    return res


def run_batch(root: Path, fmt: str, *, workers: int | None = None, ray_address: str | None = None,
              on_result: Callable[[DatasetResult], None] | None = None,
              ray_init: dict[str, Any] | None = None, merge: bool = False) -> list[DatasetResult]:
    """Export every dataset under ``root`` (``merge``: one merged set per task); results in
    dataset (group) order."""
    root = Path(os.path.realpath(root))
    if not root.is_dir():
        raise ExportError(f"batch root {root} is not a directory")
    found = find_datasets(root)
    datasets: list[Path | BatchItem] = list(merge_groups(root, found)) if merge else list(found)
    report = on_result or (lambda r: None)
    results: dict[Path | BatchItem, DatasetResult] = {}
    if ray_address is None:
        n = max(1, int(workers or pool.default_workers()))
        config = batch_config(root, n)
        with pool.local_pool(n):  # worker processes started once, reused by every dataset
            for src in datasets:
                results[src] = export_one(config, root, src, fmt)
                report(results[src])
        return [results[s] for s in datasets]
    with RayPool.connect(ray_address, workers, ray_init) as rp:
        config = batch_config(root, rp.workers)
        lock = threading.Lock()

        def one(src: Path | BatchItem) -> None:
            with pool.using(rp):  # a fresh thread: its context starts empty
                r = export_one(config, root, src, fmt)
            with lock:
                results[src] = r
                report(r)

        # Several datasets in flight keep the cluster busy while the driver plans, assembles,
        # verifies and publishes others (those steps are small: metadata and renames).
        with ThreadPoolExecutor(max_workers=max(2, min(8, rp.workers)), thread_name_prefix="batch") as ex:
            list(ex.map(one, datasets))
    return [results[s] for s in datasets]


# ---- Ray ----------------------------------------------------------------------------------------
def _ray_unit(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's loopback-only node address


class RayPool:
    """Episode units as Ray tasks (at most ``workers`` of one export in flight)."""

    def __init__(self, ray: Any, workers: int, owns: bool) -> None:
        self.ray = ray
        self.workers = workers
        self._owns = owns
        self._task = ray.remote(max_retries=0)(_ray_unit)  # a unit that failed is reported, not retried

    @classmethod
    def connect(cls, address: str, workers: int | None, init: dict[str, Any] | None = None) -> RayPool:
        if address == "local":
            # A local instance stays on loopback: Ray otherwise binds its node IP (the LAN
            # address) on Linux. Read by ray at import, inherited by its processes.
            os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
        try:
            import ray
        except ImportError as exc:
            raise ExportError("--ray needs the optional Ray extra: pip install '.[ray]' (or pip install ray)") from exc
        owns = not ray.is_initialized()
        if owns:
            kw: dict[str, Any] = dict(init or {})
            if address != "local":
                kw["address"] = address
            # Workers of a local cluster import this same eva_export (a checkout on PYTHONPATH).
            pkg_root = str(Path(__file__).resolve().parents[2])
            paths = [pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            kw.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}})
            kw.setdefault("log_to_driver", False)
            if address == "local":
                kw.setdefault("include_dashboard", False)
            ray.init(**kw)
        n = int(workers or ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
        return cls(ray, max(1, n), owns)

    def run(self, units: Sequence[Unit], on_done: pool.Done) -> None:
        ray = self.ray
        todo = pool.Taker(units)  # taken in order as tasks free up, never listed
        running: dict[Any, pool.Unit] = {}
        failure: tuple[pool.Unit, BaseException | None, str] | None = None
        while running or (todo and failure is None):
            while todo and failure is None and len(running) < self.workers:
                u = todo.pop()
                running[self._task.remote(u.fn, u.args)] = u
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                u = running.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - named below
                    if failure is None:
                        failure = self._failure(u, exc)
                    continue
                if failure is None:
                    on_done(u, result)
        if failure is not None:
            pool.raise_unit_failure(*failure)

    def _failure(self, u: pool.Unit, exc: BaseException) -> tuple[pool.Unit, BaseException | None, str]:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):  # RayTaskError: the unit's own exception
            return u, cause, f"{type(cause).__name__}: {cause}"
        return u, None, f"the Ray worker died while writing it ({type(exc).__name__}: {str(exc)[:300]})"

    def close(self) -> None:
        if self._owns:
            self.ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


Unit = pool.Unit


# ---- CLI ----------------------------------------------------------------------------------------
def summary_table(results: Sequence[DatasetResult]) -> Iterator[str]:
    w = max([len("dataset")] + [len(r.dataset) for r in results])
    yield f"{'dataset':<{w}}  {'accepted':>8}  {'rejected':>8}  {'time s':>7}  result"
    for r in results:
        text = r.result + (f" ({r.reused_units} units reused)" if r.reused_units else "")
        if r.error:
            text += f": {r.error[:300]}"
        yield f"{r.dataset:<{w}}  {r.accepted:>8}  {r.rejected:>8}  {r.seconds:>7.1f}  {text}"
    counts = {k: sum(r.result == k for r in results) for k in ("published", "skipped", "failed")}
    yield f"{len(results)} datasets: " + ", ".join(f"{v} {k}" for k, v in counts.items())


def main_batch(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 0:
        print("eva-export: refused: --workers must be >= 0", file=sys.stderr)
        return 2
    try:
        results = run_batch(Path(args.root), args.fmt, workers=args.workers or None, ray_address=args.ray,
                            merge=bool(getattr(args, "merge", False)), on_result=lambda r: print(f"eva-export batch: {r.dataset}: {r.result}", file=sys.stderr))
    except EvaError as exc:
        print(f"eva-export: refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print("\n".join(summary_table(results)))
    return 1 if any(r.result == "failed" for r in results) else 0
