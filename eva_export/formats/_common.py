"""Re-exports of the format toolkit, kept so ``from . import _common as common`` still works.

The helpers live in modules named for what they hold: source.py (the staged v2.1 input),
episode_stats.py, images.py (camera frames, prefetch), episode_files.py (the one-file-per-episode
loop of hdf5/mcap) and checks.py (shared verification steps). New code imports those directly;
this shim eases merging branches that still edit ``_common``.
"""

from __future__ import annotations

from .checks import (  # noqa: F401
    check_sample,
    check_totals,
    read_episode_rows,
    start_report,
)
from .episode_files import (  # noqa: F401
    EPISODE_CHUNK_PATH,
    embedded_info,
    episode_file,
    episode_file_unit,
    export_episode_files,
    to_plain,
)
from .episode_stats import (  # noqa: F401
    dataset_stats,
    episode_stats,
    image_stats_of,
    missing_image_stats,
)
from .images import (  # noqa: F401
    Prefetch,
    camera_frames,
    decode_png,
    iter_table_images,
    parquet_image_keys,
)
from .source import (  # noqa: F401
    COMMON_META,
    column_numpy,
    copy_common_meta,
    link_or_copy,
    load_source,
    read_episode_table,
    state_action_keys,
    write_info,
    write_quality_split,
)
