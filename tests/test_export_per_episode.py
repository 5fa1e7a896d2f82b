"""The per-episode cost of a verified lerobot_v21 job, checked by counting (never timing):
MP4 opens per job, the native pair moved (not linked file by file), path checks of shared
directories, stats rows parsed once per check, and the bounded-JSON depth fast path; with the
refusals (a changed file, a bad stats row, a symlink) kept."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import av
import pytest
from dsfactory import Ep, make_dataset, replace_video
from export_faults import faulty_service
from test_video_facts import age

from eva_export import confine, jsonbound
from eva_export.config import parse_config
from eva_export.errors import DatasetError, UnsafeNameError
from eva_export.export.paths import ExportPaths
from eva_export.export.runner import ExportService
from eva_export.formats.common import mp4_index, video_facts
from eva_export.formats.lerobot_v21.exporter import verify_v21
from eva_export.formats.lerobot_v21.validate import validate_source

CAM = "observation.images.cam0"


@pytest.fixture()
def source(tmp_path: Path) -> Iterator[Path]:
    video_facts.forget_all()
    root = make_dataset(tmp_path / "logs" / "demo" / "raw",
                        [Ep(frames=4, quality="green" if i % 2 else "red") for i in range(6)],
                        cameras=2, width=32, height=24)
    age(root)  # past the racy margin, as a recorded source is
    yield root
    video_facts.forget_all()


def service(source: Path, fail_at: str | None = None) -> ExportService:
    log = source.parent.parent
    # one worker: the units run in this process, where the counters are installed
    cfg = parse_config({"collection": {"log_dir": str(log)},
                        "export": {"jobs_dir": str(log / "jobs"), "workers": 1}})
    return faulty_service(cfg, background=False, recover=False, fail_at=fail_at)


class Opens:
    """Every av.open of this process, and every read of an MP4 whose facts mp4_index took from
    its boxes instead (mp4_index.file_bytes, the one read of a small file), by the path it read
    (the real reads run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[Path] = []
        real: Callable[..., Any] = av.open
        whole: Callable[[Path], bytes | None] = mp4_index.file_bytes

        def counted(file: Any, *args: Any, **kw: Any) -> Any:
            self.paths.append(Path(str(file)))
            return real(file, *args, **kw)

        def file_bytes(path: Path) -> bytes | None:
            data = whole(path)
            if data is not None and mp4_index.parse(data) is not None:  # else PyAV opens it (counted there)
                self.paths.append(Path(path))
            return data

        monkeypatch.setattr(av, "open", counted)
        monkeypatch.setattr(mp4_index, "file_bytes", file_bytes)

    def of(self, root: Path) -> list[Path]:
        return [p for p in self.paths if root in p.parents]


def source_mp4s(root: Path) -> list[Path]:
    return sorted(root.glob("videos/*/*/*.mp4"))


def test_one_mp4_open_per_file_per_job_and_none_on_a_rerun(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opens = Opens(monkeypatch)
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed", job.error
    mp4s = source_mp4s(source)
    assert len(mp4s) == 12
    # the source validated once: every camera file read exactly once ...
    assert sorted(opens.of(source)) == mp4s
    # ... and the staged subsets' verification (hard links) opens only its one sample per subset
    staged = [p for p in opens.paths if source not in p.parents]
    assert len(staged) <= 2
    paths = ExportPaths.of(source, "lerobot_v21")
    assert verify_v21(paths.accepted).ok and verify_v21(paths.rejected).ok
    opens.paths.clear()
    video_facts.forget_all()  # a new process: only the jobs directory's index remembers
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed", job.error
    assert opens.of(source) == []  # the unchanged source: every MP4 proved by the facts index
    assert len(opens.paths) <= 2


def test_a_file_changed_after_the_first_export_is_read_and_refused(source: Path) -> None:
    assert service(source).run(source, "lerobot_v21").state == "completed"
    video_facts.forget_all()
    replace_video(source, CAM, 3, frames=6, width=32, height=24)  # a new size and inode
    age(source)
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "failed"
    assert "episode 3" in job.error and "episode_000003.mp4" in job.error and "6 frames" in job.error


def test_the_native_pair_is_the_staged_subsets_moved(source: Path) -> None:
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed", job.error
    paths = ExportPaths.of(source, "lerobot_v21")
    published = sorted(paths.accepted.glob("videos/*/*/*.mp4")) + sorted(paths.rejected.glob("videos/*/*/*.mp4"))
    assert len(published) == 12
    # every camera file is the source's own inode (linked once, at staging), not a copy
    src_inodes = {os.stat(p).st_ino for p in source_mp4s(source)}
    assert {os.stat(p).st_ino for p in published} == src_inodes
    for sub in (paths.accepted, paths.rejected):
        marker = json.loads((sub / "meta/quality_split.json").read_text())
        assert marker["dataset_format"] == "lerobot_v21"
        assert (sub / "README.md").is_file()  # the card, as the exporter writes it
        assert not list(sub.rglob(".*"))
    assert not paths.staging.exists()


def test_units_survive_a_failed_verification(source: Path) -> None:
    failed = service(source, fail_at="verified").run(source, "lerobot_v21")
    assert failed.state == "failed" and "verified" in failed.error
    paths = ExportPaths.of(source, "lerobot_v21")
    assert not paths.pair_dir.exists()
    assert (paths.staging / "native/accepted/meta/info.json").is_file()  # moved back for the rerun
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed" and job.reused_episodes == 6 and job.episodes_done == 6
    assert verify_v21(paths.accepted).ok and verify_v21(paths.rejected).ok
    failed = service(source, fail_at="convert_rejected").run(source, "lerobot_v21")  # between the two moves
    assert failed.state == "failed"
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed" and job.reused_episodes == 6
    # a run killed between the move and publication leaves the subset in staging/out
    assert service(source, fail_at="verified").run(source, "lerobot_v21").state == "failed"
    (paths.staging / "out").mkdir(exist_ok=True)
    os.rename(paths.staging / "native/accepted", paths.staging / "out/accepted")
    job = service(source).run(source, "lerobot_v21")
    assert job.state == "completed" and job.reused_episodes == 6
    assert verify_v21(paths.accepted).ok


def test_shared_directories_are_checked_once_per_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ds"
    (root / "data/chunk-000").mkdir(parents=True)
    for i in range(3):
        (root / f"data/chunk-000/episode_{i:06d}.parquet").write_bytes(b"x")
    os.symlink(tmp_path / "outside", root / "data/chunk-000/episode_000009.parquet")
    calls: list[str] = []
    real = os.lstat

    def counted(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        calls.append(str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(confine.os, "lstat", counted)
    names = [f"data/chunk-000/episode_{i:06d}.parquet" for i in range(3)]
    for n in names:
        confine.confined(root, n)
    assert len(calls) == 9  # three components each, outside a block
    calls.clear()
    with confine.checked_dirs():
        for n in names:
            confine.confined(root, n)
        assert len(calls) == 2 + 3  # the two directories once, every file itself
        with pytest.raises(UnsafeNameError, match="resolves outside"):
            confine.confined(root, "data/chunk-000/episode_000009.parquet")  # the file is still checked
    calls.clear()
    confine.confined(root, names[0])
    assert len(calls) == 3  # the block's memory ended with it


def _depth_reference(text: str) -> int:
    """A JSON lexer's nesting: brackets outside strings (escapes honoured)."""
    depth = best = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


@pytest.mark.parametrize("text", [
    "[" * 70 + "]" * 70,
    '{"a": "[[[[[[[[", "b": ' + "[" * 66 + "]" * 66 + "}",
    '["]]]]]]]]]]]]]]", ' + "[" * 65 + "1" + "]" * 66,
    '["\\"[[[[", ' + ",".join(["[[1]]"] * 40) + "]",
    '["\\\\", "[[[[", ' + "{\"k\": " * 65 + "1" + "}" * 65 + "]",
    '["é[ü", "日本[[", ' + "[" * 65 + "]" * 66,
    "[" * 100,
])
def test_depth_matches_a_lexer(text: str) -> None:
    assert jsonbound.depth(text) == _depth_reference(text)


def test_an_unterminated_string_counts_as_structure() -> None:
    # not JSON either way; counted conservatively (refused as too deep), as before
    assert jsonbound.depth('"' + "[" * 100) == 100


def test_a_deep_line_is_still_refused() -> None:
    with pytest.raises(ValueError, match="nested deeper"):
        jsonbound.loads('{"k": "]]]]", "v": ' + "[" * 65 + "]" * 65 + "}")
    assert jsonbound.loads('{"k": "]]]]", "v": ' + "[" * 63 + "]" * 63 + "}")["k"] == "]]]]"  # 64 levels


def _edit_stats(root: Path, episode: int, key: str, value: list[float]) -> None:
    path = root / "meta/episodes_stats.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        if r["episode_index"] == episode:
            r["stats"][key]["mean"] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_bad_stats_row_is_refused_listed_or_not(source: Path) -> None:
    path = source / "meta/episodes_stats.jsonl"
    good = path.read_text()
    _edit_stats(source, 4, "observation.state", [0.0, 1.0])
    with pytest.raises(DatasetError, match=r"episodes_stats.jsonl:5: episode 4: observation.state mean has 2 values"):
        validate_source(source)
    # a row of an episode episodes.jsonl does not list is still checked
    row = json.loads(good.splitlines()[0])
    row["episode_index"] = 99
    row["stats"]["observation.state"]["mean"] = [0.0]
    path.write_text(good + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=r"episodes_stats.jsonl:7: episode 99: observation.state mean has 1 values"):
        validate_source(source)
