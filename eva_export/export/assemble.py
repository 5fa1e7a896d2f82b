"""A native subset's meta files written from its unit records, one record at a time.

Assembly held every unit's row and statistics (about 30 KB of Python objects per two-camera
episode) until the meta files were written: the job's memory grew with the episode count.
Here episodes.jsonl and episodes_stats.jsonl are streamed to their temporaries as
each record is read, and the dataset statistics are merged as they come (``StatsSum``: the
same weighted mean and pooled variance as dataset.stats.aggregate, by Chan's pairwise update,
which needs no list of the episodes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.common.stats import QUANTILES, empty_stats, entry_shape, usable_stacked
from ..fsutil import set_file_mode

Array = np.ndarray[Any, Any]


@dataclass
class _Feature:
    """One feature's running statistics: count, mean, sum of squared deviations, min, max."""

    count: float = 0.0
    mean: Array | None = None
    m2: Array | None = None
    low: Array | None = None
    high: Array | None = None
    quantiles: dict[str, Array] | None = field(default_factory=dict)  # count-weighted sums; None once one lacks it
    shape: tuple[int, ...] | None = None  # of the first entry seen (for empty_stats)

    def add(self, st: dict[str, Any]) -> None:
        if self.shape is None:
            self.shape = entry_shape(st)
        usable, rows = usable_stacked(st)
        if not usable:  # no finite row in that episode: it adds nothing (dataset.stats)
            return
        c = float(np.asarray(st["count"]).reshape(-1)[0])
        self._add_arrays(st, c, rows)

    def _add_arrays(self, st: dict[str, Any], c: float, rows: Array | None) -> None:
        if rows is not None:  # the same float64 values, converted in one call
            mean, std, low, high = rows[0], rows[1], rows[2], rows[3]
        else:
            mean, std = np.asarray(st["mean"], dtype=np.float64), np.asarray(st["std"], dtype=np.float64)
            low, high = np.asarray(st["min"], dtype=np.float64), np.asarray(st["max"], dtype=np.float64)
        var = std ** 2
        if self.mean is None or self.m2 is None or self.low is None or self.high is None:
            self.count, self.mean, self.m2, self.low, self.high = c, mean, var * c, low, high
        else:
            total = self.count + c
            delta = mean - self.mean
            if total > 0:
                self.mean = self.mean + delta * (c / total)
                self.m2 = self.m2 + var * c + delta ** 2 * (self.count * c / total)
            self.count = total
            self.low, self.high = np.minimum(self.low, low), np.maximum(self.high, high)
        if self.quantiles is not None:
            if not all(q in st for q in QUANTILES):
                self.quantiles = None
            else:
                for i, q in enumerate(QUANTILES, 4):
                    val = (rows[i] if rows is not None and len(rows) > 4 else np.asarray(st[q], dtype=np.float64)) * c
                    self.quantiles[q] = self.quantiles[q] + val if q in self.quantiles else val

    def result(self) -> dict[str, Any] | None:
        if self.count <= 0 or self.mean is None or self.m2 is None or self.low is None or self.high is None:
            return None if self.shape is None else empty_stats(self.shape)
        out: dict[str, Any] = {"min": self.low.tolist(), "max": self.high.tolist(), "mean": self.mean.tolist(),
                               "std": np.sqrt(np.maximum(self.m2 / self.count, 0)).tolist(),
                               "count": [int(self.count)]}
        for q, total in (self.quantiles or {}).items():
            out[q] = (total / self.count).tolist()
        return out


class StatsSum:
    """Dataset statistics merged one episode at a time (the features in first-seen order)."""

    def __init__(self) -> None:
        self._features: dict[str, _Feature] = {}

    def add(self, stats: dict[str, dict[str, Any]]) -> None:
        for key, st in stats.items():
            self._features.setdefault(key, _Feature()).add(st)

    def result(self) -> dict[str, dict[str, Any]]:
        return {k: r for k, f in self._features.items() if (r := f.result()) is not None}


def aggregate_stream(per_episode: Iterable[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    total = StatsSum()
    for stats in per_episode:
        total.add(stats)
    return total.result()


class JsonlStream:
    """A JSON Lines file written line by line to its temporary, renamed into place on close
    (a killed process leaves the old file or none, as write_text does)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")
        self._fh = open(self.tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed by commit

    def write(self, row: dict[str, Any]) -> None:
        self.write_line(json.dumps(row, ensure_ascii=False))

    def write_line(self, text: str) -> None:
        """A row's JSON text, already encoded as ``write`` encodes it."""
        self._fh.write(text + "\n")

    def commit(self) -> None:
        self._fh.close()
        set_file_mode(self.tmp)
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self._fh.close()
        self.tmp.unlink(missing_ok=True)
