"""eva_store manifests that point out of the store or are damaged: the reader raises StoreError,
the verifier reports and never crashes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_subset

from eva_export.formats.eva_store import StoreError, open_store
from eva_export.formats.eva_store.exporter import EvaStoreExporter
from eva_export.formats.eva_store.records import SAMPLE_INDEX_FILE
from eva_export.formats.verify import verify_export

CAM = "observation.images.cam0"
PAYLOAD = f"records/{CAM}.msgpack"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("store_hostile")
    src = make_subset(base / "src", [Ep(frames=6), Ep(frames=5)], cameras=1, width=32, height=24)
    out = base / "out"
    EvaStoreExporter().export(src, out)
    assert verify_export(out).ok
    return out


def _copy(store: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the store and, beside it (outside), a copy of shard 1 planted by an attacker."""
    root = tmp_path / "store"
    shutil.copytree(store, root)
    outside = tmp_path / "outside" / "shard-00001"
    shutil.copytree(store / "shards" / "shard-00001", outside)
    return root, outside


def _edit_manifest(root: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    d = json.loads((root / "manifest.json").read_text())
    fn(d)
    (root / "manifest.json").write_text(json.dumps(d))


def _refused(root: Path, *want: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(root)[6]
    for w in want:
        assert w in str(info.value), str(info.value)
    report = verify_export(root)
    assert not report.ok, "verify said OK"


def _shard1(d: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in d["shards"] if s["shard_id"] == "shard-00001")


def test_relative_dir_with_dotdot_is_refused(store: Path, tmp_path: Path) -> None:
    root, _outside = _copy(store, tmp_path)
    _edit_manifest(root, lambda d: _shard1(d).update(relative_dir="../outside/shard-00001"))
    _refused(root, "manifest.json", "'..'")


def test_absolute_relative_dir_is_refused(store: Path, tmp_path: Path) -> None:
    root, outside = _copy(store, tmp_path)
    _edit_manifest(root, lambda d: _shard1(d).update(relative_dir=str(outside)))
    _refused(root, "manifest.json", "absolute")


def test_block_path_with_dotdot_is_refused(store: Path, tmp_path: Path) -> None:
    root, _outside = _copy(store, tmp_path)

    def fn(d: dict[str, Any]) -> None:
        block = _shard1(d)["blocks"][CAM]
        block["paths"][0] = f"../../../outside/shard-00001/{PAYLOAD}"
    _edit_manifest(root, fn)
    _refused(root, "manifest.json", "'..'")


def test_symlinked_payload_outside_is_refused(store: Path, tmp_path: Path) -> None:
    root, outside = _copy(store, tmp_path)
    target = root / "shards" / "shard-00001" / PAYLOAD
    target.unlink()
    target.symlink_to(outside / PAYLOAD)
    _refused(root, "outside")


def test_symlinked_shard_dir_outside_is_refused(store: Path, tmp_path: Path) -> None:
    root, outside = _copy(store, tmp_path)
    shutil.rmtree(root / "shards" / "shard-00001")
    (root / "shards" / "shard-00001").symlink_to(outside)
    _refused(root, "outside")


def _text(old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        text = (root / "manifest.json").read_text()
        assert old in text
        (root / "manifest.json").write_text(text.replace(old, new, 1))
    return apply


def _manifest(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda root: _edit_manifest(root, fn)


def _index_row(root: Path) -> None:
    t = pq.read_table(root / SAMPLE_INDEX_FILE)
    rows = t.column("row").to_pylist()
    rows[7] = 99
    pq.write_table(t.set_column(t.schema.get_field_index("row"), "row", pa.array(rows, pa.int64())),
                   root / SAMPLE_INDEX_FILE)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "not_an_object": lambda root: (root / "manifest.json").write_text("[1, 2]"),
    "shards_not_list": _manifest(lambda d: d.update(shards="shard-00000")),
    "shard_not_object": _manifest(lambda d: d.update(shards=[1, 2])),
    "num_rows_1e400": _text('"num_rows": 5', '"num_rows": 1e400'),
    "fps_infinity": _manifest(lambda d: d.update(fps=float("inf"))),
    "fps_zero": _manifest(lambda d: d.update(fps=0)),
    "version_text": _manifest(lambda d: d.update(version="one")),
    "deep": _text('"source": {', '"deep": ' + "[" * 100_000 + "]" * 100_000 + ', "source": {'),
    "blocks_list": _manifest(lambda d: _shard1(d).update(blocks=[])),
    "block_one_path": _manifest(lambda d: _shard1(d)["blocks"][CAM].update(paths=[PAYLOAD])),
    "block_paths_none": _manifest(lambda d: _shard1(d)["blocks"][CAM].update(paths=None)),
    "block_shape_negative": _manifest(lambda d: _shard1(d)["blocks"][CAM].update(shape=[-5, 24, 32, 3])),
    "zarr_path_unprefixed": _manifest(lambda d: _shard1(d)["blocks"]["action"].update(paths=["action"])),
    "numeric_names_object": _manifest(lambda d: d["materialized_blocks"].update(numeric={"a": 1})),
    "row_start_negative": _manifest(lambda d: _shard1(d).update(row_start=-1)),
    "binary": lambda root: (root / "manifest.json").write_bytes(b"\xff\xfe{\x00"),
    "index_row_outside_shard": _index_row,
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_damaged_store_gives_store_errors_and_verify_reports(name: str, store: Path, tmp_path: Path) -> None:
    root, _ = _copy(store, tmp_path)
    DAMAGE[name](root)
    try:
        s = open_store(root)
        for i in range(len(s)):
            s[i]
    except StoreError as exc:
        assert str(root) in str(exc) or "manifest.json" in str(exc), str(exc)
    report = verify_export(root)  # must return a report, never raise
    assert not report.ok, f"{name}: verify said OK"
