"""Validation's read-ahead: the next episodes' files read on a thread pool while one episode is
checked, with the same checks, the same first error, nothing read that the facts index proves,
and no thread left when the validation ends."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dsfactory import Ep, make_dataset, replace_video
from test_video_facts import age

from eva_export.errors import DatasetError
from eva_export.formats.common import mp4_index, video_facts
from eva_export.formats.common.facts_index import FactsIndex
from eva_export.formats.common.meta import read_meta
from eva_export.formats.common.source import SourceCheck
from eva_export.formats.lerobot_v21 import read_ahead, validate
from eva_export.formats.lerobot_v21.read_ahead import EpisodeFiles, ReadAhead
from eva_export.formats.lerobot_v21.validate import validate_source
from eva_export.manifest import sha256_file

N = 7
CAMS = ("observation.images.cam0", "observation.images.cam1")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("ra") / "raw", [Ep(frames=4 + e % 3) for e in range(N)],
                        cameras=2, width=32, height=24)


@pytest.fixture()
def source(built: Path, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "demo" / "raw"
    shutil.copytree(built, root)
    age(root)
    video_facts.forget_all()
    yield root
    video_facts.forget_all()


def force(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every episode read ahead, however small, hashed or not (by default tiny files, and any
    file not hashed, are left to the check)."""
    monkeypatch.setattr(read_ahead, "SMALL_BYTES", 0)
    monkeypatch.setattr(read_ahead, "SMALL_UNHASHED_BYTES", 0)


@pytest.fixture()
def ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    force(monkeypatch)


def mp4(root: Path, ep: int, cam: int = 0) -> Path:
    return root / f"videos/chunk-000/{CAMS[cam]}/episode_{ep:06d}.mp4"


def table(root: Path, ep: int) -> Path:
    return root / f"data/chunk-000/episode_{ep:06d}.parquet"


