"""The hdf5 options: the compression filter of the image datasets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..common.options import FormatOptions, choice, keys

COMPRESSIONS = ("", "lzf", "gzip")  # "": none (the default: frames are written at the disk's speed)


@dataclass(frozen=True)
class Hdf5Options(FormatOptions):
    compression: str = ""  # one of COMPRESSIONS

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> Hdf5Options:
        return cls(choice(keys(section, where, ("compression",)), "compression", COMPRESSIONS, where))
