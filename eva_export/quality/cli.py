"""``eva-export check DIR [--json] [--write [--sidecar]]``: the quality rules on a dataset's files.

DIR is a LeRobot v2.1, v3.0 or v2.0 dataset (its kind from meta/info.json, read through the
source seam). Exit codes: 0 no episode red; 1 at least one episode red; 2 the dataset could not
be read (or written). ``--write`` stores the verdicts: in the rows of a v2.1 dataset (merged
with capture's own flags, through the single writer) or, with ``--sidecar``, in
meta/eva_quality.jsonl only. A v3.0 or v2.0 source is not ours: ``--write`` puts its verdicts
in the sidecar, with or without ``--sidecar``, and its own files stay byte-identical.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EvaError

if TYPE_CHECKING:  # the rules' modules load when `check` runs, not with every command's parser
    from .offline import DatasetCheck, EpisodeCheck


def _ranges(issue: dict[str, Any]) -> str:
    r = issue.get("ranges") or []
    return (" frames " + ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in r[:4])
            + ("..." if len(r) > 4 else "")) if r else ""


def episode_lines(ep: EpisodeCheck, stored: str = "") -> list[str]:
    """``stored``: the quality the row already carries (capture's), shown when it differs."""
    head = f"episode {ep.episode_index:>4}: {ep.quality}"
    if stored and stored != ep.quality:
        head += f" (the row says {stored}: its flags are kept by --write)"
    lines = [head]
    for i in ep.issues:
        d = i.to_dict()
        lines.append(f"    {i.severity:<7} {i.code:<26} {i.detail}{_ranges(d)}")
    return lines


def to_json(check: DatasetCheck) -> dict[str, object]:
    from .rules import RULE_VERSION  # the rules load with the check that runs them, not with every command

    return {"root": str(check.root), "source_kind": str(check.kind), "rule_version": RULE_VERSION,
            "red": sum(e.quality == "red" for e in check.episodes),
            "green": sum(e.quality == "green" for e in check.episodes),
            "episodes": [{"episode_index": e.episode_index, "quality": e.quality,
                          "quality_issues": [i.to_dict() for i in e.issues],
                          "stream_stats": e.stream_stats} for e in check.episodes]}


def _check(args: argparse.Namespace) -> int:
    from .rules import RULE_VERSION
    from .store import write_rows, write_sidecar

    root = Path(args.dir)
    try:
        from .offline import check_dataset

        check = check_dataset(root)
        written = ""
        if args.write:
            written = (f"sidecar {write_sidecar(check)}" if args.sidecar or not check.owned
                       else f"{write_rows(check)} rows of {root / 'meta/episodes.jsonl'}")
    except (EvaError, OSError, ValueError) as exc:
        print(f"eva-export: check refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(check), indent=2))
    else:
        for ep in check.episodes:
            row = check.rows.get(ep.episode_index)
            print("\n".join(episode_lines(ep, row.quality.strip().lower() if row is not None else "")))
        red = sum(e.quality == "red" for e in check.episodes)
        print(f"{root} ({check.kind}): {red} red, {len(check.episodes) - red} green (rules version {RULE_VERSION})"
              + (f"; wrote {written}" if written else ""))
    return 1 if any(e.quality == "red" for e in check.episodes) else 0


def add_check_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="run the quality rules on a dataset's files (live capture's rules)")
    p.add_argument("dir", help="a LeRobot v2.1, v3.0 or v2.0 dataset directory")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--write", action="store_true",
                   help="store the verdicts in the rows of a v2.1 dataset (merged with capture's flags, via the "
                        "single writer); a v3.0 / v2.0 source's go to meta/eva_quality.jsonl")
    p.add_argument("--sidecar", action="store_true",
                   help="with --write: store them in meta/eva_quality.jsonl instead, leaving the rows alone")
    p.set_defaults(func=_check)
