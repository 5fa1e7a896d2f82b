"""Derive tests/fixtures/lerobot-derived/v20 (a LeRobot v2.0 dataset) from LeRobot's own v2.1 fixture.

LeRobot 0.3.x's v2.0 -> v2.1 converter (convert_dataset_v20_to_v21) computes the per-episode
statistics (meta/episodes_stats.jsonl), removes the deprecated meta/stats.json and sets
codebase_version; this script undoes exactly that: it aggregates episodes_stats.jsonl into a
v2.0 meta/stats.json (min, max, mean, std per feature), deletes episodes_stats.jsonl and writes
codebase_version "v2.0". Data and videos are copied byte for byte. Deterministic.

    python tools/make_v20_fixture.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eva_export.formats.common.stats import aggregate

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests/fixtures/lerobot-written/v21"
DST = ROOT / "tests/fixtures/lerobot-derived/v20"


def main() -> None:
    if DST.exists():
        shutil.rmtree(DST)
    shutil.copytree(SRC, DST)
    meta = DST / "meta"
    per = [json.loads(line)["stats"] for line in (meta / "episodes_stats.jsonl").read_text().splitlines() if line]
    stats = {k: {s: v[s] for s in ("min", "max", "mean", "std")} for k, v in aggregate(per).items()}
    (meta / "stats.json").write_text(json.dumps(stats, indent=4) + "\n")
    (meta / "episodes_stats.jsonl").unlink()
    info = json.loads((meta / "info.json").read_text())
    info["codebase_version"] = "v2.0"
    (meta / "info.json").write_text(json.dumps(info, indent=4) + "\n")
    print(f"wrote {DST}")


if __name__ == "__main__":
    main()
