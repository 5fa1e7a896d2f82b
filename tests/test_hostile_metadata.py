"""Hostile metadata values in a raw source, exported in every format: each is refused as a
DatasetError naming the file and the line, with no Python exception type in the message and no
staging left behind."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export.config import parse_config
from eva_export.errors import DatasetError, EvaError
from eva_export.export.runner import ExportService
from eva_export.formats.registry import FORMATS
from eva_export.jobs import FAILED

DEEP = 100_000
RAW_TYPES = ("OverflowError", "RecursionError", "AttributeError", "UnicodeDecodeError", "ValueError",
             "TypeError", "KeyError", "IndexError", "Traceback")


def _sub(rel: str, pattern: str, repl: str, count: int = 1) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        text = (raw / rel).read_text()
        new = re.sub(pattern, repl, text, count=count)
        assert new != text, f"{pattern} not in {rel}"
        (raw / rel).write_text(new)
    return apply


def _line(rel: str, lineno: int, fn: Callable[[str], bytes]) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        lines = (raw / rel).read_bytes().splitlines(keepends=True)
        lines[lineno - 1] = fn(lines[lineno - 1].decode()) + b"\n"
        (raw / rel).write_bytes(b"".join(lines))
    return apply


def _deep_field(line: str) -> bytes:
    return (line.rstrip()[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}").encode()


def _short_stats(line: str) -> bytes:
    row = json.loads(line)
    row["stats"]["observation.state"]["min"] = [0.0, 0.0, 0.0]
    return json.dumps(row).encode()


def _deep_info(raw: Path) -> None:
    text = (raw / "meta/info.json").read_text()
    (raw / "meta/info.json").write_text(text.replace("{", '{"deep": ' + "[" * DEEP + "]" * DEEP + ",", 1))


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Path], None]
    expect: tuple[str, ...]


INFO, EPS, STATS = "meta/info.json", "meta/episodes.jsonl", "meta/episodes_stats.jsonl"
CASES = [
    Case("fps_1e400", _sub(INFO, r'"fps": \d+', '"fps": 1e400'), ("info.json", "line", "1e400", "out of range")),
    Case("total_frames_1e400", _sub(INFO, r'"total_frames": \d+', '"total_frames": 1e400'),
         ("info.json", "line", "1e400")),
    Case("length_1e400", _sub(EPS, r'"length": \d+', '"length": 1e400'), ("episodes.jsonl:1", "1e400")),
    Case("length_infinity", _line(EPS, 2, lambda s: re.sub(r'"length": \d+', '"length": Infinity', s).encode()),
         ("episodes.jsonl:2", "length")),
    Case("total_episodes_huge_int", _sub(INFO, r'"total_episodes": \d+', '"total_episodes": ' + "9" * 5000),
         ("info.json", "out of range")),
    Case("info_nested_deep", _deep_info, ("info.json", "nested deeper")),
    Case("episodes_nested_deep", _line(EPS, 2, _deep_field), ("episodes.jsonl:2", "nested deeper")),
    # longer than the declared features' statistics can need: refused by length before depth
    Case("stats_nested_deep", _line(STATS, 1, _deep_field), ("episodes_stats.jsonl:1", "longer than")),
    Case("features_list", _sub(INFO, r'"features": \{', '"features": [], "was": {'), ("info.json", "features")),
    Case("episodes_binary_line", _line(EPS, 2, lambda s: b"\xff\xfe\x00\x9c garbage"), ("episodes.jsonl:2", "UTF-8")),
    Case("stats_vector_short", _line(STATS, 2, _short_stats),
         ("episodes_stats.jsonl:2", "observation.state", "3 values", "[6]")),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("hostile_meta") / "logs"
    make_dataset(log / "demo" / "raw", [Ep(frames=6), Ep(frames=7, quality="red"), Ep(frames=5)], cameras=1,
                 width=32, height=24)
    return log


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_metadata_is_a_named_source_error(case: Case, base: Path, tmp_path: Path) -> None:
    log = tmp_path / "logs"
    shutil.copytree(base, log)
    raw = log / "demo" / "raw"
    case.mutate(raw)
    svc = ExportService(parse_config({"collection": {"log_dir": str(log)}}), background=False, recover=False)
    for fmt in FORMATS:
        try:
            job = svc.run(raw, fmt)
            assert job.state == FAILED, f"{case.name} exported as {fmt}"
            error = job.error
        except EvaError as exc:
            assert isinstance(exc, DatasetError), f"{fmt}: {type(exc).__name__}: {exc}"
            error = str(exc)
        for want in case.expect:
            assert want in error, f"{case.name} ({fmt}): {want!r} not in {error[:400]!r}"
        assert not any(error.startswith(t) or f"{t}:" in error for t in RAW_TYPES), f"{fmt}: {error[:300]}"
        assert len(error) < 2000
        export = log / "demo" / "export"
        left = [p.name for p in export.rglob(".staging*")] if export.exists() else []
        assert not left, f"{case.name} ({fmt}) left staging {left}"
