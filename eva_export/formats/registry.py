"""The four registered export formats: name -> exporter class.

``get_exporter(name, **options)`` builds one; options go to the exporter's constructor
(e.g. ``data_files_size_in_mb`` for lerobot_v3, ``compression`` for hdf5 and mcap).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ExportError
from .base import Exporter

# name -> "module:class". Imported on first use, so exporting one format does not load the
# libraries of the others (h5py, mcap): that is ~15 MB of a v3 export's peak memory.
FORMATS: dict[str, str] = {
    "lerobot_v21": "lerobot_v21:LeRobotV21Exporter",
    "lerobot_v3": "lerobot_v3:LeRobotV3Exporter",
    "hdf5": "hdf5:Hdf5Exporter",
    "mcap": "mcap_eva:McapExporter",
    "eva_store": "eva_store:EvaStoreExporter",
}


class UnknownFormatError(ExportError, ValueError):
    """The requested format is not one of the registered ones."""


def format_names() -> list[str]:
    return list(FORMATS)


def get_exporter(name: str, **options: Any) -> Exporter:
    """The exporter registered as ``name``; UnknownFormatError lists the valid names."""
    try:
        module, cls_name = FORMATS[name].split(":")
    except (KeyError, TypeError):
        raise UnknownFormatError(
            f"unknown export format {name!r}; registered formats: {', '.join(FORMATS)}") from None
    cls = getattr(importlib.import_module(f"{__package__}.{module}"), cls_name)
    exporter: Exporter = cls(**options)
    return exporter
