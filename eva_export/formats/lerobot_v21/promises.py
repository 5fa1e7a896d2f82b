"""Episode indices promised before the episode is saved (live capture's STOP reply).

STOP answers with the index a take will be saved under while the take still waits in the
save queue; reviews and fleet tooling address the take by that number. So an index, once
promised, belongs to that take only:

* the promise is kept with the take's staging directory (``take.json``) and reserved here, so
  every later take (or bag ingest) gets a higher index, whatever the save backlog;
* the save commits exactly the promised index (a failed save is retried by the capture's save
  worker, the takes behind it waiting, so no index moves);
* a take lost before its save (the process killed, or closed while its save kept failing; found
  by recovery through its ``take.json``) is *reported*: the log, the start-up recovery report
  and ``.lost_takes.jsonl`` at the dataset root name its index and why. The raw episode indices
  stay 0..n-1 (v2.1 readers index episodes by position), so the next take gets that index again.

A take also has an id (``take_id``: its staging directory's name, the START time and 8 random
hex digits), returned by STOP and kept in ``take.json``, in its episodes.jsonl row and in its
lost record. A review of a promised index that is not (yet) in the dataset is refused with the
reason (``absent_reason``), never applied to another episode; a review naming a take id is
applied only to the row holding that take (``mismatch``), so one aimed at a lost take is refused
even after the next take got its index.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...confine import check_name
from ...fsutil import atomic_write_jsonl, iter_jsonl, read_json

__all__ = ["LOST", "TAKE", "LostTake", "Promises"]

TAKE = "take.json"  # in a take's staging directory: the index its STOP reply promised
LOST = ".lost_takes.jsonl"  # at the dataset root: promised indices whose take was lost


@dataclass(frozen=True)
class LostTake:
    """A promised episode index whose take was lost before its save, and why."""

    episode_index: int
    reason: str
    lost_at: str
    take_id: str = ""  # "" in a record written before takes had ids

    def to_dict(self) -> dict[str, Any]:
        return {"episode_index": self.episode_index, "take_id": self.take_id, "reason": self.reason,
                "lost_at": self.lost_at}

    @classmethod
    def from_dict(cls, d: Any) -> LostTake:
        if not isinstance(d, dict) or type(d.get("episode_index")) is not int or d["episode_index"] < 0:
            raise ValueError(f"not a lost take record: {d!r}")
        return cls(d["episode_index"], str(d.get("reason", "")), str(d.get("lost_at", "")), str(d.get("take_id", "")))


class Promises:
    """Promised indices of one dataset, and the lost ones (guarded by its DatasetWriter's lock)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pending: dict[Path, int] = {}  # staging directory -> promised index, not yet committed
        self.lost: dict[int, LostTake] = {}  # index -> the last take lost under it
        self.lost_takes: dict[str, LostTake] = {}  # take id -> its record (every lost take with an id)
        self._records: list[LostTake] = []  # .lost_takes.jsonl, every line (an index may be lost twice)
        path = root / LOST
        if path.is_file():
            try:
                self._records = [LostTake.from_dict(d) for d in iter_jsonl(path)]
            except (OSError, ValueError) as exc:
                raise ValueError(f"{path}: {exc}") from exc
        for r in self._records:
            self._index(r)

    def _index(self, r: LostTake) -> None:
        self.lost[r.episode_index] = r
        if r.take_id:
            self.lost_takes[r.take_id] = r

    def floor(self) -> int:
        """The lowest index above every pending promise."""
        return max(self.pending.values(), default=-1) + 1

    def reserve(self, staging: Path, index: int) -> None:
        """Promise ``index`` to the take staged in ``staging`` (kept there for recovery).

        Not fsynced: the record must outlive a killed process (the page cache does), and an
        fsync here would hold the STOP reply behind a busy disk."""
        (staging / TAKE).write_text(json.dumps({"episode_index": index, "take_id": staging.name}) + "\n",
                                    encoding="utf-8")
        self.pending[staging] = index

    def index_of(self, staging: Path) -> int | None:
        return self.pending.get(staging)

    def done(self, staging: Path) -> None:
        self.pending.pop(staging, None)

    def lose(self, index: int, reason: str, take_id: str = "") -> None:
        record = LostTake(index, reason, time.strftime("%Y-%m-%dT%H:%M:%S%z"), take_id)
        self._records.append(record)
        self._index(record)
        atomic_write_jsonl(self.root / LOST, [r.to_dict() for r in self._records])

    def give_up(self, staging: Path, reason: str) -> int | None:
        """The take staged in ``staging`` will not be saved: report its promised index (if any)."""
        index = self.pending.pop(staging, None)
        if index is not None:
            self.lose(index, reason, staging.name)
        return index

    def recover(self, staging: Path) -> str | None:
        """An uncommitted staging directory found at start-up: report the index it was promised."""
        if not (staging / TAKE).is_file():
            return None  # never stopped (recording when the process ended): nothing was promised
        try:
            index = read_json(staging / TAKE)["episode_index"]
            if type(index) is not int or index < 0:
                raise ValueError(f"episode_index {index!r}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"a stopped take ({staging.name}) was lost; its promised index is unreadable: {exc}"
        # the take's id is its staging name (take.json repeats it for readers; never trusted over it)
        self.lose(index, "the process ended before the take was saved", staging.name)
        return f"episode {index} (take {staging.name}) was promised but lost: the process ended before its save"

    def absent_reason(self, index: int) -> str | None:
        """Why a promised ``index`` is not listed, or None when it never was promised."""
        if index in self.pending.values():
            return "is still being saved (waiting in the save queue); review it once it is listed"
        if index in self.lost:
            return f"was never saved: {self.lost[index].reason} (the next take gets this index)"
        return None

    def take_reason(self, take_id: str) -> str:
        """What became of the take ``take_id`` (when it is not the one a row holds)."""
        if take_id in {s.name for s in self.pending}:
            return f"take {take_id} is still being saved (waiting in the save queue); review it once it is listed"
        if lost := self.lost_takes.get(take_id):
            return f"take {take_id} was lost: {lost.reason} (promised episode {lost.episode_index})"
        return f"take {take_id} is not in this dataset"

    def mismatch(self, index: int, held: str | None, take_id: str) -> str | None:
        """Why a review naming ``take_id`` must not touch episode ``index`` (which holds the take
        ``held``, None when the index is not listed); None when it may."""
        if not take_id:
            return None
        check_name(take_id, "take id")  # echoed in the reply: never an arbitrary string
        if held == take_id:
            return None
        holds = "is not listed" if held is None else f"holds take {held}" if held else "holds no take id"
        return f"episode {index} {holds}, not {take_id}: {self.take_reason(take_id)}"
