"""Names of the LeRobot v3.0 layout shared by the lerobot_v3 writer and its verifier (one home,
so the verifier does not import the writer that calls it)."""

FORMAT = "lerobot_v3"
CODEBASE_V30 = "v3.0"
DATA_PATH_V30 = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH_V30 = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
TASKS_PARQUET = "meta/tasks.parquet"
