"""The direct v3 writer's unit of durability: a completed shard and its record.

A shard (one data Parquet file, or one camera's MP4 file) is complete once its writer closed
it; its record ``<staging>/v3/<subset>/<stream>/CCC-FFF.json`` is then written by rename: the
commit point. The record says which episodes (subset positions) the shard holds and where
each one sits in it; a data shard's episodes' contributions to the episode metadata (their
statistics and NaN/inf counts) are in its entries file beside it (``CCC-FFF.entries.jsonl``,
one line an episode, appended to ``.open.jsonl`` as the episodes go by and renamed before
the record: memory holds no shard's statistics). A rerun rebuilds the metadata of the
episodes of complete shards from these files alone, without reading their source again.

A record is trusted only with its file in place at the size and mtime it recorded, and only
as part of the unbroken run of complete shards from the stream's first: the rerun continues
each stream from the end of that run (the shards after it are rewritten).

Durability is against a killed process: records and shards are renamed/closed, not fsynced
(publication fsyncs the renames that make the pair visible).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fsutil import read_json
from .units import write_text

#: The stream name of the data shards (camera streams are named by their video key).
DATA = "data"
SETTINGS = "settings.json"


@dataclass(frozen=True)
class EpisodeEntry:
    """What one episode of a data shard adds to the subset's episode metadata."""

    stats: dict[str, Any]  # its per-episode statistics (meta/episodes_stats.jsonl, stats/* columns)
    nonfinite: tuple[tuple[str, int], ...]  # (float feature, NaN/inf values) holding any
    stats_json: str  # ``json.dumps(stats, ensure_ascii=False)``: encoded once, where the episode is read

    @classmethod
    def of(cls, stats: dict[str, Any], nonfinite: tuple[tuple[str, int], ...]) -> EpisodeEntry:
        return cls(stats, nonfinite, json.dumps(stats, ensure_ascii=False))

    def to_json(self) -> str:
        """``json.dumps(to_dict(), ensure_ascii=False)``, the statistics' text not encoded again
        (the default encoder's text of a dict is its members' texts joined)."""
        nonfinite = json.dumps([list(c) for c in self.nonfinite], ensure_ascii=False)
        return f'{{"stats": {self.stats_json}, "nonfinite": {nonfinite}}}'

    def to_dict(self) -> dict[str, Any]:
        return {"stats": self.stats, "nonfinite": [list(c) for c in self.nonfinite]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeEntry:
        return cls.of(dict(d["stats"]), tuple((str(k), int(n)) for k, n in d["nonfinite"]))


@dataclass(frozen=True)
class ShardRecord:
    """One complete shard of a stream: its file, its episodes and where each sits in it."""

    stream: str
    chunk_index: int
    file_index: int
    first: int  # subset position of its first episode
    count: int  # its episodes (consecutive positions)
    size: int  # the file's bytes when closed
    mtime_ns: int
    before: tuple[int, ...] = ()  # camera shard: frames ahead of each episode in the file
    reencoded: tuple[int, ...] = ()  # camera shard: subset episode indices re-encoded into it

    @property
    def end(self) -> int:
        return self.first + self.count

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "chunk_index": self.chunk_index, "file_index": self.file_index,
                "first": self.first, "count": self.count, "size": self.size, "mtime_ns": self.mtime_ns,
                "before": list(self.before), "reencoded": list(self.reencoded)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardRecord:
        return cls(str(d["stream"]), int(d["chunk_index"]), int(d["file_index"]), int(d["first"]),
                   int(d["count"]), int(d["size"]), int(d["mtime_ns"]), tuple(int(b) for b in d["before"]),
                   tuple(int(r) for r in d["reencoded"]))


def records_dir(staging: Path, subset: str, stream: str) -> Path:
    # a camera key may hold '.' and '/'-free names only (validated); one folder per stream
    return staging / "v3" / subset / stream.replace("/", "_")


def record_path(staging: Path, subset: str, stream: str, chunk: int, file: int) -> Path:
    return records_dir(staging, subset, stream) / f"{chunk:03d}-{file:03d}.json"


def entries_path(record: Path) -> Path:
    return record.with_name(record.name.replace(".json", ".entries.jsonl"))


class EntryLog:
    """The open data shard's episode entries, appended to ``.open.jsonl`` (started afresh)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / ".open.jsonl"
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close/commit

    def append(self, entry: EpisodeEntry) -> None:
        self._fh.write(entry.to_json() + "\n")

    def commit(self, record: Path) -> None:
        """The entries so far become the shard's (renamed beside its record); a new log opens."""
        self._fh.close()
        os.replace(self.path, entries_path(record))
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close/commit

    def close(self) -> None:
        self._fh.close()
        self.path.unlink(missing_ok=True)


def read_entries(record: Path) -> Iterator[EpisodeEntry]:
    """A data shard's entries, one at a time."""
    with open(entries_path(record), encoding="utf-8") as fh:
        for line in fh:
            yield EpisodeEntry.from_dict(json.loads(line))


def commit(staging: Path, subset: str, rec: ShardRecord, shard: Path, log: EntryLog | None = None) -> ShardRecord:
    """Record ``shard`` (closed) as complete: its size and mtime now, its entries (``log``, a
    data shard's) renamed beside the record, then the record renamed into place."""
    st = os.stat(shard)
    rec = ShardRecord(rec.stream, rec.chunk_index, rec.file_index, rec.first, rec.count, st.st_size,
                      st.st_mtime_ns, rec.before, rec.reencoded)
    path = record_path(staging, subset, rec.stream, rec.chunk_index, rec.file_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log.commit(path)
    write_text(path, json.dumps(rec.to_dict(), ensure_ascii=False))
    return rec


def complete_run(staging: Path, subset: str, stream: str, shard_of: Any) -> list[ShardRecord]:
    """The stream's complete shards from its first, unbroken, each with its file as recorded
    (``shard_of(record)``: the shard file's path). Records after a gap or a changed file are
    removed: their shards are rewritten."""
    folder = records_dir(staging, subset, stream)
    if not folder.is_dir():
        return []
    out: list[ShardRecord] = []
    for path in sorted(folder.glob("*.json")):
        rec = _read(path)
        ok = rec is not None and rec.stream == stream and rec.first == (out[-1].end if out else 0)
        if ok and rec is not None:
            try:
                st = os.stat(shard_of(rec))
                ok = (st.st_size, st.st_mtime_ns) == (rec.size, rec.mtime_ns)
                ok = ok and (stream != DATA or entries_path(path).is_file())
            except OSError:
                ok = False
        if not ok or rec is None:
            for late in sorted(folder.glob("*.json")):
                if late.name >= path.name:
                    late.unlink()
                    entries_path(late).unlink(missing_ok=True)
            break
        out.append(rec)
    return out


def _read(path: Path) -> ShardRecord | None:
    try:
        return ShardRecord.from_dict(read_json(path))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_settings(staging: Path, settings: dict[str, Any]) -> None:
    """Keep the records and shards of an earlier run only if it wrote them with the same
    writer settings (shard sizes, chunking, re-encode settings); else start the v3 part afresh."""
    root = staging / "v3"
    path = root / SETTINGS
    try:
        same = read_json(path) == json.loads(json.dumps(settings))
    except (OSError, ValueError):
        same = False
    if same:
        return
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(staging / "out", ignore_errors=True)
    root.mkdir(parents=True)
    write_text(path, json.dumps(settings))
