"""The export formats: one ``FormatSpec`` each, the only place a format is defined.

Everything that names formats derives from ``SPECS`` and reads ``FORMATS`` when it runs (no
copies): the export request (resolved once, ``export/request.py``), the exporter options, the
upload gate, the CLI choices and help, the console, the verifier (``eva-export verify`` and the
export job's check before publication). ``get_spec`` is the one lookup and
``UnknownFormatError`` the one refusal of a name that is not registered.

Adding a format = one module ``formats/<name>.py`` with an exporter class (``export`` and
``verify``, see base.Exporter) + one ``FormatSpec`` line below + its tests and docs.

This module stays light (no numpy, pyarrow, h5py, mcap): config imports it, and an exporter's
module is imported only when that format is used, so a v3 export never loads h5py or mcap
(~15 MB of its peak memory).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import ExportError
from .common.exporter import Exporter, VerifyReport


class ExportConfig(Protocol):
    """The export settings the exporters' options are read from: ``config.ExportConfig``.

    A protocol, not an import: this module stays below config in the layers (config's
    class named here would be an import from a lower layer up, even for the type checker).
    """

    @property
    def v3_data_file_mb(self) -> float: ...
    @property
    def v3_video_file_mb(self) -> float: ...
    @property
    def hdf5_compression(self) -> str: ...
    @property
    def mcap_compression(self) -> str: ...
    @property
    def eva_store(self) -> Any: ...  # config.StoreSettings (a frozen dataclass)


def _no_options(_export: ExportConfig) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class FormatSpec:
    """One export format and everything the rest of the code needs to know about it."""

    name: str  # the dataset_format value on disk and in requests
    exporter: str  # ".module:Class" relative to eva_export.formats, or "pkg.module:Class", imported on first use
    description: str  # one line, for docs and CLI help
    embedded_images: bool = False  # images inside the episode files (no MP4s, total_videos 0)
    # The native split's output already is this format: its exporter only relabels the staged
    # subset (hard links), so its episodes are not counted a second time in job progress.
    native: bool = False
    # Constructor options of the exporter an export job uses, from the config's export section.
    options: Callable[[ExportConfig], dict[str, Any]] = _no_options

    def load(self) -> type[Exporter]:
        """The exporter class (imports its module, and with it the format's libraries)."""
        module, cls_name = self.exporter.split(":")
        cls: type[Exporter] = getattr(importlib.import_module(module, __package__), cls_name)
        return cls

    def make(self, **options: Any) -> Exporter:
        """An exporter built with ``options`` (its constructor's keyword arguments)."""
        return self.load()(**options)

    def verify(self, out_dir: Path) -> VerifyReport:
        """The format's verifier (its exporter's ``verify``, default options) on one subset."""
        return self.make().verify(Path(out_dir))


def _v21_options(_export: ExportConfig) -> dict[str, Any]:
    # The job checks frame counts by demuxing (the split has just written and validated these
    # MP4s); `eva-export verify` decodes every frame (the exporter's default).
    return {"decode_frames": False}


def _v3_options(export: ExportConfig) -> dict[str, Any]:
    return {"data_files_size_in_mb": export.v3_data_file_mb, "video_files_size_in_mb": export.v3_video_file_mb}


def _hdf5_options(export: ExportConfig) -> dict[str, Any]:
    return {"compression": export.hdf5_compression}


def _mcap_options(export: ExportConfig) -> dict[str, Any]:
    return {"compression": export.mcap_compression}


def _store_options(export: ExportConfig) -> dict[str, Any]:
    return dataclasses.asdict(export.eva_store)


SPECS: tuple[FormatSpec, ...] = (
    FormatSpec("lerobot_v21", ".lerobot_v21.exporter:LeRobotV21Exporter",
               "LeRobot v2.1 (the native split published as is; lerobot 0.3.x)",
               native=True, options=_v21_options),
    FormatSpec("lerobot_v3", ".lerobot_v3.exporter:LeRobotV3Exporter",
               "LeRobot v3.0 (sharded Parquet and MP4; lerobot 0.4.x)", options=_v3_options),
    FormatSpec("hdf5", ".hdf5.exporter:Hdf5Exporter", "HDF5, one file per episode with the images inside (h5py)",
               embedded_images=True, options=_hdf5_options),
    FormatSpec("mcap", ".mcap_eva.exporter:McapExporter", "MCAP (eva-client profile), one file per episode, images embedded as MessagePack",
               embedded_images=True, options=_mcap_options),
    FormatSpec("eva_store", ".eva_store.exporter:EvaStoreExporter",
               "eva_store, a random-access training store (Zarr arrays, image records, a sample index)", options=_store_options),
    FormatSpec("mcap_foxglove", ".mcap_viewer.exporter:McapViewerExporter",
               "MCAP for viewers (Foxglove, Lichtblick, Rerun): cameras as foxglove.CompressedVideo/CompressedImage, "
               "joints as ROS 2 JointState", embedded_images=True, options=_mcap_options),
)

#: name -> spec, in the order above (the order CLI choices and messages list them).
FORMATS: Mapping[str, FormatSpec] = {s.name: s for s in SPECS}


class UnknownFormatError(ExportError, ValueError):
    """The requested format is not one of the registered ones."""


def format_names() -> list[str]:
    return list(FORMATS)


def get_spec(name: str) -> FormatSpec:
    """The spec registered as ``name``; UnknownFormatError lists the valid names."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise UnknownFormatError(
            f"unknown export format {name!r}; registered formats: {', '.join(FORMATS)}") from None


def get_exporter(name: str, **options: Any) -> Exporter:
    """The exporter registered as ``name``, built with ``options``."""
    return get_spec(name).make(**options)


def help_text() -> str:
    """'a, b, c or d': the format names for help texts."""
    names = list(FORMATS)
    return ", ".join(names[:-1]) + " or " + names[-1]
