"""facts_index: what validation proved about a file, kept across runs by file identity, and
never trusted over a different identity, a damaged file or a misplaced index."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dsfactory import Ep, make_dataset, replace_video
from test_video_facts import age, videos

from eva_export.errors import DatasetError
from eva_export.formats.common import facts_index, video_facts
from eva_export.formats.common.facts_index import INDEX_NAME, FactsIndex
from eva_export.formats.lerobot_v21 import validate, validate_media
from eva_export.formats.lerobot_v21.validate import validate_source


@pytest.fixture()
def source(tmp_path: Path) -> Iterator[Path]:
    video_facts.forget_all()
    root = make_dataset(tmp_path / "demo" / "raw", [Ep(frames=5), Ep(frames=7)], cameras=1, width=32, height=24)
    age(root)
    yield root
    video_facts.forget_all()


class Reads:
    """Counts the MP4 demuxes and table reads validation really does (the real functions run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.demux = 0
        self.tables = 0
        monkeypatch.setattr(validate_media, "demux_size", self._count("demux", validate_media.demux_size))
        monkeypatch.setattr(validate, "check_table", self._count("tables", validate.check_table))

    def _count(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kw: Any) -> Any:
            setattr(self, name, getattr(self, name) + 1)
            return fn(*args, **kw)
        return wrapper


def validated(root: Path, export_root: Path) -> None:
    """One validation as a job runs it: a fresh process's memory, the export root's index."""
    video_facts.forget_all()
    export_root.mkdir(exist_ok=True)
    index = FactsIndex(export_root)
    try:
        with video_facts.use_index(index):
            validate_source(root)
    finally:
        index.close()


def test_an_unchanged_source_is_not_read_again(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = Reads(monkeypatch)
    export = source.parent / "export"
    validated(source, export)
    assert (reads.demux, reads.tables) == (2, 2)
    validated(source, export)  # a rerun: one stat and one lookup per file
    assert (reads.demux, reads.tables) == (2, 2)
    assert (export / INDEX_NAME).is_file()


def test_a_changed_size_mtime_or_inode_is_read_again(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    export = source.parent / "export"
    validated(source, export)
    reads = Reads(monkeypatch)
    first, second = videos(source)
    st = os.stat(first)
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # mtime only
    copy = first.with_name("copy.tmp")
    shutil.copy2(second, copy)  # same bytes, size and mtime; a new inode
    os.replace(copy, second)
    validated(source, export)
    assert reads.demux == 2 and reads.tables == 0
    replace_video(source, "observation.images.cam0", 1, frames=6, width=32, height=24)  # a new size
    age(source)
    with pytest.raises(DatasetError, match="has 6 frames but"):
        validated(source, export)


def test_the_key_must_match_exactly(tmp_path: Path) -> None:
    index = FactsIndex(tmp_path)
    key = (1, 2, 3, 4)
    index.put(key, "k", "payload")
    assert index.get(key, "k") == "payload"
    for other in ((9, 2, 3, 4), (1, 9, 3, 4), (1, 2, 9, 4), (1, 2, 3, 9)):
        assert index.get(other, "k") is None
    assert index.get(key, "other kind") is None and index.get(None, "k") is None
    index.close()
    again = FactsIndex(tmp_path)  # kept across runs
    assert again.get(key, "k") == "payload"
    again.close()


def test_a_corrupt_index_is_replaced(source: Path) -> None:
    export = source.parent / "export"
    export.mkdir()
    (export / INDEX_NAME).write_bytes(b"\x00garbage, not SQLite" * 100)
    validated(source, export)  # validates as if no index existed
    index = FactsIndex(export)
    assert index.active and index.get(video_facts.file_key(videos(source)[0]), video_facts.KIND) is not None
    index.close()


def test_bad_payloads_are_recomputed(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    export = source.parent / "export"
    validated(source, export)
    db = sqlite3.connect(export / INDEX_NAME)
    bad = ["[1e999", '{"frames": 5}', '[32, 24, "5", 30, []]', '[32, 24, -5, 30, []]', '[32, 24, 5, 30, [7]]']
    rows = db.execute("SELECT dev, ino, size, mtime, kind FROM facts").fetchall()
    assert len(rows) == 4  # two MP4s, two tables
    for (dev, ino, size, mtime, kind), payload in zip(rows, bad, strict=False):
        db.execute("UPDATE facts SET payload=? WHERE dev=? AND ino=? AND size=? AND mtime=? AND kind=?",
                   (payload, dev, ino, size, mtime, kind))
    db.commit()
    db.close()
    reads = Reads(monkeypatch)
    validated(source, export)
    assert reads.demux == 2 and reads.tables == 2  # nothing of the wrong shape was used
    validated(source, export)
    assert reads.demux == 2 and reads.tables == 2  # and the recomputed facts replaced them


def test_a_misplaced_index_is_never_used(source: Path, tmp_path: Path) -> None:
    """The index file is a symlink (or a hard link) to a file outside: not opened, not written."""
    export = source.parent / "export"
    export.mkdir()
    victim = tmp_path / "victim.db"
    victim.write_bytes(b"keep me")
    (export / INDEX_NAME).symlink_to(victim)
    index = FactsIndex(export)
    assert not index.active
    index.put((1, 2, 3, 4), "k", "x")
    index.close()
    (export / INDEX_NAME).unlink()
    os.link(victim, export / INDEX_NAME)
    assert not FactsIndex(export).active
    assert victim.read_bytes() == b"keep me"
    validated(source, export)  # still validates, without an index
    assert victim.read_bytes() == b"keep me"


def test_the_index_holds_no_paths(source: Path) -> None:
    """Nothing read from the index can name a file: its rows are identities and payloads."""
    export = source.parent / "export"
    validated(source, export)
    db = sqlite3.connect(export / INDEX_NAME)
    columns = [r[1] for r in db.execute("PRAGMA table_info(facts)")]
    payloads = [r[0] for r in db.execute("SELECT payload FROM facts")]
    db.close()
    assert columns == ["dev", "ino", "size", "mtime", "kind", "payload"]
    assert payloads and not any(str(source) in p or "/" in p for p in payloads)


def test_versions_are_kept_apart(tmp_path: Path) -> None:
    index = FactsIndex(tmp_path)
    index.put((1, 2, 3, 4), "k", "x")
    index.close()
    db = sqlite3.connect(tmp_path / INDEX_NAME)
    db.execute(f"PRAGMA user_version = {facts_index.SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    assert FactsIndex(tmp_path).get((1, 2, 3, 4), "k") is None  # another version's rows: dropped


def test_an_export_rerun_demuxes_nothing(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the job: the index lives beside the job records, the export tree holds none, and
    the rerun on the unchanged source demuxes no MP4 (source files and their staged links)."""
    from eva_export.config import parse_config
    from eva_export.export.runner import ExportService

    log = source.parent.parent
    cfg = parse_config({"collection": {"log_dir": str(log)}, "export": {"jobs_dir": str(log / "jobs")}})
    assert ExportService(cfg, background=False, recover=False).run(source, "lerobot_v21").state == "completed"
    assert (log / "jobs" / INDEX_NAME).is_file()
    assert not list((source.parent / "export").rglob(INDEX_NAME))
    reads = Reads(monkeypatch)
    video_facts.forget_all()
    assert ExportService(cfg, background=False, recover=False).run(source, "lerobot_v21").state == "completed"
    assert reads.demux == 0


def test_content_hashes_are_kept_for_hard_links(source: Path, tmp_path: Path) -> None:
    """The manifest's SHA-256 of a file is computed once per identity (a staged hard link of a
    source file reuses it); a malformed stored digest is recomputed."""
    from eva_export.manifest import sha256_file

    first = videos(source)[0]
    calls: list[Path] = []

    def compute(p: Path) -> str:
        calls.append(p)
        return sha256_file(p)

    (tmp_path / "jobs").mkdir()
    index = FactsIndex(tmp_path / "jobs")
    link = tmp_path / "link.mp4"
    os.link(first, link)
    with video_facts.use_index(index):
        digests = [video_facts.known_sha256(first, compute), video_facts.known_sha256(first, compute),
                   video_facts.known_sha256(link, compute)]
        assert len(calls) == 1
        index.put(video_facts.file_key(first), video_facts.SHA256_KIND, "not a digest")
        digests.append(video_facts.known_sha256(first, compute))
    index.close()
    assert digests == [sha256_file(first)] * 4 and len(calls) == 2
