"""A sixth export format that lives in the tests only: one CSV file per episode.

It proves what adding a format costs: this module (an exporter with ``export`` and
``verify``, built with the shared empty options record) plus one ``FormatSpec`` in the registry; the service, the CLI, the verifier and
the publication take it from there. It writes the numeric columns of each episode (cameras
are left out) and the subset's meta (info.json relabelled, episodes/tasks, the quality split
marker and the card), and verifies the counts against that meta.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq

from eva_export.formats.common.card import check_card
from eva_export.formats.common.exporter import Progress, VerifyReport
from eva_export.formats.common.options import NO_OPTIONS, NoOptions
from eva_export.formats.lerobot_v21.subset import copy_common_meta, write_info, write_quality_split

NAME = "tiny_csv"


def _episode_csv(out_dir: Path, index: int) -> Path:
    return out_dir / "data" / f"episode_{index:06d}.csv"


class TinyCsvExporter:
    name = NAME

    def __init__(self, options: NoOptions = NO_OPTIONS) -> None:  # a format without options
        self.options = options

    def export(self, native_subset: Path, out_dir: Path, progress: Progress) -> None:
        info = json.loads((native_subset / "meta" / "info.json").read_text(encoding="utf-8"))
        (out_dir / "data").mkdir(parents=True, exist_ok=True)
        tables = sorted(native_subset.glob("data/chunk-*/episode_*.parquet"))
        for path in tables:
            table = pq.read_table(path)
            names = [n for n in table.column_names if not n.startswith("observation.images.")]
            index = int(path.stem.split("_")[1])
            target = _episode_csv(out_dir, index)
            with open(target, "w", newline="", encoding="utf-8") as fh:
                w = csv.writer(fh)
                w.writerow(names)
                for row in zip(*(table.column(n).to_pylist() for n in names), strict=True):
                    w.writerow([json.dumps(v) for v in row])
            progress.on_episode(index, target.stat().st_size)
        info["dataset_format"] = NAME
        copy_common_meta(native_subset, out_dir)
        write_info(out_dir, info)
        write_quality_split(native_subset, out_dir, NAME)

    def verify(self, out_dir: Path) -> VerifyReport:
        report = VerifyReport(path=str(out_dir), dataset_format=NAME)
        info = json.loads((out_dir / "meta" / "info.json").read_text(encoding="utf-8"))
        files = sorted((out_dir / "data").glob("episode_*.csv"))
        frames = sum(len(f.read_text(encoding="utf-8").splitlines()) - 1 for f in files)
        report.episodes, report.frames = len(files), frames
        if (len(files), frames) != (info["total_episodes"], info["total_frames"]):
            report.errors.append(f"{len(files)} episodes / {frames} frames, info.json says "
                                 f"{info['total_episodes']} / {info['total_frames']}")
        check_card(report, out_dir)
        return report
