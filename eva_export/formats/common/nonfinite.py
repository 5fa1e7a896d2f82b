"""Non-finite values (NaN, +/-inf) in an accepted subset: cut out, refused, or kept on purpose.

A training user expects an accepted set to be finite: one NaN reaches the loss, and LeRobot's
own merge turns NaN into null, after which LeRobot cannot load the result. So before any format
is written, the staged accepted subset's numeric columns are scanned, and ``export.nonfinite``
decides:

* ``finite_runs`` (default): an episode an operator passed (qc_verdict "pass": someone saw the
  flag) is exported as its finite runs, each a full episode naming the source episode and frame
  range (export/finite_runs.py); nothing is filled in. An accepted episode nobody passed is
  refused, naming its raw dataset, file and episode.
* ``keep_passed``: as ``finite_runs`` for the refusal, but a passed episode's values are kept
  exactly (never rewritten, never nulled): for consumers that mask; it will not train as is.
* ``refuse``: refuse whenever any accepted episode holds a non-finite value.
* ``keep``: keep every such episode as it is (it will not train as is).

Kept episodes are listed in quality_split.json and the card; so are cut ones. The rejected
subset is not checked: it is kept for review, not for training.
"""

from __future__ import annotations

import dataclasses
import os
from array import array
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import ExportError
from .commits import TableNonFinite
from .info_record import DatasetInfo
from .meta import read_meta
from .provenance import RawNames
from .records import QualitySplit, Verdict
from .table import to_numpy

#: quality_split.json key (the marker's extra) listing the non-finite episodes kept.
NONFINITE_KEY = "nonfinite_kept"
#: quality_split.json key: each source episode exported as its finite runs (export/finite_runs.py).
RUNS_KEY = "nonfinite_runs"
_FLOAT_DTYPES = ("float16", "float32", "float64")


class NonFinitePolicy(StrEnum):
    """The values of ``export.nonfinite``."""

    FINITE_RUNS = "finite_runs"
    KEEP_PASSED = "keep_passed"
    REFUSE = "refuse"
    KEEP = "keep"


@dataclass(frozen=True)
class NonFiniteEpisode:
    """One subset episode with NaN/inf values: where they are and who let them through."""

    episode_index: int  # in the subset
    source_episode_index: int
    source_file: str  # the raw dataset's file of that episode (or the raw dataset's directory)
    features: tuple[tuple[str, int], ...]  # (feature, non-finite values) in feature order
    qc_verdict: str

    @property
    def values(self) -> int:
        return sum(n for _, n in self.features)

    @property
    def passed(self) -> bool:
        return self.qc_verdict.strip().lower() == Verdict.PASS

    def describe(self) -> str:
        feats = ", ".join(f"{k} ({n} NaN/inf)" for k, n in self.features)
        return f"{self.source_file}: source episode {self.source_episode_index}: {feats}"

    def to_dict(self) -> dict[str, Any]:
        return {"episode_index": self.episode_index, "source_episode_index": self.source_episode_index,
                "source_file": self.source_file, "features": {k: n for k, n in self.features},
                "qc_verdict": self.qc_verdict}

    @classmethod
    def from_dict(cls, d: Any) -> NonFiniteEpisode:
        if not isinstance(d, dict) or not isinstance(d.get("features"), dict):
            raise ValueError(f"{NONFINITE_KEY}: an entry is not an object with a features object")
        return cls(int(d["episode_index"]), int(d["source_episode_index"]), str(d["source_file"]),
                   tuple((str(k), int(n)) for k, n in d["features"].items()), str(d.get("qc_verdict", "")))


def kept_of(marker: QualitySplit) -> tuple[NonFiniteEpisode, ...]:
    """The non-finite episodes a subset's marker says were kept (none when it says nothing)."""
    raw = marker.extra.get(NONFINITE_KEY) or []
    if not isinstance(raw, list):
        raise ValueError(f"{NONFINITE_KEY} is not a list")
    return tuple(NonFiniteEpisode.from_dict(d) for d in raw)


def _count_nonfinite(col: pa.ChunkedArray) -> int:
    values = to_numpy(col)
    if values.dtype.kind != "f":  # a list column read back as objects: one row at a time
        values = np.asarray(values.tolist(), dtype=np.float64)
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def float_keys(info: DatasetInfo) -> list[str]:
    """The features scanned: numeric (not camera or image) ones of a float dtype."""
    return [k for k, f in info.features.items() if not f.is_visual and f.dtype in _FLOAT_DTYPES]


def count_table(table: pa.Table, keys: list[str]) -> tuple[tuple[str, int], ...]:
    """(feature, NaN/inf values) of each of ``keys`` present in ``table`` holding any, in order."""
    return tuple((k, n) for k in keys if k in table.column_names and (n := _count_nonfinite(table.column(k))) > 0)


def table_facts(table: pa.Table, keys: list[str], written: os.stat_result) -> TableNonFinite:
    """What a unit's writer records of the table it just wrote (``written``: its stat after the
    rename into place), so the scan need not read it back."""
    return TableNonFinite((written.st_dev, written.st_ino, written.st_size, written.st_mtime_ns), tuple(keys),
                          count_table(table, keys))


