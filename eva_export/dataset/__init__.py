"""The LeRobot v2.1 dataset contract: records, paths, video, statistics, writer, reader."""
