"""Hostile rows of a v2.1 source's meta/episodes.jsonl, exported in every format.

Each case breaks line 3 (raw episode 2) of a good source. Every format refuses it with a
message naming ``episodes.jsonl:<line>``, publishes nothing, and does so in bounded time and
memory: the export runs in a child process that reports its wall time per format and its peak
RSS (VmHWM), so a 50 MB row or 50 million blank lines cannot hide behind the test
process's own memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dsfactory import Ep, make_dataset

from eva_export.formats.registry import FORMATS

#: The bounds the refusals are held to. A refusal reads at most a few MiB; the child's peak is
#: mostly its imports (pyarrow, av, h5py), measured at about 150 MB.
REFUSAL_SECONDS = 2.0
PEAK_MB = 300
ROW_LINE = 3  # raw episode 2

CHILD = r"""
import json, sys, time
from pathlib import Path
from eva_export.config import parse_config
from eva_export.errors import EvaError
from eva_export.export.runner import ExportService

log, raw = Path(sys.argv[1]), Path(sys.argv[2])
svc = ExportService(parse_config({"collection": {"log_dir": str(log)}}), background=False, recover=False)
out = {}
for fmt in sys.argv[3:]:
    t0 = time.monotonic()
    try:
        job = svc.run(raw, fmt)
        state, error = job.state, job.error
    except EvaError as exc:  # refused at the request: also a refusal
        state, error = "refused", str(exc)
    out[fmt] = {"state": state, "error": error, "seconds": time.monotonic() - t0}
# VmHWM: this process image's own peak (ru_maxrss would include the forking parent's)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
out["peak_mb"] = int(hwm.split()[1]) / 1024
print(json.dumps(out))
"""


def rewrite_line(fn: Callable[[dict], dict | str]) -> Callable[[Path], None]:
    """Replace line ROW_LINE of episodes.jsonl by fn(its row): a dict is dumped, a str written as is."""
    def apply(raw: Path) -> None:
        path = raw / "meta" / "episodes.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        new = fn(json.loads(lines[ROW_LINE - 1]))
        lines[ROW_LINE - 1] = (new if isinstance(new, str) else json.dumps(new)) + "\n"
        with open(path, "w") as fh:
            fh.writelines(lines)
    return apply


def with_fields(**kw: object) -> Callable[[Path], None]:
    return rewrite_line(lambda row: {**row, **kw})


def rewrite_streamed(head: Callable[[dict], str], middle: Callable[[], Iterator[str]], tail: str) -> Callable[[Path], None]:
    """Line ROW_LINE as head(row), then the ``middle`` pieces, then ``tail``, written piece by
    piece (the test process stays small while it writes a 50 MB row)."""
    def apply(raw: Path) -> None:
        path = raw / "meta" / "episodes.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        with open(path, "w") as fh:
            fh.writelines(lines[:ROW_LINE - 1])
            fh.write(head(json.loads(lines[ROW_LINE - 1])))
            fh.writelines(middle())
            fh.write(tail + "\n")
            fh.writelines(lines[ROW_LINE:])
    return apply


def many_keys(count: int) -> Callable[[Path], None]:
    """``count`` distinct keys of 17 bytes each: 3 million make a 50 MB row."""
    def middle() -> Iterator[str]:
        for start in range(0, count, 4096):
            yield "".join(f', "k{i:07d}": 12345' for i in range(start, min(count, start + 4096)))
    return rewrite_streamed(lambda row: json.dumps(row)[:-1], middle, "}")


def huge_note(size: int) -> Callable[[Path], None]:
    def middle() -> Iterator[str]:
        block = "n" * (1 << 20)
        yield from (block for _ in range(size >> 20))
        yield "n" * (size & ((1 << 20) - 1))
    return rewrite_streamed(lambda row: json.dumps(row)[:-1] + ', "note": "', middle, '"}')


def blank_lines(count: int) -> Callable[[Path], None]:
    def apply(raw: Path) -> None:
        path = raw / "meta" / "episodes.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        block = "\n" * (1 << 20)
        with open(path, "w") as fh:
            fh.writelines(lines[:ROW_LINE - 1])
            for _ in range(count >> 20):
                fh.write(block)
            fh.write("\n" * (count & ((1 << 20) - 1)))
            fh.writelines(lines[ROW_LINE - 1:])
    return apply


def padded_stats_row(size: int) -> Callable[[Path], None]:
    """Line ROW_LINE of episodes_stats.jsonl with ``size`` bytes of padding in an unknown key:
    far more than the declared features' statistics can need."""
    def apply(raw: Path) -> None:
        path = raw / "meta" / "episodes_stats.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        row = json.loads(lines[ROW_LINE - 1])
        with open(path, "w") as fh:
            fh.writelines(lines[:ROW_LINE - 1])
            fh.write(json.dumps(row)[:-1] + ', "pad": [')
            block = "0.1, " * 65536
            for _ in range(size // len(block)):
                fh.write(block)
            fh.write("0.1]}\n")
            fh.writelines(lines[ROW_LINE:])
    return apply


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Path], None]
    expect: tuple[str, ...]


