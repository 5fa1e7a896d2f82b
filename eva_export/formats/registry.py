"""The export formats: one ``FormatSpec`` each, the only place a format is defined.

Everything that names formats derives from ``SPECS`` and reads ``FORMATS`` when it runs (no
copies): the export request (resolved once, ``export/request.py``), the config's option
sections (``export.formats.<name>``, each parsed once into the spec's options record), the
upload gate, the CLI choices and help, the console, the verifier (``eva-export verify`` and
the export job's check before publication). ``get_spec`` is the one lookup and
``UnknownFormatError`` the one refusal of a name that is not registered.

Adding a format = one module or package ``formats/<name>/`` with an exporter class (``export``
and ``verify``, see common/exporter.py; its constructor takes the format's options record) + one
``FormatSpec`` line below + its tests and docs. A format with options adds a frozen record
deriving from ``FormatOptions`` with its ``parse`` (common/options.py) and names it in its spec;
one without takes ``NoOptions``.

This module stays light (no numpy, pyarrow, h5py, mcap): config imports it, and an exporter's
module is imported only when that format is used, so a v3 export never loads h5py or mcap
(~15 MB of its peak memory).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExportError
from .common.exporter import Exporter, VerifyReport
from .common.options import FormatOptions, NoOptions
from .eva_store.options import EvaStoreOptions
from .hdf5.options import Hdf5Options
from .lerobot_v3.options import V3Options
from .lerobot_v21.options import V21Options
from .mcap_eva.options import McapOptions
from .mcap_viewer.options import ViewerOptions


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
    # The exporter's options record: parsed from config section export.formats.<name>, handed
    # to the exporter's constructor. A light module (config imports it when it loads).
    options: type[FormatOptions] = NoOptions

    def parse(self, section: Mapping[str, object], where: str) -> FormatOptions:
        """The options record from the config section at ``where``; ConfigError names a bad key."""
        return self.options.parse(section, where)

    def load(self) -> Callable[[FormatOptions], Exporter]:
        """The exporter class (imports its module, and with it the format's libraries)."""
        module, cls_name = self.exporter.split(":")
        cls: Callable[[FormatOptions], Exporter] = getattr(importlib.import_module(module, __package__), cls_name)
        return cls

    def make(self, options: FormatOptions | None = None) -> Exporter:
        """An exporter built with ``options`` (its options record; None: the record's defaults)."""
        if options is None:
            options = self.options()
        if type(options) is not self.options:
            raise TypeError(f"{self.name} exporter takes {self.options.__name__}, not {type(options).__name__}")
        return self.load()(options)

    def verify(self, out_dir: Path) -> VerifyReport:
        """The format's verifier (its exporter's ``verify``, default options) on one subset."""
        return self.make().verify(Path(out_dir))


SPECS: tuple[FormatSpec, ...] = (
    FormatSpec("lerobot_v21", ".lerobot_v21.exporter:LeRobotV21Exporter",
               "LeRobot v2.1 (the native split published as is; lerobot 0.3.x)",
               native=True, options=V21Options),
    FormatSpec("lerobot_v3", ".lerobot_v3.exporter:LeRobotV3Exporter",
               "LeRobot v3.0 (sharded Parquet and MP4; lerobot 0.4.x)", options=V3Options),
    FormatSpec("hdf5", ".hdf5.exporter:Hdf5Exporter", "HDF5, one file per episode with the images inside (h5py)",
               embedded_images=True, options=Hdf5Options),
    FormatSpec("mcap", ".mcap_eva.exporter:McapExporter", "MCAP (eva-client profile), one file per episode, images embedded as MessagePack",
               embedded_images=True, options=McapOptions),
    FormatSpec("eva_store", ".eva_store.exporter:EvaStoreExporter",
               "eva_store, a random-access training store (Zarr arrays, image records, a sample index)",
               options=EvaStoreOptions),
    FormatSpec("mcap_foxglove", ".mcap_viewer.exporter:McapViewerExporter",
               "MCAP for viewers (Foxglove, Lichtblick, Rerun): cameras as foxglove.CompressedVideo/CompressedImage, "
               "joints as ROS 2 JointState", embedded_images=True, options=ViewerOptions),
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


def get_exporter(name: str, options: FormatOptions | None = None) -> Exporter:
    """The exporter registered as ``name``, built with ``options`` (None: the format's defaults)."""
    return get_spec(name).make(options)


def help_text() -> str:
    """'a, b, c or d': the format names for help texts."""
    names = list(FORMATS)
    return ", ".join(names[:-1]) + " or " + names[-1]
