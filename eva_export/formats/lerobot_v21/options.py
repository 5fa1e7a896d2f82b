"""The lerobot_v21 options: how the export job checks the published v2.1 subsets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..common.options import FormatOptions, flag, keys


@dataclass(frozen=True)
class V21Options(FormatOptions):
    """``decode_frames``: verify by decoding every frame (True, ``eva-export verify``) or by demuxing packets."""

    decode_frames: bool = True

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> V21Options:
        # The job's default is to demux: the split has just written and validated these MP4s.
        return cls(flag(keys(section, where, ("decode_frames",)), "decode_frames", False, where))
