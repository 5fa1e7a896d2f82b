"""facts_index with several jobs at once in one process (a Ray batch's datasets, the export
service's job threads): one connection per file, each job's index its own, and a busy file
never taken for a damaged one."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from eva_export.formats.common import facts_index, video_facts
from eva_export.formats.common.facts_index import INDEX_NAME, FactsIndex

KEY = (1, 2, 3, 4)


def test_two_jobs_share_one_connection(tmp_path: Path) -> None:
    a, b = FactsIndex(tmp_path), FactsIndex(tmp_path)
    assert a.active and b.active
    a.put(KEY, "k", "from a")
    assert b.get(KEY, "k") == "from a"  # one connection: no lock between the two jobs
    a.close()
    assert not a.active and a.get(KEY, "k") is None
    b.put((5, 6, 7, 8), "k", "from b")
    assert b.get(KEY, "k") == "from a"
    b.close()
    c = FactsIndex(tmp_path)  # both jobs' rows were committed
    assert c.get(KEY, "k") == "from a" and c.get((5, 6, 7, 8), "k") == "from b"
    c.close()


def test_a_locked_index_is_not_replaced(tmp_path: Path) -> None:
    first = FactsIndex(tmp_path)
    first.put(KEY, "k", "kept")
    first.close()
    other = sqlite3.connect(str(tmp_path / INDEX_NAME), isolation_level=None)  # another process's job
    other.execute("BEGIN EXCLUSIVE")
    try:
        locked = FactsIndex(tmp_path)
        assert not locked.active  # runs without the index ...
        assert locked.get(KEY, "k") is None
        locked.put(KEY, "k", "lost")
        locked.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
    again = FactsIndex(tmp_path)  # ... and did not unlink a file in use
    assert again.get(KEY, "k") == "kept"
    again.close()


def test_each_thread_keeps_its_own_index(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ia, ib = FactsIndex(tmp_path / "a"), FactsIndex(tmp_path / "b")
    entered, a_left = threading.Event(), threading.Event()
    seen: list[bool] = []

    def job_b() -> None:
        with video_facts.use_index(ib):
            entered.set()
            a_left.wait(60)
            video_facts.index_put(KEY, "k", "b")  # after job a left its block
            seen.append(video_facts.index_active())

    t = threading.Thread(target=job_b)
    t.start()
    with video_facts.use_index(ia):
        assert entered.wait(60)
        assert video_facts.index_active()
    a_left.set()
    t.join(60)
    assert seen == [True]
    assert ib.get(KEY, "k") == "b" and ia.get(KEY, "k") is None
    assert not video_facts.index_active()  # this thread's block ended: no index
    ia.close()
    ib.close()


def test_an_index_over_its_bound_is_emptied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = FactsIndex(tmp_path)
    for i in range(2000):
        index.put((1, i, 3, 4), "k", "x" * 200)
    index.close()
    size = (tmp_path / INDEX_NAME).stat().st_size
    monkeypatch.setattr(facts_index, "MAX_BYTES", size - 1)
    emptied = FactsIndex(tmp_path)
    assert emptied.active and emptied.get((1, 7, 3, 4), "k") is None
    emptied.put(KEY, "k", "new")
    emptied.close()
    assert (tmp_path / INDEX_NAME).stat().st_size < size // 10  # the file shrank, not only the table
    kept = FactsIndex(tmp_path)  # under the bound now: kept
    assert kept.get(KEY, "k") == "new"
    kept.close()
