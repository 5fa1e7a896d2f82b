"""``eva-export clean``: remove what failed or interrupted exports left behind.

Leftovers have an owner: a failed job records its staging (kept so a rerun resumes), the next
export of the same source and format reuses or removes it, and this removes, under each data
root, staging roots and publication backups older than a given age plus finished job records
older than it. Each export root is cleaned under its format's export lock, so a running export
is never touched (its root is skipped and reported). A backup is never simply deleted while
the pair it belongs to is missing: ``recover_pair`` puts it back first.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, ExportError
from ..fsutil import tree_size
from ..jobs import JobStore
from .paths import ExportPaths
from .publish import export_lock, recover_pair

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_LEFTOVER = re.compile(r"^\.(staging|backup)-([A-Za-z0-9_]+)-.+$")


def parse_age(text: str) -> float:
    """'7d', '12h', '30m', '90s' or plain seconds -> seconds."""
    m = _AGE.match(str(text))
    if not m:
        raise ConfigError(f"age {text!r}: use a number with an optional unit s, m, h, d or w (e.g. 7d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass
class CleanReport:
    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    freed_bytes: int = 0


def _newest_mtime(root: Path) -> float:
    """Newest mtime of the directory and its direct entries (a resumed staging is fresh)."""
    times = [root.stat().st_mtime]
    times += [p.lstat().st_mtime for p in root.iterdir()]
    return max(times)


def _export_roots(data_root: Path) -> list[Path]:
    """Directories that may hold ``.staging-*`` / ``.backup-*``: ``<name>/export`` and ``*_export``."""
    cands = {data_root} | set(data_root.glob("*_export")) | set(data_root.glob("*/export"))
    cands |= set(data_root.glob("*/*_export"))
    return sorted(p for p in cands if p.is_dir())


def clean(data_roots: list[Path], jobs_dirs: list[Path], older_than_s: float,
          now: float | None = None) -> CleanReport:
    now = time.time() if now is None else now
    cutoff = now - older_than_s
    report = CleanReport()
    for data_root in data_roots:
        for root in _export_roots(Path(data_root)):
            by_fmt: dict[str, list[tuple[str, Path]]] = {}
            for p in root.iterdir():
                m = _LEFTOVER.match(p.name)
                if m and p.is_dir():
                    by_fmt.setdefault(m.group(2), []).append((m.group(1), p))
            for fmt, items in sorted(by_fmt.items()):
                paths = ExportPaths(source_dir=root, fmt=fmt, root=root)
                try:
                    with export_lock(paths):
                        _clean_root(paths, items, cutoff, report)
                except ExportError as exc:  # an export of this root and format is running
                    report.skipped.append(f"{root} ({fmt}): {exc}")
    for jobs_dir in jobs_dirs:
        if not Path(jobs_dir).is_dir():
            continue
        store = JobStore(Path(jobs_dir))  # opening marks jobs of dead processes interrupted
        for job in store.all():
            if job.finished and job.finished_at and job.finished_at < cutoff:
                store.path(job.job_id).unlink(missing_ok=True)
                report.removed.append(str(store.path(job.job_id)))
    return report


def _clean_root(paths: ExportPaths, items: list[tuple[str, Path]], cutoff: float, report: CleanReport) -> None:
    old_backups = [p for kind, p in items if kind == "backup" and _newest_mtime(p) < cutoff]
    if old_backups:
        # Restores a lone backup when the pair is missing, removes the rest.
        for action in recover_pair(paths):
            (report.restored if action.startswith("restored") else report.removed).append(
                f"{paths.root}: {action}")
    for kind, p in items:
        if kind != "staging" or not p.exists() or _newest_mtime(p) >= cutoff:
            continue
        size = tree_size(p)[1]
        shutil.rmtree(p)
        report.removed.append(str(p))
        report.freed_bytes += size
