"""What a trainer needs of an export, checked by every format's verifier.

Loading is not training: a reader loads a subset whose stats.json holds a NaN, and every sample
it normalises is then NaN. So verification also checks that

* meta/stats.json holds, for every numeric feature and camera, mean, std, min, max, count and
  q01..q99 (quantile normalisation needs them), every number finite;
* no float feature of an accepted subset holds NaN/inf in an episode unless quality_split.json
  records that episode and feature as kept on purpose (``nonfinite_kept``: export.nonfinite
  keep / keep_passed); a rejected subset is kept for review as recorded, its values only counted;
* each episode's timestamps lie on the 1/fps grid from its first frame, so delta-timestamp
  windows resolve to frames (LeRobot's own tolerance, 1e-4 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...fsutil import read_json
from .exporter import VerifyReport
from .meta import STATS
from .nonfinite import NONFINITE_KEY, kept_of
from .records import QUALITY_SPLIT_FILE, QualitySplit
from .stats import QUANTILES, STAT_KEYS

#: LeRobot's default tolerance when it checks timestamps against the fps grid.
TIMESTAMP_TOL_S = 1e-4
REQUIRED_STATS = (*STAT_KEYS, *QUANTILES)
_NUMERIC = ("bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
            "uint32", "uint64", "image", "video")
_FLOATS = ("float16", "float32", "float64")


def stat_keys(info: Mapping[str, Any]) -> list[str]:
    """The features stats.json must describe: numeric ones and cameras."""
    feats = info.get("features", {})
    return [k for k, f in feats.items() if isinstance(f, dict) and f.get("dtype") in _NUMERIC]


def stats_problems(stats: Any, keys: list[str]) -> list[str]:
    """Every way ``stats`` (stats.json's object) fails a trainer, one line per feature."""
    if not isinstance(stats, dict):
        return ["is not a JSON object"]
    out = []
    for k in keys:
        entry = stats.get(k)
        if not isinstance(entry, dict):
            out.append(f"{k}: no statistics")
            continue
        missing = [s for s in REQUIRED_STATS if s not in entry]
        if missing:
            out.append(f"{k}: lacks {missing}")
            continue
        try:
            bad = [s for s in REQUIRED_STATS if not np.isfinite(np.asarray(entry[s], dtype=np.float64)).all()]
        except (TypeError, ValueError):
            bad = ["(not numeric)"]
        if bad:
            out.append(f"{k}: non-finite {bad}")
    return out


def check_stats(report: VerifyReport, root: Path, info: Mapping[str, Any], empty: bool) -> None:
    """stats.json finite and complete (an empty subset's may be ``{}``)."""
    try:
        stats = read_json(Path(root) / STATS)
    except (OSError, ValueError) as exc:
        report.errors.append(f"{STATS}: unreadable ({exc})")
        return
    if empty and stats == {}:
        report.checks.append(f"{STATS} is empty, as an empty subset's must be")
        return
    keys = stat_keys(info)
    problems = stats_problems(stats, keys)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems) - 5} more)" if len(problems) > 5 else "")
        report.errors.append(f"{STATS}: would not normalise for a trainer: {shown}")
    else:
        report.checks.append(f"{STATS}: {len(keys)} features with {', '.join(REQUIRED_STATS)}, every number finite")


class ValueCheck:
    """Non-finite values and off-grid timestamps, counted episode by episode from any format's
    columns; the errors name the file and the episode."""

    def __init__(self, root: Path, info: Mapping[str, Any]) -> None:
        feats = info.get("features", {})
        self.floats = [k for k, f in feats.items() if isinstance(f, dict) and f.get("dtype") in _FLOATS]
        self.fps = float(info.get("fps") or 0)
        self.allowed: dict[int, set[str]] = {}
        self.review = False  # a rejected subset: for review, not training
        try:
            marker = QualitySplit.read(Path(root))
            self.review = marker.subset == "rejected"
            for e in kept_of(marker):
                self.allowed.setdefault(e.episode_index, set()).update(k for k, _ in e.features)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # start_report names an unreadable marker
        self.errors: list[str] = []
        self.kept = self.episodes = 0

    def episode(self, where: str, episode: int, columns: Mapping[str, Any]) -> None:
        """One episode's columns (feature -> values, rows first), read by the format's reader."""
        self.episodes += 1
        for k in self.floats:
            if k not in columns:
                continue
            v = np.asarray(columns[k], dtype=np.float64)
            n = int(v.size - np.count_nonzero(np.isfinite(v)))
            if n and (self.review or k in self.allowed.get(episode, ())):
                self.kept += n
            elif n:
                self.errors.append(f"{where}: episode {episode}: {k} holds {n} NaN/inf value(s) that "
                                   f"{QUALITY_SPLIT_FILE} does not record as kept ({NONFINITE_KEY}); "
                                   "a trainer's loss turns NaN")
        if "timestamp" in columns and self.fps > 0:
            ts = np.asarray(columns["timestamp"], dtype=np.float64).reshape(-1)
            if ts.size:
                off = np.abs(ts - ts[0] - np.arange(ts.size) / self.fps)
                if not np.all(off <= TIMESTAMP_TOL_S):
                    i = int(np.argmax(~(off <= TIMESTAMP_TOL_S)))
                    self.errors.append(f"{where}: episode {episode}: timestamp of frame {i} is {ts[i]:.6f} s, "
                                       f"off the 1/{self.fps:g} s grid from {ts[0]:.6f} s by more than "
                                       f"{TIMESTAMP_TOL_S} s: delta-timestamp windows do not resolve")

    def finish(self, report: VerifyReport) -> None:
        report.errors.extend(self.errors[:20])
        if len(self.errors) > 20:
            report.errors.append(f"... {len(self.errors) - 20} more non-finite or off-grid episode(s)")
        if not self.errors:
            kept = (f"; {self.kept} NaN/inf value(s) kept as recorded"
                    + (" (a rejected subset, for review)" if self.review else
                       f" in {QUALITY_SPLIT_FILE}: this subset will not train as is") if self.kept else "")
            report.checks.append(f"values: {self.episodes} episode(s), float features {self.floats} finite, "
                                 f"timestamps on the 1/fps grid{kept}")
