"""The reference pages agree with the code: docs/configuration.md lists every key the config
parser accepts (and no other), and docs/services.md's field reference is generated from srv/
and msg/ as they are now."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from eva_export.config import parse_config
from eva_export.errors import ConfigError
from eva_export.formats.registry import FORMATS
from eva_export.upload.backends import backend_names

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import interfaces_doc  # noqa: E402  (tools/ is not a package)

PROBE = "zz_not_a_key"
# section as the docs name it -> a config that is valid except for PROBE in that section
SECTIONS: dict[str, dict[str, Any]] = {
    "collection": {"collection": {PROBE: 1}},
    "collection.tasks[]": {"collection": {"tasks": [{"dataset_name": "a", PROBE: 1}]}},
    "collection.streams": {"collection": {"streams": {PROBE: 1}}},
    "collection.streams.state": {"collection": {"streams": {"state": {"topic": "/s", PROBE: 1}}}},
    "collection.streams.action": {"collection": {"streams": {"action": {"topic": "/a", PROBE: 1}}}},
    "collection.streams.ee_pose": {"collection": {"streams": {"ee_pose": {"topic": "/p", PROBE: 1}}}},
    "collection.streams.cameras[]": {"collection": {"streams": {"cameras": [{"name": "c", "topic": "/c", PROBE: 1}]}}},
    "collection.capture": {"collection": {"capture": {PROBE: 1}}},
    "collection.storage.sftp": {"collection": {"storage": {"sftp": {"host": "h", PROBE: 1}}}},
    "export": {"export": {PROBE: 1}},
    "export.formats": {"export": {"formats": {PROBE: 1}}},
    **{f"export.formats.{name}": {"export": {"formats": {name: {PROBE: 1}}}} for name in FORMATS},
    "upload": {"upload": {PROBE: 1}},
    "console": {"console": {PROBE: 1}},
}


def parser_keys() -> set[str]:
    """Every key the parser accepts, as a dotted path, from its own refusal of an unknown key."""
    keys = set()
    for section, raw in SECTIONS.items():
        with pytest.raises(ConfigError, match=PROBE) as info:
            parse_config(raw)
        allowed = ast.literal_eval(str(info.value).rsplit("allowed: ", 1)[1])
        keys.update(f"{section}.{k}" for k in allowed)
    # collection.storage takes one section per registered upload backend (upload/backends.py)
    keys.update(f"collection.storage.{name}" for name in backend_names())
    return keys


def documented_keys() -> set[str]:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    keys = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line[2:].split(" | ", 1)[0]
            keys.update(re.findall(r"`((?:collection|export|upload|console)\.[^`]+)`", first))
    return keys


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    have, doc = parser_keys(), documented_keys()
    assert len(have) > 50  # the probe reached every section
    assert sorted(have - doc) == [], "keys the parser accepts that docs/configuration.md lacks"
    assert sorted(doc - have) == [], "keys docs/configuration.md lists that the parser refuses"


def test_services_field_reference_is_generated_from_the_definitions() -> None:
    doc = (ROOT / "docs" / "services.md").read_text(encoding="utf-8")
    assert interfaces_doc.current(doc) == doc, "run: python tools/interfaces_doc.py --write"
    for folder in ("srv", "msg"):
        for path in (ROOT / folder).glob(f"*.{folder}"):
            assert f"### {path.stem} (`{folder}/{path.name}`)" in doc
