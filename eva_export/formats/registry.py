"""The four registered export formats: name -> exporter class.

``get_exporter(name, **options)`` builds one; options go to the exporter's constructor
(e.g. ``data_files_size_in_mb`` for lerobot_v3, ``compression`` for hdf5 and mcap).
"""

from __future__ import annotations

from typing import Any

from ..errors import ExportError
from .base import Exporter
from .hdf5 import Hdf5Exporter
from .lerobot_v3 import LeRobotV3Exporter
from .lerobot_v21 import LeRobotV21Exporter
from .mcap_eva import McapExporter

FORMATS: dict[str, type[Any]] = {
    "lerobot_v21": LeRobotV21Exporter,
    "lerobot_v3": LeRobotV3Exporter,
    "hdf5": Hdf5Exporter,
    "mcap": McapExporter,
}


class UnknownFormatError(ExportError, ValueError):
    """The requested format is not one of the registered ones."""


def format_names() -> list[str]:
    return list(FORMATS)


def get_exporter(name: str, **options: Any) -> Exporter:
    """The exporter registered as ``name``; UnknownFormatError lists the valid names."""
    try:
        cls = FORMATS[name]
    except (KeyError, TypeError):
        raise UnknownFormatError(
            f"unknown export format {name!r}; registered formats: {', '.join(FORMATS)}") from None
    exporter: Exporter = cls(**options)
    return exporter
