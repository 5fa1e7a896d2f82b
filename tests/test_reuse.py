"""Validation's reads kept for an export job's writer (formats/common/reuse.py): a small
episode table and a stats row are handed to the one reader after validation exactly as a read
of the file gives them, once, never for a file changed since, never from a verifier's pass, and
never past the budget."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset

from eva_export import pool
from eva_export.errors import DatasetError
from eva_export.formats.common import reuse, source_rules, stats_index
from eva_export.formats.common.table import read_parquet
from eva_export.formats.lerobot_v21.validate import validate_source

OLD_NS = 1_000_000_000  # old enough to be trusted unchanged (video_facts' margin)


def _source(tmp_path: Path, n: int = 4) -> Path:
    src = make_dataset(tmp_path / "demo" / "raw", [Ep(frames=5 + i) for i in range(n)], cameras=1, width=32,
                       height=24)
    for p in src.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(OLD_NS, OLD_NS))
    return src


@pytest.fixture
def disk_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The tables read from disk through SourceEpisode.read_table."""
    reads: list[Path] = []

    def counted(path: Path, columns: list[str] | None = None) -> pa.Table:
        reads.append(path)
        return read_parquet(path, columns)

    monkeypatch.setattr(source_rules, "read_parquet", counted)
    return reads


def test_a_kept_table_is_the_file_as_read_and_handed_out_once(tmp_path: Path, disk_reads: list[Path]) -> None:
    src = _source(tmp_path)
    with reuse.keeping():
        check = validate_source(src)
        for ep in check.episodes:
            disk = read_parquet(ep.data_path)
            kept = ep.read_table()
            assert kept.equals(disk) and kept.schema.equals(disk.schema, check_metadata=True)
        assert disk_reads == []  # every table came from validation's read
        first = check.episodes[0].data_path
        assert check.episodes[0].read_table().equals(read_parquet(first))
        assert disk_reads == [first]  # handed out once: read from the file again
    with reuse.keeping():
        assert not reuse.held(reuse.TABLE) and not any(reuse._used.values())  # dropped when the job ended


def test_a_table_changed_after_validation_is_read_from_its_file(tmp_path: Path, disk_reads: list[Path]) -> None:
    src = _source(tmp_path)
    with reuse.keeping():
        check = validate_source(src)
        ep = check.episodes[1]
        table = read_parquet(ep.data_path)
        changed = table.set_column(table.schema.get_field_index("timestamp"), "timestamp",
                                   pa.array([t + 1.0 for t in table.column("timestamp").to_pylist()], pa.float32()))
        pq.write_table(changed, ep.data_path)  # rewritten: a new mtime (and maybe size)
        got = ep.read_table()
        assert disk_reads == [ep.data_path] and got.column("timestamp").equals(changed.column("timestamp"))


def test_nothing_is_kept_outside_a_job_by_a_verifier_or_for_a_fresh_file(tmp_path: Path) -> None:
    src = _source(tmp_path)
    check = validate_source(src)  # no job keeping
    assert not reuse.held(reuse.TABLE) and not check.meta.episodes_stats._kept  # type: ignore[attr-defined]
    with reuse.keeping():
        check = validate_source(src, as_source=False)  # a verifier's pass over a staged subset
        assert not reuse.held(reuse.TABLE) and not check.meta.episodes_stats._kept  # type: ignore[attr-defined]
        fresh = check.episodes[0].data_path
        os.utime(fresh)  # modified just now: its identity is not trusted yet
        check = validate_source(src)
        assert reuse.held(reuse.TABLE) == len(check.episodes) - 1


def test_the_budget_bounds_what_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        disk_reads: list[Path]) -> None:
    src = _source(tmp_path, 6)
    for kind in reuse.BUDGETS:
        monkeypatch.setitem(reuse.BUDGETS, kind, 1)  # no room for anything
    with reuse.keeping():
        check = validate_source(src)
        assert not reuse.held(reuse.TABLE) and not check.meta.episodes_stats._kept  # type: ignore[attr-defined]
        assert [ep.read_table().num_rows for ep in check.episodes] == [5 + i for i in range(6)]
        assert len(disk_reads) == 6
    first_three = sum(reuse.table_bytes(read_parquet(ep.data_path)) for ep in check.episodes[:3])
    monkeypatch.setitem(reuse.BUDGETS, reuse.TABLE, first_three + 10)  # the first three tables
    with reuse.keeping():
        check = validate_source(src)
        assert reuse.held(reuse.TABLE) == 3 and reuse._used[reuse.TABLE] <= reuse.BUDGETS[reuse.TABLE]
        for ep in check.episodes:
            ep.read_table()
        assert len(disk_reads) == 6 + 3 and reuse._used[reuse.TABLE] == 0  # handed out: left the budget


def test_a_kept_stats_row_is_the_row_parsed_and_still_guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(tmp_path)
    rereads: list[int] = []
    real = os.pread
    monkeypatch.setattr(stats_index.os, "pread", lambda fd, n, off: rereads.append(off) or real(fd, n, off))
    plain = validate_source(src).meta.episodes_stats[0]  # parsed on demand
    with reuse.keeping():
        stats = validate_source(src).meta.episodes_stats
        rereads.clear()
        first = stats[0]
        assert rereads == [] and first == plain  # kept: no reread, the same row
        assert stats[0] == first and len(rereads) == 1  # handed out once, then read again
        path = src / "meta" / "episodes_stats.jsonl"
        os.utime(path)  # changed in place (its mtime no longer the scanned one)
        with pytest.raises(DatasetError, match="changed in place"):
            stats[1]  # a kept row too: the file is checked first


def test_a_release_after_the_job_ended_does_not_count_against_the_next(tmp_path: Path) -> None:
    src = _source(tmp_path)
    with reuse.keeping():
        stats = validate_source(src).meta.episodes_stats
        assert stats._kept  # type: ignore[attr-defined]
    with reuse.keeping():
        ticket = reuse.admit(reuse.ROW, 100)
        assert ticket and reuse._used[reuse.ROW] == 100
        stats.close()  # the first job's rows, dropped late
        assert reuse._used[reuse.ROW] == 100
        reuse.release(reuse.ROW, 100, ticket)
        assert reuse._used[reuse.ROW] == 0


def test_tables_are_not_kept_for_writers_in_worker_processes(tmp_path: Path) -> None:
    """Units on workers started up front read their tables themselves: only statistics rows
    (read by the unit loop's own process) are kept; an auto pool reads here while cheap."""
    src = _source(tmp_path)
    with reuse.keeping(tables=False):
        check = validate_source(src)
        assert not reuse.held(reuse.TABLE) and check.meta.episodes_stats._kept  # type: ignore[attr-defined]
    assert pool.reads_here()  # no executor: serial
    with pool.LocalPool(2, auto=True) as auto, pool.using(auto):
        assert pool.reads_here()
    with pool.LocalPool(2) as fixed, pool.using(fixed):
        assert not pool.reads_here()
    with pool.LocalPool(1) as one, pool.using(one):
        assert pool.reads_here()
