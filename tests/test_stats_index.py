"""episodes_stats.jsonl kept as line offsets: the rows read back are the rows on
disk, a file changed after it was read is refused naming it, a mutation holds the rows, and
validation keeps one shared schema for tables that have the same one."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export.errors import DatasetError
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.records import EpisodeStats
from eva_export.formats.common.stats_index import StatsIndex
from eva_export.formats.lerobot_v21.validate import validate_source

STATS = "meta/episodes_stats.jsonl"


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("stats") / "raw", [Ep(frames=4), Ep(frames=5), Ep(frames=3)])


def _on_disk(root: Path) -> dict[int, EpisodeStats]:
    rows = [EpisodeStats.from_dict(json.loads(line)) for line in (root / STATS).read_text().splitlines()]
    return {r.episode_index: r for r in rows}


def test_rows_read_on_demand_equal_the_file(raw: Path) -> None:
    meta = read_meta(raw)
    assert isinstance(meta.episodes_stats, StatsIndex)
    want = _on_disk(raw)
    assert sorted(meta.episodes_stats) == [0, 1, 2] and len(meta.episodes_stats) == 3
    assert dict(meta.episodes_stats.items()) == want
    assert 1 in meta.episodes_stats and 7 not in meta.episodes_stats
    assert meta.episodes_stats.get(7) is None
    assert [meta.episodes_stats.line_of(e) for e in range(3)] == [1, 2, 3]


def test_a_later_duplicate_row_wins_as_before(tmp_path: Path, raw: Path) -> None:
    root = tmp_path / "dup"
    make_dataset(root, [Ep(frames=3), Ep(frames=3)])
    lines = (root / STATS).read_text().splitlines()
    first = json.loads(lines[0])
    first["stats"]["action"]["min"] = [-99.0] * 6
    (root / STATS).write_text("\n".join([*lines, json.dumps(first)]) + "\n")
    stats = read_meta(root).episodes_stats
    assert len(stats) == 2 and stats[0].stats["action"]["min"] == [-99.0] * 6
    assert isinstance(stats, StatsIndex) and stats.line_of(0) == 3


def test_a_file_replaced_after_reading_keeps_the_snapshot(tmp_path: Path) -> None:
    """The capture writer replaces the file (atomically) when it commits an episode during an
    export: the export goes on with the rows it read, as with a dict of rows."""
    root = make_dataset(tmp_path / "raw", [Ep(frames=3), Ep(frames=4)])
    meta = read_meta(root)
    want = _on_disk(root)
    make_dataset(root, [Ep(frames=5)])  # a third episode committed: the file is rewritten
    assert sorted(_on_disk(root)) == [0, 1, 2]
    assert dict(meta.episodes_stats.items()) == want


def test_a_file_changed_in_place_is_refused_naming_it(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "raw", [Ep(frames=3), Ep(frames=4)])
    meta = read_meta(root)
    with open(root / STATS, "ab") as fh:  # in place: same inode, another size
        fh.write(b"\n")
    with pytest.raises(DatasetError) as exc:
        meta.episodes_stats[1]
    assert str(root / STATS) in str(exc.value) and "changed in place" in str(exc.value)


def test_pickled_index_carries_its_rows(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "raw", [Ep(frames=3), Ep(frames=4)])
    stats = read_meta(root).episodes_stats
    want = _on_disk(root)
    copy = pickle.loads(pickle.dumps(stats))
    (root / STATS).unlink()  # the copy holds its rows; the original reads its open file
    assert isinstance(copy, StatsIndex) and dict(copy.items()) == dict(stats.items()) == want
def test_a_mutation_holds_every_row_in_memory(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "raw", [Ep(frames=3), Ep(frames=4)])
    stats = read_meta(root).episodes_stats
    want = _on_disk(root)
    stats[5] = EpisodeStats(5, {})
    del stats[0]
    (root / STATS).unlink()  # held: the file is not read again
    assert dict(stats.items()) == {1: want[1], 5: EpisodeStats(5, {})}
    assert isinstance(stats, StatsIndex) and stats.line_of(1) == 0


def test_a_dataset_without_the_file_has_an_empty_index(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "raw", [Ep(frames=3)])
    os.unlink(root / STATS)
    stats = read_meta(root).episodes_stats
    assert len(stats) == 0 and 0 not in stats


def test_validation_keeps_one_schema_for_equal_tables(raw: Path) -> None:
    check = validate_source(raw, as_source=False)
    first = check.episodes[0]
    assert first.schema is not None and len(check.episodes) == 3
    for ep in check.episodes[1:]:
        assert ep.schema is first.schema and ep.columns is first.columns
