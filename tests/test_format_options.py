"""Typed options per format: each format's record is parsed once from ``export.formats.<name>``
(the older flat keys mapped onto those sections) and reaches its exporter as that one record."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest
from dsfactory import Ep, make_dataset

from eva_export.config import parse_config
from eva_export.errors import ConfigError
from eva_export.export.runner import ExportService
from eva_export.formats import registry
from eva_export.formats.common.options import NO_OPTIONS, FormatOptions, NoOptions
from eva_export.formats.eva_store.options import EvaStoreOptions
from eva_export.formats.hdf5.options import Hdf5Options
from eva_export.formats.lerobot_v3.options import V3Options
from eva_export.formats.lerobot_v21.options import V21Options
from eva_export.formats.mcap_eva.options import McapOptions
from eva_export.formats.mcap_viewer.options import ViewerOptions
from eva_export.jobs import COMPLETED


def formats(export: dict[str, object]) -> dict[str, FormatOptions]:
    return dict(parse_config({"export": export}).export.formats)


def test_an_empty_config_holds_every_formats_record_with_its_defaults() -> None:
    got = formats({})
    assert list(got) == list(registry.FORMATS)
    assert got == {"lerobot_v21": V21Options(decode_frames=False), "lerobot_v3": V3Options(100.0, 200.0),
                   "hdf5": Hdf5Options(""), "mcap": McapOptions("lz4"), "eva_store": EvaStoreOptions(),
                   "mcap_foxglove": ViewerOptions("lz4")}
    for name, spec in registry.FORMATS.items():
        assert type(got[name]) is spec.options


def test_the_sections_and_the_older_keys_give_the_same_records() -> None:
    new = formats({"formats": {"lerobot_v3": {"data_file_mb": 5, "video_file_mb": 7.5},
                               "hdf5": {"compression": "gzip"},
                               "mcap": {"compression": "none"}, "mcap_foxglove": {"compression": "none"},
                               "eva_store": {"image_codec": "png", "split_seed": 3}}})
    old = formats({"v3_data_file_mb": 5, "v3_video_file_mb": 7.5, "hdf5_compression": "gzip",
                   "mcap_compression": "none", "eva_store": {"image_codec": "png", "split_seed": 3}})
    assert new == old
    assert new["lerobot_v3"] == V3Options(5.0, 7.5) and new["eva_store"] == EvaStoreOptions("png", split_seed=3)
    # the two spellings mix, one key each
    assert formats({"v3_data_file_mb": 5, "formats": {"lerobot_v3": {"video_file_mb": 7.5}}}) == new | {
        k: v for k, v in formats({}).items() if k not in ("lerobot_v3",)}


@pytest.mark.parametrize("export, named", [
    ({"hdf5_compression": "lzf", "formats": {"hdf5": {"compression": "gzip"}}},
     "export.hdf5_compression and export.formats.hdf5.compression"),
    ({"mcap_compression": "zstd", "formats": {"mcap_foxglove": {"compression": "lz4"}}},
     "export.mcap_compression and export.formats.mcap_foxglove.compression"),
    ({"eva_store": {"jpeg_quality": 80}, "formats": {"eva_store": {"jpeg_quality": 70}}},
     "export.eva_store.jpeg_quality and export.formats.eva_store.jpeg_quality"),
])
def test_a_setting_given_in_both_places_is_refused(export: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named + " are one setting given twice"):
        formats(export)


@pytest.mark.parametrize("section, message", [
    ({"lerobot_v21": {"decode_frames": "yes"}}, "export.formats.lerobot_v21.decode_frames must be true or false"),
    ({"lerobot_v3": {"data_file_mb": "big"}}, "export.formats.lerobot_v3.data_file_mb must be a number"),
    ({"lerobot_v3": {"video_file_mb": 0}}, "export.formats.lerobot_v3.video_file_mb must be a positive number"),
    ({"lerobot_v3": {"data_files_size_in_mb": 1}}, r"export.formats.lerobot_v3: unknown keys \['data_files_size_in_mb'\]"),
    ({"hdf5": {"compression": "zstd"}}, "export.formats.hdf5.compression must be '', 'lzf' or 'gzip', got 'zstd'"),
    ({"mcap": {"compression": "gzip"}}, "export.formats.mcap.compression must be 'lz4', 'zstd' or 'none'"),
    ({"mcap_foxglove": {"compression": True}}, "export.formats.mcap_foxglove.compression must be"),
    ({"eva_store": {"jpeg_quality": 0}}, "export.formats.eva_store.jpeg_quality must be 1..100"),
    ({"eva_store": {"jpeg_quality": 8.5}}, "export.formats.eva_store.jpeg_quality must be a whole number"),
    ({"eva_store": {"val_ratio": 1}}, r"export.formats.eva_store.val_ratio must be in \[0, 1\)"),
    ({"zarr": {}}, r"export.formats: unknown keys \['zarr'\]; allowed: .*'lerobot_v3'"),
    ({"hdf5": ["gzip"]}, "export.formats.hdf5 must be a mapping"),
    ({"hdf5": 5}, "export.formats.hdf5 must be a mapping"),
])
def test_a_bad_value_or_key_is_refused_naming_it(section: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        formats({"formats": section})


def test_an_error_in_an_older_key_names_the_spelling_given() -> None:
    with pytest.raises(ConfigError, match="export.eva_store must be a mapping"):
        formats({"eva_store": 5})
    with pytest.raises(ConfigError, match=r"lerobot_v3.data_file_mb must be a positive number of MB, got -1.0 \(given as export.v3_data_file_mb\)"):
        formats({"v3_data_file_mb": -1})


def test_make_takes_one_record_of_its_own_format() -> None:
    spec = registry.get_spec("hdf5")
    assert spec.make(Hdf5Options("lzf")).compression == "lzf"  # type: ignore[attr-defined]
    assert spec.make().compression == ""  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="hdf5 exporter takes Hdf5Options, not McapOptions"):
        spec.make(McapOptions("lz4"))
    with pytest.raises(TypeError, match="takes Hdf5Options, not NoOptions"):
        registry.get_exporter("hdf5", NO_OPTIONS)


def test_a_format_without_options_takes_the_empty_record(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = registry.FormatSpec("tiny_csv", "plugins.tiny_csv:TinyCsvExporter", "CSV (tests only)")
    assert spec.options is NoOptions
    cfg = parse_config({}).export  # loaded before the format is registered: it gets the defaults
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, spec))
    monkeypatch.setitem(registry.FORMATS, spec.name, spec)  # type: ignore[index]
    assert cfg.options_for("tiny_csv") == NO_OPTIONS and spec.make(NO_OPTIONS).name == "tiny_csv"
    assert parse_config({"export": {"formats": {"tiny_csv": None}}}).export.formats["tiny_csv"] == NO_OPTIONS
    with pytest.raises(ConfigError, match=r"export.formats.tiny_csv: unknown keys \['rows'\]; allowed: \[\]"):
        parse_config({"export": {"formats": {"tiny_csv": {"rows": 3}}}})


def test_the_export_job_hands_the_configured_record_to_its_exporter(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    src = make_dataset(log_dir / "demo" / "raw", [Ep(frames=5), Ep(frames=4, quality="red")],
                       cameras=1, width=32, height=24)
    cfg = parse_config({"collection": {"log_dir": str(log_dir)},
                        "export": {"formats": {"hdf5": {"compression": "gzip"}}}})
    job = ExportService(cfg, background=False, recover=False).run(src, "hdf5")
    assert job.state == COMPLETED, job.error
    files = sorted(Path(job.accepted_dir).rglob("*.hdf5"))
    assert len(files) == 1
    with h5py.File(files[0], "r") as f:
        filters = {obj.compression for obj in _datasets(f["images"])}
    assert filters == {"gzip"}


def _datasets(group: h5py.Group) -> list[h5py.Dataset]:
    out: list[h5py.Dataset] = []
    group.visititems(lambda _name, obj: out.append(obj) if isinstance(obj, h5py.Dataset) else None)
    return out
