"""The quality check as a request (the export node's ``~/check``; no ROS here).

``CheckService.check(dataset, write, sidecar)`` validates the request once, at the boundary:

* ``dataset`` is an absolute directory or a bare dataset name (``<log_dir>/<name>/raw``); after
  symlinks and '..' it must lie inside ``export.data_roots`` (the roots the export serves);
* ``write`` on an export tree (a published subset) is refused: a check never edits an export;
* the dataset is bounded (``max_bytes`` of files, ``max_frames`` video frames to decode): the
  check runs in the caller's thread and a ROS client waits for the reply, so a fleet-sized
  dataset is refused, naming the CLI as the way out.

Why synchronous and not a background job like export: the reply carries the per-episode
verdicts (what fleet tooling asks for), which a Job record has no room for, and the bound
keeps a call short. Only one check runs at a time (a second is refused, not queued), so a
check holds at most one executor thread and ``~/start``, ``~/get_job`` and the status timer
keep answering beside it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import confine
from ..config import Config
from ..confine import resolve_in_roots
from ..errors import ConfigError, EvaError, UnsafeNameError
from ..formats.common.records import Severity
from ..fsutil import tree_size
from .offline import DatasetCheck, EpisodeCheck, check_dataset
from .rules import RULE_VERSION

#: Default bounds of one call. Measured here (2 cores, 640x480 crf 18, 2 cameras): noise-like
#: frames check at 17 MiB/s (172 frames/s), smooth ones at 533 frames/s (2.8 MiB/s); either bound
#: keeps a call near a minute at most (512 MiB of noise: 30 s; 30000 smooth frames: 56 s).
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_FRAMES = 30_000
#: Test hook: a callable run once a request is accepted, before the check reads anything.
Hook = Callable[[Path], None]


@dataclass(frozen=True)
class EpisodeVerdict:
    """One episode's verdict as a reply carries it: codes only (details go to the CLI/sidecar)."""

    episode_index: int
    quality: str  # "green" or "red"
    reason_codes: tuple[str, ...]  # the errors that make it red, in rule order, each once
    warning_codes: tuple[str, ...]  # warnings (idle_start, ...), which do not

    @classmethod
    def of(cls, ep: EpisodeCheck) -> EpisodeVerdict:
        errors = [f.code for f in ep.findings if f.severity == Severity.ERROR]
        warnings = [f.code for f in ep.findings if f.severity != Severity.ERROR]
        return cls(ep.episode_index, ep.quality, tuple(dict.fromkeys(errors)), tuple(dict.fromkeys(warnings)))


@dataclass(frozen=True)
class CheckResult:
    root: Path
    source_kind: str
    rule_version: str
    episodes: tuple[EpisodeVerdict, ...]
    written: str  # "" (not written), or where the verdicts went

    @property
    def red(self) -> int:
        return sum(e.quality == "red" for e in self.episodes)

    def summary(self) -> str:
        text = (f"{self.root} ({self.source_kind}): {self.red} red, {len(self.episodes) - self.red} green "
                f"(rules version {self.rule_version})")
        return text + (f"; wrote {self.written}" if self.written else "")


class CheckBusy(EvaError):
    """Another check is running in this service."""


class CheckService:
    """Checks one dataset per call; thread-safe (one check at a time, others refused)."""

    def __init__(self, config: Config, max_bytes: int = DEFAULT_MAX_BYTES, max_frames: int = DEFAULT_MAX_FRAMES,
                 hook: Hook | None = None) -> None:
        self.config = config
        self.max_bytes, self.max_frames = max_bytes, max_frames
        self.hook = hook
        self._running = threading.Lock()

    def resolve(self, dataset: str) -> Path:
        """The dataset directory a request names (raises a reason when refused)."""
        if not isinstance(dataset, str) or not dataset:
            raise ConfigError("dataset is required: an absolute directory or a dataset name")
        if "/" in dataset:
            confine.check_request_path(dataset, "dataset")  # NUL, over-long components
            if not os.path.isabs(dataset):
                raise UnsafeNameError(f"dataset {confine.short_repr(dataset)} must be an absolute path "
                                      "or a bare dataset name")
            path = Path(dataset)
        else:
            path = self.config.collection.dataset_dir(dataset)  # name checked, kept inside log_dir
        return resolve_in_roots(path, self.config.export.data_roots, "dataset", confine.short_repr(dataset, 120))

    def check(self, dataset: str, write: bool = False, sidecar: bool = False) -> CheckResult:
        """Run the rules on one dataset; with ``write`` store the verdicts (as ``eva-export
        check --write [--sidecar]``). Raises an EvaError (or OSError/ValueError from a damaged
        file) with the reason."""
        root = self.resolve(dataset)
        if write and confine.export_tree_of(root) is not None:
            raise UnsafeNameError(f"{root} is an export: a check never writes into one (check without write)")
        if not self._running.acquire(blocking=False):
            raise CheckBusy("another check is running on this node; call again when it has answered")
        try:
            self._bound(root)
            if self.hook is not None:
                self.hook(root)
            return self._run(root, write, sidecar)
        finally:
            self._running.release()

    def _bound(self, root: Path) -> None:
        """Refuse a dataset too large to check in one call: its files' bytes, and the video
        frames to decode (info.json's total_frames x cameras: a lying info.json still meets
        the bytes bound)."""
        from ..formats.common.meta import read_info

        files, size = tree_size(root)
        way_out = f"run `eva-export check {root}` instead"
        if size > self.max_bytes:
            raise ConfigError(f"dataset {root} holds {size / 2**20:.0f} MiB in {files} files, over this service's "
                              f"bound of {self.max_bytes / 2**20:.0f} MiB (parameter check_max_bytes); {way_out}")
        info = read_info(root)
        frames = int(info.total_frames) * max(1, len(info.video_keys))
        if frames > self.max_frames:
            raise ConfigError(f"dataset {root} has {frames} video frames to decode, over this service's bound of "
                              f"{self.max_frames} (parameter check_max_frames); {way_out}")

    def _run(self, root: Path, write: bool, sidecar: bool) -> CheckResult:
        from .store import write_rows, write_sidecar

        chk: DatasetCheck = check_dataset(root)
        written = ""
        if write:
            written = (f"sidecar {write_sidecar(chk)}" if sidecar or not chk.owned
                       else f"{write_rows(chk)} rows of {root / 'meta/episodes.jsonl'}")
        return CheckResult(root, str(chk.kind), RULE_VERSION, tuple(EpisodeVerdict.of(e) for e in chk.episodes),
                           written)