class KnownCounts:
    """A staged subset's episodes (0..n-1) as their unit records counted them: four ints each
    (the table's identity when written; -1s: unknown) and the counts of the few holding any, so
    memory stays small in the episode count. A table whose identity differs now, or counted for
    other keys, is read by the scan as before."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = tuple(keys)
        self._files = array("q")
        self._counts: dict[int, tuple[tuple[str, int], ...]] = {}

    def add(self, episode_index: int, facts: TableNonFinite | None) -> None:
        if episode_index != len(self._files) // 4:
            return  # not the next episode: it and every later one stay unknown (read)
        ident = (-1, -1, -1, -1) if facts is None or facts.keys != self.keys else facts.file
        try:
            self._files.extend(ident)
        except OverflowError:  # an inode past int64: not kept, read
            self._files.extend((-1, -1, -1, -1))
            return
        if facts is not None and facts.counts and ident[0] != -1:
            self._counts[episode_index] = facts.counts

    def counts(self, episode_index: int, path: Path) -> tuple[tuple[str, int], ...] | None:
        """The counts of the table at ``path`` if it is still the file its writer counted, else None."""
        if not 0 <= episode_index < len(self._files) // 4 or self._files[4 * episode_index] == -1:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None  # the read names the fault
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != tuple(self._files[4 * episode_index:4 * episode_index + 4]):
            return None
        return self._counts.get(episode_index, ())


def scan_subset(root: Path, known: KnownCounts | None = None) -> list[NonFiniteEpisode]:
    """Every episode of the native (v2.1) subset at ``root`` holding NaN/inf in a float feature.
    ``known``: the split's own counts (a table unchanged since its unit counted it is not read)."""
    meta = read_meta(Path(root), stats=False)  # the rows and tables only (the exporter reads the stats)
    keys = float_keys(meta.info)
    if known is not None and known.keys != tuple(keys):
        known = None
    names = RawNames.of(meta)
    found: list[NonFiniteEpisode] = []
    for ep in meta.episodes:
        path = meta.data_path(ep.episode_index)
        counts = known.counts(ep.episode_index, path) if known is not None else None
        if counts is None:
            try:
                with open(path, "rb") as fh, pq.ParquetFile(fh) as pf:  # a handle: no filesystem lookup per file
                    present = [k for k in keys if k in pf.schema_arrow.names]
                    table = pf.read(columns=present)
            except (OSError, pa.ArrowException) as exc:
                raise ExportError(f"{names.data(ep.episode_index)}: {names.episode(ep.episode_index)}: "
                                  f"cannot read its staged table {path} ({exc})") from exc
            counts = count_table(table, present)
        if counts:
            raw_file = names.data(ep.episode_index)
            found.append(NonFiniteEpisode(ep.episode_index, names.index(ep.episode_index),
                                          str(raw_file if raw_file.is_file() else names.root), counts,
                                          ep.qc_verdict))
    return found


def decide(found: list[NonFiniteEpisode], policy: str, fmt: str) -> list[NonFiniteEpisode]:
    """The episodes kept under ``policy``; raises ExportError naming every refused one."""
    try:
        pol = NonFinitePolicy(policy)
    except ValueError:
        raise ExportError(f"export.nonfinite {policy!r}: use one of {[p.value for p in NonFinitePolicy]}") from None
    if pol == NonFinitePolicy.KEEP:
        return list(found)
    refused = [e for e in found if pol == NonFinitePolicy.REFUSE or not e.passed]
    if not refused:
        return list(found)
    shown = "; ".join(e.describe() for e in refused[:10])
    more = f"; ... ({len(refused) - 10} more)" if len(refused) > 10 else ""
    hint = ("pass each episode after review (eva-export review SRC --episodes N --verdict pass) to export it "
            + ("as its finite runs" if pol == NonFinitePolicy.FINITE_RUNS else "with its values as they are")
            + ", or fail it to move it to rejected" if pol != NonFinitePolicy.REFUSE
            else "set export.nonfinite to finite_runs, keep_passed or keep to export them")
    raise ExportError(f"{fmt} export refused: the accepted subset holds NaN/inf values in {len(refused)} episode(s) "
                      f"(export.nonfinite = {pol.value}): {shown}{more}. Nothing was written; {hint}")


def record_kept(root: Path, kept: list[NonFiniteEpisode]) -> None:
    """Record the kept episodes in the subset's marker.

    The marker is rewritten every run (its list replaced, not appended), so a resumed export
    states exactly what this run kept; every exporter copies it, and the card shows it.
    """
    marker = QualitySplit.read(root)
    # an empty list says "checked, none kept"; an absent key (an export made without the check) says nothing
    extra = {**marker.extra, NONFINITE_KEY: [e.to_dict() for e in kept]}
    if extra != marker.extra:
        dataclasses.replace(marker, extra=extra).write(root)


def check_accepted(root: Path, policy: str, fmt: str, known: KnownCounts | None = None) -> list[NonFiniteEpisode]:
    """Scan the staged accepted subset (``known``: scan_subset's), apply ``policy`` (the
    episodes it keeps as they are are recorded in the marker) and return the found ones that
    passed it: kept as they are, or under ``finite_runs`` to be cut (export/finite_runs.py)."""
    found = decide(scan_subset(root, known), policy, fmt)
    record_kept(root, [] if policy == NonFinitePolicy.FINITE_RUNS else found)
    return found
