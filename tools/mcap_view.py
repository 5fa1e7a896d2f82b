"""Open one episode of an mcap_foxglove export in Rerun with a layout made for it, or save a
screenshot of it (docs/mcap-viewers.md).

    python tools/mcap_view.py EXPORT/mcap_foxglove/accepted [--episode 0]
    python tools/mcap_view.py EXPORT/mcap_foxglove/accepted --screenshot shot.png   # headless: xvfb-run

Rerun's default layout for an MCAP puts every camera into one view at the root, where cameras
that carry a frame id (as this profile's do, for Foxglove's 3D panel) have no transform to be
drawn in. This writes a blueprint with one 2D view per camera, the episode's review as text and one
time series per state and action, converts the episode with `rerun mcap convert` (durations from the episode's start on
the timeline) and opens both. Needs rerun-sdk (requirements.txt pins it for the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

APP_ID = "eva_export"


def rerun_binary() -> str:
    here = Path(sys.executable).parent / "rerun"
    found = str(here) if here.exists() else shutil.which("rerun")
    if found is None:
        sys.exit("rerun is not installed: pip install rerun-sdk==0.41.0")
    return found


def blueprint(info: dict[str, object], path: Path) -> None:
    import rerun.blueprint as rrb

    features = info["features"]
    assert isinstance(features, dict)
    cams = [k for k, f in features.items() if f.get("dtype") in ("image", "video")]
    plots = [k for k in ("observation.state", "action") if k in features]
    cam_views = [rrb.Spatial2DView(origin=f"/{k}", name=k.removeprefix("observation.images.")) for k in cams]
    plot_views = [rrb.TimeSeriesView(origin=f"/{k}/position", name=k) for k in plots]
    why = rrb.TextDocumentView(origin="/eva_export/episode", name="episode: why it is in this subset")
    right = rrb.Vertical(why, *plot_views, row_shares=[1] + [2] * len(plot_views))
    rrb.Blueprint(rrb.Horizontal(rrb.Vertical(*cam_views), right), collapse_panels=True).save(APP_ID, str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("subset", type=Path, help="an accepted or rejected directory of an mcap_foxglove export")
    ap.add_argument("--episode", type=int, default=0)
    ap.add_argument("--screenshot", type=Path, default=None, help="save a PNG and quit instead of opening the viewer")
    ap.add_argument("--size", default="1600x900", help="window size of the screenshot")
    args = ap.parse_args(argv)
    info = json.loads((args.subset / "meta" / "info.json").read_text(encoding="utf-8"))
    if info.get("dataset_format") != "mcap_foxglove":
        sys.exit(f"{args.subset}: dataset_format {info.get('dataset_format')!r}, not mcap_foxglove")
    chunk = args.episode // int(info.get("chunks_size") or 1000)
    mcap = args.subset / str(info["data_path"]).format(episode_chunk=chunk, episode_index=args.episode)
    work = Path(tempfile.mkdtemp(prefix="mcap_view_"))
    rrd, rbl = work / f"{mcap.stem}.rrd", work / "layout.rbl"
    rerun = rerun_binary()
    subprocess.run([rerun, "mcap", "convert", "--application-id", APP_ID, "--timeline-type", "duration",
                    str(mcap), "-o", str(rrd)], check=True, capture_output=True)
    blueprint(info, rbl)
    cmd = [rerun, str(rrd), str(rbl)]
    if args.screenshot is None:
        return subprocess.run(cmd, check=False).returncode
    cmd += ["--screenshot-to", str(args.screenshot.resolve()), "--window-size", args.size]
    if not os.environ.get("DISPLAY") and shutil.which("xvfb-run"):  # no screen: a virtual one
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 3840x2160x24", *cmd]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    shutil.rmtree(work, ignore_errors=True)
    print(args.screenshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
