"""Every field of every on-disk record, given each wrong type, is refused by its reader with a
message naming the file (and, for JSON Lines, the line) and the field; never converted.

Records: episodes.jsonl, tasks.jsonl and episodes_stats.jsonl rows, info.json, the quality
sidecar (eva_quality.jsonl), quality_split.json, job records and manifests. The wrong values
are a boolean, a float, a numeric string, null, an array, an object, a huge value and a
negative one, each drawn by hypothesis (derandomized, bounded example counts: CI time is fixed).
Each read is also held to a time bound, and the row readers to a memory bound, so a refusal is
never a slow full parse of a hostile file.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dsfactory import Ep, make_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva_export.errors import EvaError
from eva_export.formats.common import sidecar
from eva_export.formats.common.meta import read_info, read_meta
from eva_export.formats.common.records import QUALITY_SPLIT_FILE as QUALITY_SPLIT
from eva_export.formats.common.records import QualitySplit
from eva_export.jobs import Job
from eva_export.jsonbound import TEXT_MAX_BYTES
from eva_export.manifest import Manifest, build_manifest

CASES = settings(max_examples=12, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
#: A refusal reads one small file: far below this even beside a busy process on one core.
READ_SECONDS = 2.0
READ_PEAK_BYTES = 32 << 20

# ---- the wrong values, by kind ---------------------------------------------------------------
WRONG: dict[str, st.SearchStrategy[Any]] = {
    "bool": st.booleans(),
    "float": st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)) | st.just(3.0),
    "numeric_str": st.integers(0, 10**6).map(str),
    "str": st.text(min_size=1, max_size=8),
    "null": st.none(),
    "list": st.lists(st.integers(0, 9), max_size=3),
    "object": st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9), max_size=2),
    "huge_int": st.integers(2**63, 2**66),
    "negative": st.integers(-(2**40), -1),
    "huge_text": st.integers(TEXT_MAX_BYTES + 1, 4 * TEXT_MAX_BYTES).map(lambda n: "x" * n),
    "int": st.integers(0, 9),
    "huge_job_text": st.integers((64 << 10) + 1, 128 << 10).map(lambda n: "x" * n),  # JOB_TEXT_MAX
}
INT_WRONG = ("bool", "float", "numeric_str", "null", "list", "object", "huge_int", "negative")
TEXT_WRONG = ("bool", "float", "int", "list", "object", "huge_text")


@dataclass(frozen=True)
class Field:
    record: str  # a key of RECORDS
    name: str
    wrong: tuple[str, ...]


FIELDS = [
    *(Field("episodes", n, INT_WRONG) for n in ("episode_index", "length")),
    Field("episodes", "tasks", ("bool", "float", "int", "null", "object", "huge_text")),
    *(Field("episodes", n, TEXT_WRONG) for n in ("quality", "qc_verdict", "note", "reviewed_at")),
    Field("episodes", "quality_issues", ("bool", "float", "int", "str", "object", "huge_text")),
    Field("episodes", "stream_stats", ("bool", "float", "int", "str", "list", "huge_text")),
    Field("tasks", "task_index", INT_WRONG),
    Field("tasks", "task", TEXT_WRONG + ("null",)),
    Field("stats", "episode_index", INT_WRONG),
    Field("stats", "stats", ("bool", "float", "int", "str", "null", "list")),
    *(Field("info", n, INT_WRONG) for n in ("fps", "total_episodes", "total_frames", "total_tasks",
                                            "total_videos", "total_chunks")),
    *(Field("info", n, TEXT_WRONG + ("null",)) for n in ("codebase_version", "data_path")),
    Field("info", "features", ("bool", "float", "int", "str", "null", "list")),
    Field("sidecar", "episode_index", INT_WRONG),
    *(Field("sidecar", n, TEXT_WRONG) for n in ("quality", "qc_verdict", "note", "written_by")),
    *(Field("split", n, TEXT_WRONG + ("null",)) for n in ("source_dir", "subset", "dataset_format", "job_id")),
    *(Field("split", n, INT_WRONG) for n in ("episode_count", "frame_count", "accepted_count")),
    Field("split", "source_episode_indices", ("bool", "float", "int", "str", "null", "object")),
    *(Field("job", n, ("bool", "float", "int", "list", "object", "null", "huge_job_text"))
      for n in ("job_id", "state", "source_dir", "error")),
    *(Field("job", n, INT_WRONG) for n in ("episodes_done", "bytes_total", "pid")),
    Field("manifest", "path", TEXT_WRONG + ("null",)),
    Field("manifest", "size", INT_WRONG),
    Field("manifest", "sha256", TEXT_WRONG + ("null",)),
]


# ---- the records: a good file, a way to break one field, and its reader -------------------------
@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_dataset(tmp_path_factory.mktemp("good") / "raw",
                        [Ep(frames=3), Ep(frames=4, quality="red"), Ep(frames=3), Ep(frames=5)],
                        cameras=1, width=32, height=24)
    (root / sidecar.SIDECAR).write_text("".join(
        json.dumps({"episode_index": i, "quality": "green", "note": "ok", "written_by": "check"}) + "\n"
        for i in range(4)))
    QualitySplit(str(root), "accepted", "lerobot_v21", [0, 2, 3]).write(root)
    job = Job.new("export", str(root), "hdf5")
    (root / "job.json").write_text(json.dumps(job.to_dict()))
    build_manifest(root / "meta").write(root / "meta")
    return root


JSONL = {"episodes": "meta/episodes.jsonl", "tasks": "meta/tasks.jsonl", "stats": "meta/episodes_stats.jsonl",
         "sidecar": sidecar.SIDECAR}
JSON = {"info": "meta/info.json", "split": "meta/quality_split.json", "job": "job.json",
        "manifest": "meta/meta/manifest.json"}


def _read_job(root: Path) -> None:
    Job.from_dict(json.loads((root / JSON["job"]).read_text()))


READERS: dict[str, Callable[[Path], object]] = {
    "episodes": read_meta, "tasks": read_meta, "stats": read_meta, "info": read_info,
    "sidecar": sidecar.read_entries, "split": QualitySplit.read, "job": _read_job,
    "manifest": lambda root: Manifest.read(root / "meta"),
}


def break_field(root: Path, f: Field, value: Any, line: int) -> tuple[Path, int]:
    """Set ``f`` to ``value`` in the record's file (in JSON Lines, on row ``line``, or the last
    row when there are fewer); the file and the line."""
    if f.record in JSONL:
        path = root / JSONL[f.record]
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        line = min(line, len(rows))
        rows[line - 1][f.name] = value
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path, line
    path = root / JSON[f.record]
    d = json.loads(path.read_text())
    (d["files"][0] if f.record == "manifest" else d)[f.name] = value
    path.write_text(json.dumps(d))
    return path, 1


def refusal(f: Field, root: Path) -> str:
    """The reader's refusal message, read under the time and memory bounds."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        READERS[f.record](root)
    except (EvaError, ValueError, TypeError) as exc:
        message = str(exc)
    else:
        message = ""
    finally:
        seconds = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert message, f"{f.record}.{f.name}: accepted"
    assert seconds < READ_SECONDS, f"{f.record}.{f.name}: refused after {seconds:.2f} s"
    assert peak < READ_PEAK_BYTES, f"{f.record}.{f.name}: {peak} bytes allocated"
    return message


