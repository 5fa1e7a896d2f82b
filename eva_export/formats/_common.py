"""Re-exports of the format toolkit, kept so ``from . import _common as common`` still works.

The helpers live in modules named for what they hold: source.py (the staged v2.1 input),
episode_stats.py, images.py (camera frames, prefetch), episode_files.py (the one-file-per-episode
loop of hdf5/mcap) and checks.py (shared verification steps). New code imports those directly;
this shim eases merging branches that still edit ``_common``.
"""

from __future__ import annotations

from .source import (  # noqa: F401
    COMMON_META,
    load_source,
    read_episode_table,
    column_numpy,
    state_action_keys,
    copy_common_meta,
    write_quality_split,
    write_info,
    link_or_copy,
)
from .episode_stats import (  # noqa: F401
    dataset_stats,
    episode_stats,
    missing_image_stats,
    image_stats_of,
)
from .images import (  # noqa: F401
    parquet_image_keys,
    decode_png,
    iter_table_images,
    camera_frames,
    Prefetch,
)
from .episode_files import (  # noqa: F401
    EMBEDDED_IMAGE_FORMATS,
    EPISODE_CHUNK_PATH,
    embedded_info,
    episode_file,
    to_plain,
    export_episode_files,
)
from .checks import (  # noqa: F401
    start_report,
    read_episode_rows,
    check_totals,
    check_sample,
)
