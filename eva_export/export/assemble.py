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
import math
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

    flat: _FlatSum | None = None  # the running sums as Python floats (``_FlatSum``), until they cannot be

    def add(self, st: dict[str, Any]) -> None:
        if self.shape is None:
            self.shape = entry_shape(st)
        usable, rows = usable_stacked(st)
        if not usable:  # no finite row in that episode: it adds nothing (dataset.stats)
            return
        c = float(np.asarray(st["count"]).reshape(-1)[0])
        if self.mean is None:  # no numpy sums yet: the Python-float ones, while they can be
            if self.flat is None:
                self.flat = _FlatSum.first(rows, c)
                if self.flat is not None:
                    return
            elif self.flat.add(rows, c):
                return
            self._from_flat()
        self._add_arrays(st, c, rows)

    def _from_flat(self) -> None:
        """The Python-float sums as the arrays the numpy update continues from (the same values)."""
        f, self.flat = self.flat, None
        if f is None:
            return

        def arr(v: list[float]) -> Array:
            return np.array(v, dtype=np.float64).reshape(f.shape)
        self.count, self.mean, self.m2, self.low, self.high = f.count, arr(f.mean), arr(f.m2), arr(f.low), arr(f.high)
        self.quantiles = None if f.quantiles is None else {q: arr(v) for q, v in f.quantiles.items()}

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
        self._from_flat()
        if self.count <= 0 or self.mean is None or self.m2 is None or self.low is None or self.high is None:
            return None if self.shape is None else empty_stats(self.shape)
        out: dict[str, Any] = {"min": self.low.tolist(), "max": self.high.tolist(), "mean": self.mean.tolist(),
                               "std": np.sqrt(np.maximum(self.m2 / self.count, 0)).tolist(),
                               "count": [int(self.count)]}
        for q, total in (self.quantiles or {}).items():
            out[q] = (total / self.count).tolist()
        return out


def _flat_stats(rows: Array | None) -> tuple[tuple[int, ...], list[list[float]], list[list[float]] | None] | None:
    """(shape, [mean, std, min, max], the quantiles when all are there) as Python floats: the
    float64 values of ``stacked_stats``' rows (``tolist``), or None."""
    if rows is None or rows.ndim < 2 or rows.size == 0:
        return None
    values: list[list[float]] = rows.reshape(len(rows), -1).tolist()
    return tuple(rows.shape[1:]), values[:4], values[4:] if len(values) > 4 else None


def _pick(old: list[float], new: list[float], lower: bool) -> list[float] | None:
    """np.minimum / np.maximum of finite values; None at a 0.0 against a -0.0 (numpy's choice)."""
    out = []
    for a, b in zip(old, new, strict=True):
        if a == b:
            if a == 0.0 and math.copysign(1.0, a) != math.copysign(1.0, b):
                return None
            out.append(a)  # equal and not zeros of two signs: the same bits
        else:
            out.append((b if b < a else a) if lower else (b if b > a else a))
    return out


class _FlatSum:
    """A feature's running sums as Python floats, element by element: the same IEEE double
    operations in the same order as ``_Feature``'s numpy update (``x * x`` for ``** 2``, as
    numpy squares), so the same bits, without about twenty numpy calls per feature and episode
    (most of assembly's cost). Kept while every entry has one shape of plain numbers and no
    min or max meets a 0.0 against a -0.0; then the numpy update takes over from these sums."""

    def __init__(self, shape: tuple[int, ...], count: float, mean: list[float], m2: list[float],
                 low: list[float], high: list[float], quantiles: dict[str, list[float]] | None) -> None:
        self.shape, self.count, self.mean, self.m2, self.low, self.high = shape, count, mean, m2, low, high
        self.quantiles = quantiles

    @classmethod
    def first(cls, rows: Array | None, c: float) -> _FlatSum | None:
        got = _flat_stats(rows)
        if got is None:
            return None
        shape, (mean, std, low, high), qs = got
        quantiles = None if qs is None else {q: [x * c for x in v] for q, v in zip(QUANTILES, qs, strict=True)}
        return cls(shape, c, mean, [(x * x) * c for x in std], low, high, quantiles)

    def add(self, rows: Array | None, c: float) -> bool:
        """The entry added (True), or nothing changed (False: the numpy update adds it)."""
        got = _flat_stats(rows)
        if got is None or got[0] != self.shape:
            return False
        _, (mean, std, low, high), qs = got
        lows, highs = _pick(self.low, low, True), _pick(self.high, high, False)
        if lows is None or highs is None:
            return False
        total = self.count + c
        if total > 0:
            w1, w2 = c / total, self.count * c / total
            deltas = [x - m for x, m in zip(mean, self.mean, strict=True)]
            self.m2 = [m2 + (s * s) * c + (d * d) * w2 for m2, s, d in zip(self.m2, std, deltas, strict=True)]
            self.mean = [m + d * w1 for m, d in zip(self.mean, deltas, strict=True)]
        self.count, self.low, self.high = total, lows, highs
        if self.quantiles is not None:
            if qs is None:
                self.quantiles = None
            else:
                self.quantiles = {q: [t + x * c for t, x in zip(self.quantiles[q], v, strict=True)]
                                  for q, v in zip(QUANTILES, qs, strict=True)}
        return True


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
        self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")

    def commit(self) -> None:
        self._fh.close()
        set_file_mode(self.tmp)
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self._fh.close()
        self.tmp.unlink(missing_ok=True)
