"""Reading a v2.1 dataset's meta/ directory into typed records."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ... import confine
from ...errors import DatasetError
from ...fsutil import iter_jsonl_lines, read_json
from .records import DatasetInfo, EpisodeRow, EpisodeStats, TaskRow
from .stats import complete_stats
from .stats_index import StatsIndex

INFO = "meta/info.json"
EPISODES = "meta/episodes.jsonl"
EPISODES_STATS = "meta/episodes_stats.jsonl"
TASKS = "meta/tasks.jsonl"
STATS = "meta/stats.json"

T = TypeVar("T")


@dataclass
class DatasetMeta:
    root: Path
    info: DatasetInfo
    episodes: list[EpisodeRow]
    tasks: list[TaskRow]
    # read_meta's is a StatsIndex (offsets, rows parsed on demand: memory flat in the episodes)
    episodes_stats: MutableMapping[int, EpisodeStats]

    @property
    def task_index(self) -> dict[str, int]:
        return {t.task: t.task_index for t in self.tasks}

    @property
    def task_text(self) -> dict[int, str]:
        return {t.task_index: t.task for t in self.tasks}

    def data_path(self, episode_index: int) -> Path:
        """The episode's data file; the template and the resolved file are confined to root."""
        confine.check_template(self.info.data_path, "data", str(self.root / INFO))
        return confine.confined(self.root, self.info.data_file(episode_index), "data file")

    def video_path(self, key: str, episode_index: int) -> Path:
        """The episode's camera file; template, key and resolved file are confined to root."""
        confine.check_template(self.info.video_path, "video", str(self.root / INFO))
        confine.check_key(key, "video key")
        return confine.confined(self.root, self.info.video_file(key, episode_index), "video file")


def read_info(root: Path) -> DatasetInfo:
    path = Path(root) / INFO
    if not path.is_file():
        raise DatasetError(f"{path} is missing: not a LeRobot dataset")
    confine.confined(Path(root), INFO, "meta file")  # a symlinked info.json pointing out
    try:
        return DatasetInfo.from_dict(read_json(path))
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: {exc if not isinstance(exc, KeyError) else f'lacks {exc}'}") from None
    except OSError as exc:
        raise DatasetError(f"{path}: unreadable ({exc.strerror or exc})") from None


def _rows(path: Path, required: bool, parse: Callable[[dict[str, object]], T]) -> list[tuple[int, T]]:
    """The typed rows of a JSON Lines meta file with their line numbers; every fault (decode,
    bounds, a malformed row) is a DatasetError naming ``path:line``."""
    out: list[tuple[int, T]] = []
    _scan(path, required, parse, lambda row, lineno: out.append((lineno, row)))
    return out


def _scan(path: Path, required: bool, parse: Callable[[dict[str, object]], T], keep: Callable[[T, int], None],
          lines: Callable[[], Iterator[tuple[int, dict[str, object]]]] | None = None) -> None:
    """Parse every row of a JSON Lines meta file (``lines``: how to read them, by default
    iter_jsonl_lines), handing each to ``keep(row, line)``; nothing when absent and not required."""
    if not path.is_file():
        if required:
            raise DatasetError(f"{path} is missing")
        return
    confine.confined(path.parent.parent, f"meta/{path.name}", "meta file")
    lineno = 0
    try:
        for lineno, d in (lines() if lines is not None else iter_jsonl_lines(path)):
            keep(parse(d), lineno)
    except OSError as exc:
        raise DatasetError(f"{path}: unreadable ({exc.strerror or exc})") from None
    except ValueError as exc:
        if str(exc).startswith(str(path)):  # the reader named the line already
            raise DatasetError(str(exc)) from None
        raise DatasetError(f"{path}:{lineno}: malformed row ({exc})") from None
    except (KeyError, TypeError) as exc:
        raise DatasetError(f"{path}:{lineno}: malformed row (lacks or mistypes {exc})") from None


def _stats_index(path: Path, digest: Callable[[EpisodeStats], int] | None = None,
                 limit: int | None = None, keep: bool = False) -> StatsIndex:
    """episodes_stats.jsonl checked line by line, kept as spans (an empty index when absent)."""
    index = StatsIndex(digest, keep)
    _scan(path, False, EpisodeStats.from_dict, index.note, lambda: index.scan(path, limit))
    return index


#: Bytes a stats row may spend per value (a float's repr, its separator and list brackets, with
#: room to spare) and on each feature's names and counts; a row longer than that holds more
#: than the features info.json declares.
STATS_BYTES_PER_VALUE = 64
STATS_BYTES_PER_FEATURE = 4096


