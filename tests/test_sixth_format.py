"""Adding a format is its module + one registry line + its tests: shown with a sixth format.

``plugins/tiny_csv.py`` is the module; the one line is the ``FormatSpec`` patched into the
registry below. Nothing else is told about it, yet the export service, the CLI and
``eva-export verify`` all take it, because each reads the registry when it runs (no copied
list of formats anywhere).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset

from eva_export import cli
from eva_export.config import parse_config
from eva_export.export.runner import ExportService
from eva_export.formats import registry
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED

SPEC = registry.FormatSpec("tiny_csv", "plugins.tiny_csv:TinyCsvExporter", "CSV, one file per episode (tests only)")


@pytest.fixture
def sixth_format(monkeypatch: pytest.MonkeyPatch) -> registry.FormatSpec:
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, SPEC))  # the one registry line
    monkeypatch.setitem(registry.FORMATS, SPEC.name, SPEC)  # type: ignore[index]
    return SPEC


def source(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "logs" / "demo" / "raw", [
        Ep(frames=7), Ep(frames=9, quality="red", issues=[{"code": "missing_stream", "detail": "state"}]),
        Ep(frames=11)], cameras=1, width=32, height=24)


def test_the_export_service_writes_verifies_and_publishes_a_sixth_format(tmp_path: Path, sixth_format) -> None:
    src = source(tmp_path)
    svc = ExportService(parse_config({"collection": {"log_dir": str(tmp_path / "logs")}}),
                        background=False, recover=False)
    job = svc.run(src, "tiny_csv")
    assert job.state == COMPLETED, job.error
    acc = Path(job.accepted_dir)
    assert acc == src.parent / "export" / "tiny_csv" / "accepted"
    with open(acc / "data" / "episode_000001.csv", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    # accepted = source episodes 0 and 2, renumbered 0 and 1: episode 1 is source episode 2
    want = pq.read_table(src / "data" / "chunk-000" / "episode_000002.parquet").column("observation.state").to_pylist()
    got = [json.loads(r[rows[0].index("observation.state")]) for r in rows[1:]]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=1e-6)
    report = verify_export(acc)  # detects the format from info.json through the registry
    assert report.ok and report.dataset_format == "tiny_csv" and (report.episodes, report.frames) == (2, 18)
    assert (acc / "README.md").is_file() and (acc / "meta" / "manifest.json").is_file()
    rej = verify_export(Path(job.rejected_dir))
    assert rej.ok and (rej.episodes, rej.frames) == (1, 9)


def test_the_cli_offers_it_and_a_damaged_copy_fails_verify(tmp_path: Path, sixth_format) -> None:
    src = source(tmp_path)
    assert cli.main(["export", str(src), "--format", "tiny_csv", "--workers", "1"]) == 0
    acc = src.parent / "export" / "tiny_csv" / "accepted"
    assert cli.main(["verify", str(acc)]) == 0
    (acc / "data" / "episode_000000.csv").unlink()
    assert cli.main(["verify", str(acc)]) != 0
    assert not verify_export(acc).ok


def test_without_the_registry_line_every_boundary_refuses_it_the_same_way(tmp_path: Path) -> None:
    src = source(tmp_path)
    svc = ExportService(parse_config({"collection": {"log_dir": str(tmp_path / "logs")}}),
                        background=False, recover=False)
    with pytest.raises(registry.UnknownFormatError, match="unknown export format 'tiny_csv'"):
        svc.run(src, "tiny_csv")
    assert not (src.parent / "export" / "tiny_csv").exists()
