"""The mcap (eva-client profile) options: the chunk compression."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..common.options import FormatOptions, choice, keys

COMPRESSIONS = ("lz4", "zstd", "none")  # the profile fixes the records, not the chunk compression


@dataclass(frozen=True)
class McapOptions(FormatOptions):
    compression: str = "lz4"  # one of COMPRESSIONS; none writes raw frames at the disk's speed

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> McapOptions:
        return cls(choice(keys(section, where, ("compression",)), "compression", COMPRESSIONS, where))
