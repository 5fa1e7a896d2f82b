"""Fuzzing the metadata parsers and the store reader (hypothesis, bounded: 200 examples each, no
deadline): whatever the bytes, only the project's own error types come out."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from dsfactory import Ep, make_dataset, make_subset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva_export.errors import EvaError
from eva_export.formats.common.meta import check_stats_shapes, read_meta
from eva_export.formats.eva_store import StoreError, open_store
from eva_export.formats.eva_store.exporter import EvaStoreExporter
from eva_export.formats.verify import verify_export
from eva_export.fsutil import iter_jsonl, read_json

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                      max_leaves=20)
# text-level damage JSON encoders never produce: overflowing literals, deep nesting, bad bytes
NASTY = [b"1e400", b"-1e400", b"9" * 400, b"[" * 5000, b"{\"a\":" * 3000, b"\xff\xfe", b"\x00", b"NaN",
         b"Infinity", b"\"\\ud800\"", b"\n\n"]


def _damage(data: bytes, where: int, what: int, cut: bool) -> bytes:
    pos = where % (len(data) + 1)
    out = data[:pos] + NASTY[what % len(NASTY)] + data[pos:]
    return out[: len(out) // 2] if cut else out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("fuzz_ds") / "raw", [Ep(frames=4), Ep(frames=5)], cameras=1,
                        width=32, height=24)


def _meta_files(root: Path) -> dict[str, bytes]:
    return {n: (root / "meta" / n).read_bytes() for n in ("info.json", "episodes.jsonl", "episodes_stats.jsonl",
                                                          "tasks.jsonl")}


def _read(root: Path) -> None:
    meta = read_meta(root)
    check_stats_shapes(meta)


def _set_key(doc: Any, path: list[str], value: Any) -> Any:
    """``doc`` with the value at ``path`` (dict keys, cut short where the document ends) replaced."""
    if not path or not isinstance(doc, dict) or not doc:
        return value
    key = path[0] if path[0] in doc else sorted(doc)[hash(path[0]) % len(doc)]
    return {**doc, key: _set_key(doc[key], path[1:], value)}


@FUZZ
@given(name=st.sampled_from(["info.json", "episodes.jsonl", "episodes_stats.jsonl", "tasks.jsonl"]),
       keys=st.lists(st.sampled_from(["fps", "features", "observation.state", "shape", "dtype", "stats", "min",
                                      "length", "episode_index", "tasks", "total_frames", "data_path"]), max_size=4),
       value=values, where=st.integers(0, 10**6), what=st.integers(0, 100), cut=st.booleans(),
       structural=st.booleans())
def test_meta_parsers_raise_only_project_errors(dataset: Path, name: str, keys: list[str], value: Any, where: int,
                                               what: int, cut: bool, structural: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "raw"
        (root / "meta").mkdir(parents=True)
        files = _meta_files(dataset)
        data = files[name]
        if structural:  # one field of one record replaced by any JSON value
            lines = data.decode().splitlines()
            doc = json.loads(lines[0]) if name.endswith(".jsonl") else json.loads(data)
            new = json.dumps(_set_key(doc, keys, value))
            data = ("\n".join([new] + lines[1:]) if name.endswith(".jsonl") else new).encode()
        else:
            data = _damage(data, where, what, cut)
        files[name] = data
        for n, b in files.items():
            (root / "meta" / n).write_bytes(b)
        try:
            _read(root)
        except EvaError:
            pass


@FUZZ
@given(data=st.binary(max_size=2000) | st.builds(lambda v: json.dumps(v).encode(), values))
def test_low_level_json_readers_raise_only_value_errors(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "f.json"
        p.write_bytes(data)
        for fn in (read_json, lambda q: list(iter_jsonl(q))):
            try:
                fn(p)
            except ValueError:
                pass


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fuzz_store")
    src = make_subset(base / "src", [Ep(frames=4), Ep(frames=3)], cameras=1, width=32, height=24)
    EvaStoreExporter().export(src, base / "out")
    shutil.copytree(base / "out", base / "fuzzed")  # the copy whose manifest each example replaces
    return base / "out"


@FUZZ
@given(keys=st.lists(st.sampled_from(["shards", "blocks", "relative_dir", "paths", "shape", "num_rows", "row_start",
                                      "fps", "version", "materialized_blocks", "numeric", "cameras", "kind",
                                      "codec", "stats", "format"]), max_size=5),
       value=values, where=st.integers(0, 10**6), what=st.integers(0, 100), cut=st.booleans(),
       structural=st.booleans())
def test_store_reader_and_verifier_raise_only_store_errors(store: Path, keys: list[str], value: Any, where: int,
                                                          what: int, cut: bool, structural: bool) -> None:
    root = store.parent / "fuzzed"  # only manifest.json changes between examples
    data = (store / "manifest.json").read_bytes()
    if structural:
        doc = json.loads(data)
        if keys and keys[0] in ("blocks", "relative_dir", "paths", "num_rows", "row_start", "shape", "kind"):
            doc["shards"][where % len(doc["shards"])] = _set_key(doc["shards"][where % len(doc["shards"])],
                                                                 keys, value)
        else:
            doc = _set_key(doc, keys, value)
        data = json.dumps(doc).encode()
    else:
        data = _damage(data, where, what, cut)
    (root / "manifest.json").write_bytes(data)
    try:
        s = open_store(root)
        for i in range(min(len(s), 2)):
            s[i]
    except StoreError:
        pass
    verify_export(root)  # a report, never an exception
