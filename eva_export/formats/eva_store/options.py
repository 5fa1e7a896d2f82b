"""The eva_store options: image codec, JPEG quality and the train/val split."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import ConfigError
from ..common.options import FormatOptions, keys, number, whole

IMAGE_CODECS = ("jpeg", "png", "raw")  # raw: uncompressed; png: lossless


@dataclass(frozen=True)
class EvaStoreOptions(FormatOptions):
    image_codec: str = "jpeg"  # one of IMAGE_CODECS
    jpeg_quality: int = 90  # 1..100
    val_ratio: float = 0.0  # share of episodes in split "val"; 0: every sample is split "all"
    split_seed: int = 0  # the seed of the episodes' shuffle into train and val

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> EvaStoreOptions:
        keys(section, where, ("image_codec", "jpeg_quality", "val_ratio", "split_seed"))
        codec = section.get("image_codec", cls.image_codec)
        if codec not in IMAGE_CODECS:
            raise ConfigError(f"{where}.image_codec must be jpeg, png or raw, got {codec!r}")
        options = cls(str(codec), whole(section, "jpeg_quality", cls.jpeg_quality, where),
                      number(section, "val_ratio", cls.val_ratio, where),
                      whole(section, "split_seed", cls.split_seed, where))
        if not 1 <= options.jpeg_quality <= 100:
            raise ConfigError(f"{where}.jpeg_quality must be 1..100, got {options.jpeg_quality}")
        if not 0 <= options.val_ratio < 1:
            raise ConfigError(f"{where}.val_ratio must be in [0, 1), got {options.val_ratio}")
        return options
