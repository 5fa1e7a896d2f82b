"""The lerobot_v3 options: the sizes at which data and video shards are closed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import ConfigError
from ..common.options import FormatOptions, keys, number


@dataclass(frozen=True)
class V3Options(FormatOptions):
    """Shard sizes in MB (info.json's ``data_files_size_in_mb`` / ``video_files_size_in_mb``)."""

    data_file_mb: float = 100.0
    video_file_mb: float = 200.0

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> V3Options:
        keys(section, where, ("data_file_mb", "video_file_mb"))
        options = cls(number(section, "data_file_mb", cls.data_file_mb, where),
                      number(section, "video_file_mb", cls.video_file_mb, where))
        for key in ("data_file_mb", "video_file_mb"):
            if not getattr(options, key) > 0:
                raise ConfigError(f"{where}.{key} must be a positive number of MB, got {getattr(options, key)}")
        return options