@pytest.mark.parametrize("f", FIELDS, ids=[f"{f.record}.{f.name}" for f in FIELDS])
@CASES
@given(data=st.data())
def test_every_wrong_type_of_every_field_is_refused(f: Field, good: Path, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(f.wrong), label="kind")
    value = data.draw(WRONG[kind], label="value")
    line = data.draw(st.integers(1, 4), label="line")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "raw"
        shutil.copytree(good, root)
        path, line = break_field(root, f, value, line)
        message = refusal(f, root)
    if f.record == "job":  # the store skips a bad record (JobStore.get/all): its field is named
        assert f.name in message, message
        return
    assert str(path) in message, message
    if f.record in JSONL:
        assert f"{path}:{line}" in message, message
    assert f.name in message or "a task" in message or "a source episode index" in message or "quality issue" \
        in message or "manifest" in message, message
    assert len(message) < 2000, "the refusal quotes the value instead of naming it"


def test_the_good_records_read(good: Path) -> None:
    """The fixture is good: every refusal above is the broken field's, not the file's."""
    for read in READERS.values():
        read(good)
    assert len(read_meta(good).episodes) == 4 and len(sidecar.read_entries(good)) == 4


def test_every_record_type_is_covered() -> None:
    assert {f.record for f in FIELDS} == set(READERS) == set(JSONL) | set(JSON)
    kinds = {k for f in FIELDS for k in f.wrong}
    assert kinds >= {"bool", "float", "numeric_str", "null", "list", "object", "huge_int", "negative", "huge_text"}