CASES = [
    Case("length_float", with_fields(length=12.7), (f"episodes.jsonl:{ROW_LINE}", "length", "float")),
    Case("length_whole_float", with_fields(length=12.0), (f"episodes.jsonl:{ROW_LINE}", "length")),
    Case("episode_index_true", with_fields(episode_index=True), (f"episodes.jsonl:{ROW_LINE}", "episode_index")),
    Case("episode_index_string", with_fields(episode_index="2"), (f"episodes.jsonl:{ROW_LINE}", "episode_index")),
    Case("note_over_4k", with_fields(note="n" * 5000), (f"episodes.jsonl:{ROW_LINE}", "note", "4096")),
    Case("note_50mib", huge_note(50 << 20), (f"episodes.jsonl:{ROW_LINE}", "longer than")),
    Case("keys_2000", many_keys(2000), (f"episodes.jsonl:{ROW_LINE}", "keys")),
    Case("keys_100_thousand", many_keys(100_000), (f"episodes.jsonl:{ROW_LINE}", "keys")),  # 1.9 MB: under the line bound
    Case("keys_3_million", many_keys(3_000_000), (f"episodes.jsonl:{ROW_LINE}", "longer than")),
    Case("stats_row_50mb", padded_stats_row(50 << 20), (f"episodes_stats.jsonl:{ROW_LINE}", "longer than")),
    Case("blank_lines_50_million", blank_lines(50_000_000), ("episodes.jsonl:", "blank lines")),
]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("rows") / "logs"
    make_dataset(log / "demo" / "raw", [Ep(frames=10), Ep(frames=11, quality="red"), Ep(frames=12),
                                        Ep(frames=13, quality="red")], cameras=1, width=32, height=24)
    return log


def export_in_child(log: Path, raw: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", CHILD, str(log), str(raw), *FORMATS], capture_output=True,
                         text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_row_is_refused_in_every_format(case: Case, baseline: Path, tmp_path: Path) -> None:
    log = tmp_path / "logs"
    shutil.copytree(baseline, log)
    raw = log / "demo" / "raw"
    case.mutate(raw)
    result = export_in_child(log, raw)
    for fmt in FORMATS:
        r = result[fmt]
        assert r["state"] in ("failed", "refused"), f"{case.name} {fmt}: exported ({r})"
        for want in case.expect:
            assert want in r["error"], f"{case.name} {fmt}: {want!r} not in {r['error'][:500]!r}"
        assert str(raw / "meta") in r["error"]
        assert len(r["error"]) < 2000, "the message quotes the row instead of naming it"
        assert r["seconds"] < REFUSAL_SECONDS, f"{case.name} {fmt}: refused after {r['seconds']:.2f} s"
    assert result["peak_mb"] < PEAK_MB, f"{case.name}: peak RSS {result['peak_mb']:.0f} MB"
    export = log / "demo" / "export"
    published = [p for p in export.rglob("*") if p.is_file()] if export.exists() else []
    assert published == [], f"{case.name}: files left under export/: {published[:5]}"


def test_a_good_row_with_a_note_at_the_bound_exports(baseline: Path, tmp_path: Path) -> None:
    """The bounds refuse faults, not a row at its limits: a 4096-byte note, a few hundred blank lines."""
    log = tmp_path / "logs"
    shutil.copytree(baseline, log)
    raw = log / "demo" / "raw"
    with_fields(note="é" * 2048)(raw)
    blank_lines(500)(raw)
    result = export_in_child(log, raw)
    for fmt in FORMATS:
        assert result[fmt]["state"] == "completed", f"{fmt}: {result[fmt]['error']}"
