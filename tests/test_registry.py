"""The format registry is the one list of formats: everything else derives from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eva_export import cli, config
from eva_export.formats import registry
from eva_export.formats.registry import FORMATS, SPECS, UnknownFormatError, get_spec

ROOT = Path(__file__).resolve().parents[1]


def test_config_cli_and_help_take_the_registry_names() -> None:
    names = [s.name for s in SPECS]
    assert list(FORMATS) == names
    parser = cli.build_parser()
    export = parser._subparsers._group_actions[0].choices["export"]  # type: ignore[union-attr]
    fmt = next(a for a in export._actions if a.dest == "fmt")
    assert list(fmt.choices) == names  # type: ignore[arg-type]
    assert all(s.description in fmt.help for s in SPECS)  # type: ignore[operator]
    upload = parser._subparsers._group_actions[0].choices["upload"]  # type: ignore[union-attr]
    help_text = next(a for a in upload._actions if a.dest == "fmt").help
    assert help_text == registry.help_text() and all(n in help_text for n in names)  # type: ignore[operator]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_each_spec_builds_its_exporter_from_the_default_config(spec: registry.FormatSpec) -> None:
    cfg = config.parse_config({"collection": {"log_dir": "/tmp/eva-registry-test"}})
    exporter = spec.make(cfg.export.options_for(spec.name))
    assert exporter.name == spec.name
    assert callable(exporter.export) and callable(exporter.verify)


def test_traits() -> None:
    assert [s.name for s in SPECS if s.embedded_images] == ["hdf5", "mcap", "mcap_foxglove"]
    assert [s.name for s in SPECS if s.native] == ["lerobot_v21"]
    with pytest.raises(UnknownFormatError, match="registered formats: lerobot_v21"):
        get_spec("zarr")


def test_registry_and_config_load_no_format_library() -> None:
    """The registry and config stay light; a v3 exporter must not bring h5py or mcap along."""
    code = ("import sys, eva_export.config, eva_export.formats.registry as r\n"
            "before = [m for m in ('h5py', 'mcap', 'pyarrow', 'av') if m in sys.modules]\n"
            "r.get_exporter('lerobot_v3')\n"
            "print(before, [m for m in ('h5py', 'mcap') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"


def test_the_cli_imports_no_upload_library_until_an_upload_runs() -> None:
    """`eva-export export` registers the upload command but must not pay paramiko's import."""
    code = ("import sys, eva_export.cli\n"
            "before = 'paramiko' in sys.modules\n"
            "from eva_export.upload import UploadService\n"
            "print(before, 'paramiko' in sys.modules, UploadService.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "UploadService"]
    from eva_export import upload

    assert sorted(upload.__all__) == sorted(upload._HOMES)  # every lazy name is exported
