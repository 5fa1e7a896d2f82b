"""Per-episode statistics (streamed) and their aggregation into dataset statistics.

Numbers follow LeRobot: min, max, mean, std, count per feature, plus the quantiles q01, q10,
q50, q90 and q99 that LeRobot 0.4 writes and its quantile normalisation (pi0.5) requires.
Camera statistics are per channel, shaped (3, 1, 1) and scaled to [0, 1]; their quantiles come
from a 256-bin histogram per channel, so they stay exact for 8-bit video in O(1) memory.

Every number written is finite: a trainer normalises every frame with these numbers, so one NaN
here makes every sample NaN. A row goes into a feature's statistics only when the feature's
values in that row are all finite, and ``count`` says how many rows went in. A feature with no
such row gets ``empty_stats``: count 0 and the identity normalisation (mean 0, std 1, min and
q01 -1, max and q99 1), so a reader sees finite numbers and the count says none were measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

STAT_KEYS = ("min", "max", "mean", "std", "count")
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_SET = frozenset(STAT_KEYS)
QUANTILE_SET = frozenset(QUANTILES)

#: One feature's statistics (STAT_KEYS and QUANTILES), each a list as numpy's ``tolist`` gives it:
#: numbers, nested for camera statistics (3, 1, 1); numpy types its items as Any.
StatEntry = dict[str, list[Any]]


def complete_stats(entry: object) -> bool:
    """A feature's entry of an episodes_stats row holds every one of STAT_KEYS."""
    return isinstance(entry, dict) and entry.keys() >= STAT_SET


def entry_count(entry: object) -> float:
    """The rows a feature's entry says went in (0 when it says nothing readable)."""
    if not isinstance(entry, dict):
        return 0.0  # indexing it would raise TypeError
    count = entry.get("count")
    if type(count) is list and len(count) == 1 and type(count[0]) in (int, float):
        return float(count[0])  # the usual [n]: what the numpy conversion below gives
    try:
        return float(np.asarray(entry["count"], dtype=np.float64).reshape(-1)[0])
    except (KeyError, TypeError, ValueError, IndexError):
        return 0.0


def finite_entry(entry: object) -> bool:
    """Every number of a feature's entry is finite (a list that is not numeric counts as not)."""
    if not isinstance(entry, dict):
        return False
    fast = _finite_lists(entry.values())
    if fast is not None:
        return fast
    try:
        return all(bool(np.isfinite(np.asarray(v, dtype=np.float64)).all()) for v in entry.values())
    except (TypeError, ValueError):
        return False


def _finite_lists(values: Iterable[object]) -> bool | None:
    """``finite_entry``'s answer from one numpy conversion per nesting depth instead of one per
    stat (eleven per feature, twice per episode, were most of the split's statistics cost);
    None when the values are not all lists that stack (the per-stat check then decides).

    The same answer: lists whose concatenation converts to one regular float64 array each
    convert on their own (every top-level item has the shape and numeric leaves of the rest),
    and an empty list is finite both ways; anything else falls back.
    """
    flat: list[object] = []
    nested: list[object] = []
    for v in values:
        if type(v) is not list:
            return None
        (nested if v and type(v[0]) is list else flat).extend(v)
    try:
        return all(bool(np.isfinite(np.array(group, dtype=np.float64)).all()) for group in (flat, nested) if group)
    except Exception:  # noqa: BLE001 - ragged, not numeric, too large: the per-stat check says which
        return None


def usable_entry(entry: object) -> bool:
    """An entry that may be pooled: every stat present, finite, and at least one row in."""
    return complete_stats(entry) and finite_entry(entry) and entry_count(entry) > 0


_STACKED = ("mean", "std", "min", "max", *QUANTILES)


def stacked_stats(entry: Mapping[str, Any]) -> NDArray[np.float64] | None:
    """mean, std, min, max (and the quantiles, when all are there) as the rows of one float64
    array, the values each converted alone gives; None when they are not of one shape or do
    not convert (each is then converted on its own)."""
    keys = _STACKED if entry.keys() >= QUANTILE_SET else _STACKED[:4]
    try:
        rows: NDArray[np.float64] = np.array([entry[k] for k in keys], dtype=np.float64)
    except Exception:  # noqa: BLE001 - missing, ragged, not numeric, too large: converted alone
        return None
    return rows if rows.ndim >= 1 and len(rows) == len(keys) else None


