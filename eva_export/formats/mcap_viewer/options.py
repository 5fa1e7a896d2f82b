"""The mcap_foxglove options: the chunk compression (every viewer reads lz4, zstd and none)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..common.options import FormatOptions, choice, keys

COMPRESSIONS = ("lz4", "zstd", "none")


@dataclass(frozen=True)
class ViewerOptions(FormatOptions):
    compression: str = "lz4"  # one of COMPRESSIONS

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> ViewerOptions:
        return cls(choice(keys(section, where, ("compression",)), "compression", COMPRESSIONS, where))
