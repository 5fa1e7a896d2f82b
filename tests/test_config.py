"""config/default.yaml documents every key: its keys equal the config dataclasses' fields.

Optional sections (ee_pose, storage.sftp) stay commented out in the file so a robot does not
get a fake upload target; the test uncomments them and checks the complete file parses.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from eva_export import config as cfg
from eva_export.formats.eva_store.options import EvaStoreOptions
from eva_export.formats.registry import FORMATS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "default.yaml"


def _uncommented() -> dict[str, Any]:
    """default.yaml with its commented-out optional sections switched on."""
    lines = []
    in_block = False
    for line in DEFAULT.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^(\s*)# (ee_pose:|storage:)(.*)$", line)
        if m:
            in_block = m.group(2) == "storage:"
            lines.append(m.group(1) + m.group(2) + m.group(3))
            continue
        m = re.match(r"^(\s*)#( +\w+:.*)$", line)
        if in_block and m:
            lines.append(m.group(1) + m.group(2)[1:] if m.group(2).startswith("  ") else line)
            continue
        in_block = False
        lines.append(line)
    return yaml.safe_load("\n".join(lines))


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_default_yaml_lists_every_config_key() -> None:
    raw = _uncommented()
    col = raw["collection"]
    assert set(raw) == {"collection", "export", "upload", "console"}
    # CollectionConfig's fields minus the ones grouped under streams / storage in the file
    assert set(col) == (_fields(cfg.CollectionConfig) - {"state", "action", "ee_pose", "cameras", "sftp"}) | {
        "streams", "storage"}
    assert set(col["streams"]) == {"state", "action", "ee_pose", "cameras"}
    for vec in ("state", "action"):
        assert set(col["streams"][vec]) == _fields(cfg.VectorStream)
    assert set(col["streams"]["ee_pose"]) == _fields(cfg.PoseStream)
    for cam in col["streams"]["cameras"]:
        assert set(cam) == _fields(cfg.CameraStream)
    assert set(col["tasks"][0]) == _fields(cfg.TaskSpec)
    assert set(col["capture"]) == _fields(cfg.CaptureSettings)
    assert set(col["storage"]) == {"sftp"}
    assert set(col["storage"]["sftp"]) == _fields(cfg.SftpSettings)
    assert set(raw["export"]) == _fields(cfg.ExportConfig)
    assert set(raw["export"]["formats"]) == set(FORMATS)
    for name, spec in FORMATS.items():
        assert set(raw["export"]["formats"][name]) == _fields(spec.options), name
    assert set(raw["upload"]) == _fields(cfg.UploadConfig)
    assert set(raw["console"]) == _fields(cfg.ConsoleConfig)


def test_default_yaml_values_are_the_dataclass_defaults() -> None:
    """The file's values are what an empty config gives, so the comments never drift."""
    raw = _uncommented()
    c = cfg.parse_config(raw, DEFAULT)
    assert c.collection.capture == cfg.CaptureSettings()
    assert c.export.formats["eva_store"] == EvaStoreOptions()
    assert c.console == cfg.ConsoleConfig()
    sftp = c.collection.sftp
    assert sftp is not None
    defaults = cfg.SftpSettings(host="")
    for name in ("port", "connect_timeout_s", "transfer_timeout_s", "max_attempts", "retry_backoff_s",
                 "retry_backoff_max_s", "bandwidth_limit_bps", "parallel_files"):
        assert getattr(sftp, name) == getattr(defaults, name), name
    empty = cfg.parse_config({})
    assert c.export.formats == empty.export.formats


def test_default_yaml_as_shipped_parses() -> None:
    c = cfg.load_config(DEFAULT)
    assert c.collection.sftp is None and c.collection.ee_pose is None
