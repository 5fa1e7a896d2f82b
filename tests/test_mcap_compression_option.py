"""``export.mcap_compression`` (lz4 by default; zstd; none for raw frames at the disk's speed):
parsed and refused by the config, carried to the job's exporter by the registry, and whatever it
is, the file is read back by mcap's own reader and our verify refuses what that reader refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from dsfactory import Ep, make_subset
from mcap.reader import make_reader

from eva_export.config import ConfigError, parse_config
from eva_export.formats.mcap_eva.exporter import McapExporter
from eva_export.formats.mcap_eva.options import McapOptions
from eva_export.formats.registry import get_spec


def test_default_is_lz4_and_a_bad_value_is_refused() -> None:
    assert parse_config({}).export.options_for("mcap").compression == "lz4"
    assert parse_config({"export": {"mcap_compression": "none"}}).export.options_for("mcap").compression == "none"
    with pytest.raises(ConfigError, match="mcap_compression"):
        parse_config({"export": {"mcap_compression": "gzip"}})


@pytest.mark.parametrize("setting, chunk", [("lz4", "lz4"), ("zstd", "zstd"), ("none", "")])
def test_the_job_exporter_writes_chunks_as_configured(tmp_path: Path, setting: str, chunk: str) -> None:
    spec = get_spec("mcap")
    ex = spec.make(parse_config({"export": {"mcap_compression": setting}}).export.options_for("mcap"))
    assert isinstance(ex, McapExporter) and ex.compression == setting
    src = make_subset(tmp_path / "src", [Ep(frames=6)], "accepted", cameras=2, width=64, height=48)
    out = tmp_path / "out"
    ex.export(src, out)
    assert ex.verify(out).ok
    with open(out / "data/chunk-000/episode_000000.mcap", "rb") as fh:
        reader = make_reader(fh, validate_crcs=True)
        summary = reader.get_summary()
        assert summary is not None and {ci.compression for ci in summary.chunk_indexes} == {chunk}
        assert sum(1 for _ in reader.iter_messages()) == 1 + 2 * 6


def test_verify_refuses_a_chunk_compression_the_reader_refuses(tmp_path: Path) -> None:
    src = make_subset(tmp_path / "src", [Ep(frames=6)], "accepted", cameras=1, width=64, height=48)
    out = tmp_path / "out"
    McapExporter(McapOptions(compression="lz4")).export(src, out)
    path = out / "data/chunk-000/episode_000000.mcap"
    data = path.read_bytes()
    assert data.count(b"\x03\x00\x00\x00lz4") >= 2  # the chunk record and its chunk index name it
    path.write_bytes(data.replace(b"\x03\x00\x00\x00lz4", b"\x03\x00\x00\x00xz9"))
    with open(path, "rb") as fh, pytest.raises(Exception):  # noqa: B017 - whatever mcap raises, it refuses
        list(make_reader(fh, validate_crcs=True).iter_messages())
    report = McapExporter().verify(out)
    assert not report.ok
    assert any("episode_000000.mcap" in e for e in report.errors), report.errors