def usable_stacked(entry: object) -> tuple[bool, NDArray[np.float64] | None]:
    """``usable_entry`` and the entry's ``stacked_stats``, from one conversion when the entry
    holds those stats and a count of one plain number (every value it holds checked, as there)."""
    rows = stacked_stats(entry) if isinstance(entry, dict) and entry.keys() >= STAT_SET else None
    count = entry.get("count") if rows is not None and isinstance(entry, dict) else None
    if rows is not None and isinstance(entry, dict) and len(entry) == len(rows) + 1 and type(count) is list \
            and len(count) == 1 and (type(count[0]) is float or (type(count[0]) is int and abs(count[0]) < 1 << 53)):
        n = float(count[0])  # exact: no overflow to raise, as a float64 conversion would
        return bool(np.isfinite(rows).all()) and math.isfinite(n) and n > 0, rows
    return usable_entry(entry), rows


def empty_stats(shape: tuple[int, ...]) -> StatEntry:
    """A feature without a finite row: count 0 and the identity normalisation (finite numbers)."""
    def full(x: float) -> list[Any]:
        numbers: list[Any] = np.full(shape, x, dtype=np.float64).tolist()
        return numbers
    out: StatEntry = {"min": full(-1.0), "max": full(1.0), "mean": full(0.0), "std": full(1.0), "count": [0]}
    for name, q in QUANTILES.items():
        out[name] = full(-1.0 if q < 0.25 else 1.0 if q > 0.75 else 0.0)
    return out


def entry_shape(entry: object) -> tuple[int, ...]:
    """The element shape of a feature's entry (from its mean)."""
    if not isinstance(entry, dict):
        return (1,)  # indexing it would raise TypeError
    try:
        return tuple(np.asarray(entry["mean"], dtype=np.float64).shape)
    except (KeyError, TypeError, ValueError):
        return (1,)


class RunningStats:
    """Element-wise statistics of a stream of equally shaped finite arrays, in O(1) memory.

    The callers hand it finite values only (``column_stats`` keeps the rows whose values are all
    finite, ``ImageStats`` pixels scaled to [0, 1]), so ``count`` is the rows that went in.
    """

    def __init__(self) -> None:
        self.count = 0
        self._sum: NDArray[np.float64] | None = None
        self._sumsq: NDArray[np.float64] | None = None
        self._min: NDArray[np.float64] | None = None
        self._max: NDArray[np.float64] | None = None

    def add_batch(self, values: NDArray[np.generic]) -> None:
        """Add a batch with the sample axis first."""
        v = np.asarray(values, dtype=np.float64)
        if v.shape[0] == 0:
            return
        s, sq, mn, mx = v.sum(0), (v * v).sum(0), v.min(0), v.max(0)
        if self._sum is None:
            self._sum, self._sumsq, self._min, self._max = s, sq, mn, mx
        else:
            # set together with _sum (narrowing for the type checker)
            assert self._sumsq is not None and self._min is not None and self._max is not None
            self._sum += s
            self._sumsq += sq
            self._min = np.minimum(self._min, mn)
            self._max = np.maximum(self._max, mx)
        self.count += v.shape[0]

    def to_dict(self) -> StatEntry:
        if self._sum is None or self.count == 0:
            raise ValueError("no samples")
        assert self._sumsq is not None and self._min is not None and self._max is not None
        mean = self._sum / self.count
        var = np.maximum(self._sumsq / self.count - mean * mean, 0.0)
        return {"min": self._min.tolist(), "max": self._max.tolist(), "mean": mean.tolist(),
                "std": np.sqrt(var).tolist(), "count": [self.count]}