@pytest.mark.parametrize("name,wrong", [("host", k) for k in ("bool", "float", "int", "null", "list", "object")]
                         + [("pid", k) for k in INT_WRONG] + [("since", k) for k in ("bool", "numeric_str", "null",
                                                                                      "list", "object")])
@CASES
@given(data=st.data())
def test_a_remote_lock_file_with_a_wrong_type_names_no_holder(name: str, wrong: str, data: st.DataObject) -> None:
    """The upload's remote lock file (a server's file: hostile too) is read with exact types;
    a wrong one means "not ours" (None), never a holder built from a converted value."""
    from eva_export.upload.remotelock import LockHolder

    good = {"host": "robot-1", "pid": 4242, "since": 1.5e9}
    assert LockHolder.parse(json.dumps(good).encode()) == LockHolder("robot-1", 4242, 1.5e9)
    value = data.draw(WRONG[wrong], label="value")
    assert LockHolder.parse(json.dumps({**good, name: value}).encode()) is None


ROW_FIELDS = [f for f in FIELDS if f.record in ("episodes", "tasks", "stats", "info")]


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_export_of_a_wrong_field_publishes_nothing(good: Path, data: st.DataObject) -> None:
    """End to end: a source with one wrong field, exported in a drawn format, fails naming the
    file (and line), and leaves nothing under export/ (no pair, no staging)."""
    from eva_export.config import parse_config
    from eva_export.export.runner import ExportService
    from eva_export.formats.registry import FORMATS

    f = data.draw(st.sampled_from(ROW_FIELDS), label="field")
    value = data.draw(WRONG[data.draw(st.sampled_from(f.wrong), label="kind")], label="value")
    fmt = data.draw(st.sampled_from(list(FORMATS)), label="format")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "logs" / "demo" / "raw"
        shutil.copytree(good, raw)
        (raw / QUALITY_SPLIT).unlink()  # the fixture's marker would make it an export, not a source
        (raw / sidecar.SIDECAR).unlink()
        path, line = break_field(raw, f, value, data.draw(st.integers(1, 4), label="line"))
        svc = ExportService(parse_config({"collection": {"log_dir": str(Path(tmp) / "logs")}}),
                            background=False, recover=False)
        try:
            job = svc.run(raw, fmt)
            state, error = job.state, job.error
        except EvaError as exc:
            state, error = "refused", str(exc)
        assert state in ("failed", "refused"), f"{f.record}.{f.name} = {str(value)[:40]!r} was exported"
        assert str(path) in error and (f.record not in JSONL or f"{path}:{line}" in error), error
        export = raw.parent / "export"
        assert not export.exists() or [p for p in export.rglob("*") if p.is_file()] == [], "something was left"