def stats_line_limit(info: DatasetInfo) -> int:
    """The longest episodes_stats.jsonl line the declared features can need (min, max, mean and
    std of each element; 3 per visual feature, stored per channel), plus 64 KiB."""
    values = sum(3 if f.is_visual else max(0, int(np.prod(f.shape, dtype=np.float64))) for f in info.features.values())
    return 65536 + len(info.features) * STATS_BYTES_PER_FEATURE + 4 * values * STATS_BYTES_PER_VALUE


def check_stats_shapes(meta: DatasetMeta, done: Container[int] = ()) -> None:
    """Each numeric feature's min/max/mean/std vector has the feature's element count (a
    3-element vector for a 7-element feature would fail deep inside the statistics merge).
    ``done``: episodes whose row the caller already checked with ``check_row_shapes`` (each
    row of the index is parsed once per check, not once per caller)."""
    stats = meta.episodes_stats
    for episode in stats:
        if episode not in done:
            check_row_shapes(meta, stats[episode])


def check_row_shapes(meta: DatasetMeta, st: EpisodeStats) -> None:
    """``check_stats_shapes`` of one episode's row."""
    root, info, stats = meta.root, meta.info, meta.episodes_stats
    fault = _shape_fault(info, st)
    if fault is not None:
        key, stat, got = fault
        lineno = stats.line_of(st.episode_index) if isinstance(stats, StatsIndex) else 0
        raise DatasetError(f"{root / EPISODES_STATS}:{lineno}: episode {st.episode_index}: {key} {stat} "
                           f"has {got} values, but {root / INFO} declares shape {list(info.features[key].shape)}")


def _shape_fault(info: DatasetInfo, st: EpisodeStats) -> tuple[str, str, int] | None:
    """The first (feature, stat, size) whose vector size is not the feature's element count."""
    for key, feat in info.features.items():
        entry = st.stats.get(key)
        if feat.is_visual or not isinstance(entry, dict):
            continue
        want = math.prod(feat.shape)  # (np.prod per feature per row was a third of this check)
        for stat in ("min", "max", "mean", "std"):
            if stat in entry and (got := _size(entry[stat])) != want:
                return key, stat, got
    return None


#: stats_digest: bit i set when feature i (info.features order) has all of STAT_KEYS; this bit
#: when the row fails check_row_shapes.
SHAPE_FAULT = 1 << 62


def stats_digest(info: DatasetInfo) -> Callable[[EpisodeStats], int] | None:
    """What source validation asks of each stats row (complete features, shapes), taken while
    read_meta parses the row anyway: the episode checks then need not parse it again. None
    when the features do not fit the bits."""
    if len(info.features) >= 62:
        return None
    keys = list(info.features)

    def digest(st: EpisodeStats) -> int:
        bits = sum(1 << i for i, key in enumerate(keys) if complete_stats(st.stats.get(key)))
        return bits | (SHAPE_FAULT if _shape_fault(info, st) is not None else 0)
    return digest


def _size(value: object) -> int:
    if type(value) is list and all(type(x) is float or type(x) is int for x in value):
        return len(value)  # a flat vector of numbers (every row's, 16 per row): numpy's answer
    try:
        return int(np.asarray(value, dtype=np.float64).size)
    except (ValueError, TypeError):
        return -1  # ragged or not numeric: never the declared size


def read_meta(root: Path, stats: bool = True, digest: bool = False, keep_rows: bool = False) -> DatasetMeta:
    """Load info, episodes, tasks and per-episode stats; each failure names its file.

    ``stats=False``: episodes_stats.jsonl is not read (``episodes_stats`` empty), for a reader
    of the rows and tables only: its every line parsed and checked is most of read_meta's cost.
    ``digest``: each stats row's ``stats_digest`` kept (for validate_source); ``keep_rows``: the
    parsed rows kept for an export job's one reader of each (stats_index.StatsIndex)."""
    root = Path(root)
    info = read_info(root)
    episodes = [r for _, r in _rows(root / EPISODES, True, EpisodeRow.from_dict)]
    tasks = [r for _, r in _rows(root / TASKS, False, TaskRow.from_dict)]
    return DatasetMeta(root=root, info=info, episodes=episodes, tasks=tasks,
                       episodes_stats=_stats_index(root / EPISODES_STATS, stats_digest(info) if digest else None,
                                                   stats_line_limit(info), keep_rows) if stats else {})
