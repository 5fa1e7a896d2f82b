"""What every on-disk format shares: the episode and split records, the LeRobot meta folder, video, statistics, Parquet tables, the source and exporter interfaces, the card and the verifier steps."""