class Reads:
    """Every whole read of an MP4 (mp4_index.file_bytes) and of a table ahead, with its thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp4s: list[tuple[Path, str]] = []
        self.tables: list[Path] = []
        whole, file_bytes = mp4_index.whole_file, mp4_index.file_bytes

        def counted_mp4(path: Path) -> bytes | None:
            self.mp4s.append((Path(path), threading.current_thread().name))
            return file_bytes(path)

        def counted_whole(path: Path, bound: int) -> bytes | None:
            if bound != mp4_index.MAX_BYTES:
                self.tables.append(Path(path))
            return whole(path, bound)

        monkeypatch.setattr(mp4_index, "file_bytes", counted_mp4)
        monkeypatch.setattr(mp4_index, "whole_file", counted_whole)


def summary(check: SourceCheck) -> list[object]:
    return [check.source_hash] + [(e.index, e.rows, e.columns, e.task_indices, e.bytes, e.data_path, e.video_paths)
                                  for e in check.episodes]


def threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("eva-read-ahead")]


def test_read_ahead_or_not_the_same_check(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = summary(validate_source(source))
    video_facts.forget_all()
    force(monkeypatch)
    reads = Reads(monkeypatch)
    assert summary(validate_source(source)) == plain
    # episode 0 is read by the check itself, every later one ahead on the pool, each file once
    ahead = sorted(p for p, name in reads.mp4s if name.startswith("eva-read-ahead"))
    assert ahead == sorted(mp4(source, e, c) for e in range(1, N) for c in (0, 1))
    assert sorted(p for p, _ in reads.mp4s) == sorted(mp4(source, e, c) for e in range(N) for c in (0, 1))
    assert sorted(reads.tables) == [table(source, e) for e in range(1, N)]
    assert threads() == []


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


FAULTS: dict[str, Callable[[Path, int], None]] = {
    "frames": lambda root, ep: replace_video(root, CAMS[1], ep, frames=9, width=32, height=24),
    "truncated mp4": lambda root, ep: _truncate(mp4(root, ep, 1)),
    "garbage table": lambda root, ep: table(root, ep).write_bytes(b"not a parquet file" * 100),
    "missing mp4": lambda root, ep: mp4(root, ep, 0).unlink(),
    "missing table": lambda root, ep: table(root, ep).unlink(),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_first_broken_episode_is_named_with_the_same_message(source: Path, fault: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    FAULTS[fault](source, 2)
    FAULTS["truncated mp4" if fault != "truncated mp4" else "garbage table"](source, 4)  # a later one broken too
    age(source)
    with pytest.raises(DatasetError) as plain:
        validate_source(source)
    video_facts.forget_all()
    force(monkeypatch)
    with pytest.raises(DatasetError) as ahead:
        validate_source(source)
    assert str(ahead.value) == str(plain.value)
    assert str(ahead.value).startswith("episode 2: ")
    assert threads() == []


def _gone_after_read_ahead(monkeypatch: pytest.MonkeyPatch, target: Path, then: Callable[[], None]) -> None:
    """``then`` runs once the pool has read ``target``, before the check of its episode (3)."""
    read = threading.Event()
    real_read_one, real_take = read_ahead._read_one, ReadAhead.take

    def read_one(path: Path, *args: Any) -> read_ahead.Read | None:
        out = real_read_one(path, *args)
        if path == target and out is not None:
            read.set()
        return out

    def take(self: ReadAhead, n: int, before: int | None = None) -> EpisodeFiles | None:
        files = real_take(self, n, before)
        if n == 3:
            assert read.wait(60), "the pool never read the file"
            then()
        return files

    monkeypatch.setattr(read_ahead, "_read_one", read_one)
    monkeypatch.setattr(ReadAhead, "take", take)


@pytest.mark.parametrize("kind", ["mp4", "table"])
def test_a_file_gone_between_read_ahead_and_check(source: Path, ahead: None, kind: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = mp4(source, 3) if kind == "mp4" else table(source, 3)
    _gone_after_read_ahead(monkeypatch, target, target.unlink)
    with pytest.raises(DatasetError) as err:
        validate_source(source)
    want = (f"episode 3: camera file {target} ({CAMS[0]}) is missing" if kind == "mp4"
            else f"episode 3: Parquet file {target} is missing")
    assert str(err.value) == want
    assert threads() == []


def test_a_file_replaced_after_its_read_ahead_is_checked_as_it_is_now(source: Path, ahead: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    target = mp4(source, 3, 1)
    _gone_after_read_ahead(monkeypatch, target,
                           lambda: replace_video(source, CAMS[1], 3, frames=9, width=32, height=24))
    with pytest.raises(DatasetError, match=rf"^episode 3: {target} \({CAMS[1]}\) has 9 frames but "):
        validate_source(source)


def validated(root: Path, jobs: Path) -> None:
    """One validation as a job runs it: a fresh process's memory, the jobs directory's index,
    the camera files hashed for a pair that links them."""
    video_facts.forget_all()
    jobs.mkdir(exist_ok=True)
    index = FactsIndex(jobs)
    try:
        with video_facts.use_index(index), video_facts.digests_of_reads(True):
            validate_source(root)
    finally:
        index.close()


def test_a_rerun_on_the_facts_index_reads_nothing(source: Path, ahead: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    reads = Reads(monkeypatch)
    tables = []
    real_check_table = validate.check_table
    monkeypatch.setattr(validate, "check_table", lambda *a, **kw: tables.append(a[3]) or real_check_table(*a, **kw))
    validated(source, tmp_path / "jobs")
    assert sorted(p for p, _ in reads.mp4s) == sorted(mp4(source, e, c) for e in range(N) for c in (0, 1))
    assert len(tables) == N
    reads.mp4s.clear()
    reads.tables.clear()
    tables.clear()
    validated(source, tmp_path / "jobs")  # the unchanged source: every file proved by the index
    assert (reads.mp4s, reads.tables, tables) == ([], [], [])


def test_the_camera_files_read_ahead_are_hashed_for_the_index(source: Path, ahead: None, tmp_path: Path) -> None:
    validated(source, tmp_path / "jobs")
    index = FactsIndex(tmp_path / "jobs")
    try:
        got = [index.get(video_facts.file_key(mp4(source, e, c)), video_facts.SHA256_KIND)
               for e in range(N) for c in (0, 1)]
    finally:
        index.close()
    assert got == [sha256_file(mp4(source, e, c)) for e in range(N) for c in (0, 1)]


@pytest.mark.parametrize("budget", [1, "episode", None])
def test_bounded_in_bytes_and_episodes(source: Path, ahead: None, budget: int | str | None) -> None:
    meta = read_meta(source, digest=True)
    sizes = [sum(p.stat().st_size for p in (table(source, e), mp4(source, e), mp4(source, e, 1))) for e in range(N)]
    files = [max(p.stat().st_size for p in (table(source, e), mp4(source, e), mp4(source, e, 1))) for e in range(N)]
    limit = max(sizes) if budget == "episode" else budget
    assert limit is None or isinstance(limit, int)
    window = 2
    with ReadAhead(meta, "", budget=limit, window=window) as reads:
        for n in range(N):
            got = reads.take(n)
            assert got is not None and got.data == table(source, n)
            assert reads.next <= n + window + 1
            # at most the budget held ahead, or one file alone when the budget is smaller
            assert reads.held <= max(limit if limit is not None else read_ahead.BYTES, max(files))
            if limit == 1:
                assert reads.held <= max(files)
        assert reads.held == 0
    assert threads() == []


def test_an_error_leaves_no_thread_reading(source: Path, ahead: None, monkeypatch: pytest.MonkeyPatch) -> None:
    started: set[int] = set()
    real_read_one = read_ahead._read_one

    def read_one(path: Path, *args: Any) -> read_ahead.Read | None:
        started.add(int(path.stem.rpartition("_")[2]))
        return real_read_one(path, *args)

    monkeypatch.setattr(read_ahead, "_read_one", read_one)
    monkeypatch.setattr(read_ahead, "EPISODES", 2)
    table(source, 1).write_bytes(b"garbage")
    age(source)
    with pytest.raises(DatasetError, match=r"^episode 1: cannot read "):
        validate_source(source)
    assert threads() == []
    assert {1} <= started <= {1, 2, 3}  # never more than the window ahead of the episode checked


def test_small_episodes_are_read_by_their_checks_and_soon_not_planned(source: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Under SMALL_BYTES an episode's files are read by its check; after a small episode checked,
    the next ones are not even planned (a plan would only cost)."""
    plain = summary(validate_source(source))
    video_facts.forget_all()
    monkeypatch.setattr(read_ahead, "EPISODES", 2)
    reads = Reads(monkeypatch)
    planned: list[int] = []
    real_plan = ReadAhead._plan

    def plan(self: ReadAhead) -> EpisodeFiles | None:
        planned.append(self.next)
        return real_plan(self)

    monkeypatch.setattr(ReadAhead, "_plan", plan)
    assert summary(validate_source(source)) == plain
    assert planned == [0, 1, 2]  # the first episode and its window, before any was checked
    assert reads.tables == [] and all(name == threading.current_thread().name for _, name in reads.mp4s)
    assert len(reads.mp4s) == 2 * N


def test_only_files_the_job_hashes_are_read_ahead(source: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain read is cheap on the validating thread: without hashing nothing is read ahead."""
    monkeypatch.setattr(read_ahead, "SMALL_BYTES", 0)  # the hashed threshold only
    reads = Reads(monkeypatch)
    validate_source(source)
    assert reads.tables == [] and {name for _, name in reads.mp4s} == {threading.current_thread().name}
    reads.mp4s.clear()
    validated(source, tmp_path / "jobs")  # hashed for the index: read ahead
    assert {p for p, name in reads.mp4s if name.startswith("eva-read-ahead")} == \
        {mp4(source, e, c) for e in range(1, N) for c in (0, 1)}
    assert reads.tables == [table(source, e) for e in range(1, N)]
