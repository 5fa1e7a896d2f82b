"""Names of the LeRobot v3.0 layout, the one home of each: its reader (the v3.0 source), its
writer (the lerobot_v3 exporter) and its verifier all import them from here."""

FORMAT = "lerobot_v3"
CODEBASE_V30 = "v3.0"
DATA_PATH_V30 = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH_V30 = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_DIR = "meta/episodes"
EPISODES_PATH_V30 = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_GLOB = "chunk-*/file-*.parquet"  # inside EPISODES_DIR
TASKS_PARQUET = "meta/tasks.parquet"
#: info.json keys of v3.0 only: the v2.1 subsets the split writes do not carry them.
V3_ONLY_INFO = ("data_files_size_in_mb", "video_files_size_in_mb")
