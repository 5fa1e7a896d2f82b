"""Commit records: the journal of one staged capture episode (formats/lerobot_v21/writer.py) and the record
of one exported unit (export/split.py). Each is written last, as the commit point of its files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .records import EpisodeRow, EpisodeStats


@dataclass(frozen=True)
class StagingJournal:
    """journal.json of one staged episode (formats/lerobot_v21/writer.py): written last, it is the commit
    point; replaying it moves the staged files into place and appends the rows."""

    episode: EpisodeRow
    stats: EpisodeStats
    task: str
    moves: tuple[tuple[str, str], ...]  # (staged file name, final path relative to the dataset)

    def to_dict(self) -> dict[str, Any]:
        return {"episode": self.episode.to_dict(), "stats": self.stats.to_dict(), "task": self.task,
                "moves": [list(m) for m in self.moves]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagingJournal:
        return cls(EpisodeRow.from_dict(d["episode"]), EpisodeStats.from_dict(d["stats"]), str(d["task"]),
                   tuple((str(a), str(b)) for a, b in d["moves"]))


@dataclass(frozen=True)
class TableNonFinite:
    """The NaN/inf count of a staged unit table, counted by the unit's writer from the table it
    wrote (formats/common/nonfinite.py reads the table again only when these do not apply): ``file`` is
    the table's (st_dev, st_ino, st_size, st_mtime_ns) right after its rename into place,
    ``keys`` the float features looked for (before presence in the table), ``counts`` each
    present one holding any, in key order."""

    file: tuple[int, int, int, int]
    keys: tuple[str, ...]
    counts: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"file": list(self.file), "keys": list(self.keys), "counts": [list(c) for c in self.counts]}

    @classmethod
    def from_dict(cls, d: Any) -> TableNonFinite | None:
        """The facts a record states, or None for anything not of their exact shape (the table
        is then read)."""
        try:
            file, keys, counts = d["file"], d["keys"], d["counts"]
            if not (isinstance(file, list) and len(file) == 4 and all(type(v) is int for v in file)):
                return None
            if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
                return None
            pairs = tuple((k, n) for k, n in counts)
            if not all(isinstance(k, str) and type(n) is int and n > 0 for k, n in pairs):
                return None
        except (KeyError, TypeError, ValueError):
            return None
        return cls((file[0], file[1], file[2], file[3]), tuple(keys), pairs)


@dataclass(frozen=True)
class UnitRecord:
    """The commit record of one exported episode (a "unit", export/split.py): written after its
    files, so a rerun trusts the unit only when this exists and matches the plan."""

    source_episode_index: int
    episode_index: int
    rows: int
    offset: int  # global index of the unit's first frame in its subset
    row: dict[str, Any]  # the subset's episodes.jsonl line (renumbered, with source_episode_index)
    stats: dict[str, Any]
    video_sizes: dict[str, int]
    nonfinite: TableNonFinite | None = None  # absent in a record written before it existed

    def to_dict(self) -> dict[str, Any]:
        # Shallow: dataclasses.asdict deep-copies the statistics, a third of a short unit's time.
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "nonfinite"}
        if self.nonfinite is not None:
            d["nonfinite"] = self.nonfinite.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnitRecord:
        return cls(int(d["source_episode_index"]), int(d["episode_index"]), int(d["rows"]), int(d["offset"]),
                   dict(d["row"]), dict(d["stats"]), {str(k): int(v) for k, v in d["video_sizes"].items()},
                   TableNonFinite.from_dict(d["nonfinite"]) if "nonfinite" in d else None)