class ImageStats:
    """Per-channel statistics of RGB frames, sampled in space and time to stay cheap."""

    def __init__(self, every_nth_frame: int = 5, pixel_stride: int = 8) -> None:
        self._every = max(1, every_nth_frame)
        self._stride = max(1, pixel_stride)
        self._seen = 0
        self._sampled = 0
        self._rs = RunningStats()
        self._hist = np.zeros((3, 256), dtype=np.int64)

    def add(self, rgb: NDArray[np.uint8]) -> None:
        if self._seen % self._every == 0:
            pixels = rgb[:: self._stride, :: self._stride].reshape(-1, 3)
            self._rs.add_batch(pixels.astype(np.float64) / 255.0)
            for c in range(3):
                self._hist[c] += np.bincount(pixels[:, c], minlength=256)
            self._sampled += 1
        self._seen += 1

    def to_dict(self) -> StatEntry:
        d = self._rs.to_dict()
        out: StatEntry = {k: [[[x]] for x in d[k]] for k in ("min", "max", "mean", "std")}
        out["count"] = [self._sampled]
        cdf = np.cumsum(self._hist, axis=1) / max(1, int(self._hist[0].sum()))
        for name, q in QUANTILES.items():
            levels = [int(np.searchsorted(cdf[c], q)) for c in range(3)]
            out[name] = [[[lvl / 255.0]] for lvl in levels]
        return out


def column_stats(values: NDArray[np.generic]) -> StatEntry:
    """Statistics of one Parquet column (rows first); scalars get shape [1] lists. Only the rows
    whose values are all finite go in (``count``); none: ``empty_stats``."""
    v = np.asarray(values)
    if v.ndim == 1:
        v = v[:, None]
    if v.dtype.kind == "f":
        rows = np.isfinite(v).reshape(len(v), -1).all(axis=1)
        if not rows.all():
            v = v[rows]
    if len(v) == 0:
        return empty_stats(tuple(v.shape[1:]))
    rs = RunningStats()
    rs.add_batch(v)
    d = rs.to_dict()
    if np.issubdtype(v.dtype, np.integer):
        d["min"] = [int(x) for x in d["min"]]
        d["max"] = [int(x) for x in d["max"]]
    qs = np.quantile(v.astype(np.float64), list(QUANTILES.values()), axis=0)  # one sort for all five
    for name, row in zip(QUANTILES, qs, strict=False):
        d[name] = row.tolist()
    return d


def aggregate(per_episode: Iterable[Mapping[str, Mapping[str, object]]]) -> dict[str, StatEntry]:
    """Combine episode statistics into dataset statistics (weighted mean, pooled variance).

    Only usable entries are pooled (``usable_entry``: an episode whose feature had no finite row
    adds nothing); a feature with none gets ``empty_stats``, so every number is finite."""
    groups: dict[str, list[Mapping[str, object]]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for stats in per_episode:
        for key, st in stats.items():
            shapes.setdefault(key, entry_shape(st))
            if usable_entry(st):
                groups.setdefault(key, []).append(st)
    out: dict[str, StatEntry] = {key: empty_stats(shape) for key, shape in shapes.items()}
    for key, items in groups.items():
        counts = np.array([entry_count(s) for s in items])
        total = counts.sum()
        means = np.stack([np.asarray(s["mean"], dtype=np.float64) for s in items])
        stds = np.stack([np.asarray(s["std"], dtype=np.float64) for s in items])
        w = (counts / total).reshape((-1,) + (1,) * (means.ndim - 1))
        mean = (w * means).sum(0)
        var = (w * (stds ** 2 + (means - mean) ** 2)).sum(0)
        mins = np.stack([np.asarray(s["min"], dtype=np.float64) for s in items]).min(0)
        maxs = np.stack([np.asarray(s["max"], dtype=np.float64) for s in items]).max(0)
        out[key] = {"min": mins.tolist(), "max": maxs.tolist(), "mean": mean.tolist(),
                    "std": np.sqrt(np.maximum(var, 0)).tolist(), "count": [int(total)]}
        # Quantiles do not combine exactly; like LeRobot, take the count-weighted mean.
        for name in QUANTILES:
            if all(name in s for s in items):
                qs = np.stack([np.asarray(s[name], dtype=np.float64) for s in items])
                out[key][name] = (w * qs).sum(0).tolist()
    return out
