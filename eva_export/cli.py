"""The ``eva-export`` command: export, list jobs, verify an export (and upload, when installed).

Exit codes: 0 success; 1 the export failed or verification found errors; 2 the request was
refused (bad config, unknown format, source outside the data roots, already running).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from .config import FORMATS, load_config
from .errors import EvaError
from .jobs import COMPLETED, JobStore


def _export(args: argparse.Namespace) -> int:
    from .export.runner import ExportService

    try:
        config = load_config(args.config)
        svc = ExportService(config, background=False, recover=False)
        job = svc.run(args.source, args.fmt)
    except EvaError as exc:
        print(f"eva-export: refused: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(job.to_dict(), indent=2))
    if job.state != COMPLETED:
        print(f"eva-export: export failed: {job.error}", file=sys.stderr)
        return 1
    return 0


def _jobs(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except EvaError as exc:
        print(f"eva-export: {exc}", file=sys.stderr)
        return 2
    print(json.dumps([j.to_dict() for j in JobStore(config.export.jobs_dir).all()], indent=2))
    return 0


def _verify_one(path: Path) -> tuple[bool, list[str]]:
    """verify_export from eva_export.formats.verify when present; else the native check."""
    lines: list[str] = []
    try:
        verify_mod: Any = importlib.import_module("eva_export.formats.verify")
    except ImportError:
        verify_mod = None
    if verify_mod is not None:
        rep = verify_mod.verify_export(path)
        lines += [f"ok    {c}" for c in rep.checks] + [f"FAIL  {e}" for e in rep.errors]
        return rep.ok, lines
    from .export.records import QualitySplit
    from .export.validate import verify_native

    try:
        fmt = QualitySplit.read(path).dataset_format
    except (OSError, ValueError, TypeError) as exc:
        return False, [f"FAIL  {path}/meta/quality_split.json unreadable: {exc}"]
    if fmt != "lerobot_v21":
        return False, [f"FAIL  {path}: cannot verify {fmt}: eva_export.formats.verify is not installed"]
    rep = verify_native(path)
    lines += [f"ok    {c}" for c in rep.checks] + [f"FAIL  {e}" for e in rep.errors]
    return rep.ok, lines


def _verify(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    targets = [root / "accepted", root / "rejected"] if (root / "accepted").is_dir() else [root]
    ok = True
    for t in targets:
        try:
            good, lines = _verify_one(t)
        except EvaError as exc:
            good, lines = False, [f"FAIL  {exc}"]
        print(f"{t}: {'OK' if good else 'FAILED'}")
        for line in lines:
            print(f"  {line}")
        ok = ok and good
    return 0 if ok else 1


def _report(args: argparse.Namespace) -> int:
    from .console.report import write_report

    src = Path(args.dir).absolute()
    # beside the dataset, never inside it (a raw dataset's files are the capture node's)
    out = Path(args.output) if args.output else src.parent / f"{src.name}_report.html"
    try:
        print(write_report(Path(args.dir), out))
    except (EvaError, OSError) as exc:
        print(f"eva-export: report: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eva-export", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="quality-split and export a raw v2.1 dataset (synchronous)")
    p.add_argument("--config", required=True, help="the eva_export YAML config")
    p.add_argument("--source", required=True, help="the raw v2.1 dataset directory")
    p.add_argument("--format", required=True, dest="fmt", choices=FORMATS)
    p.set_defaults(func=_export)
    p = sub.add_parser("jobs", help="list recorded export jobs as JSON")
    p.add_argument("--config", required=True)
    p.set_defaults(func=_jobs)
    p = sub.add_parser("verify", help="verify an exported subset (or a <format> dir holding the pair)")
    p.add_argument("dir")
    p.set_defaults(func=_verify)
    p = sub.add_parser("report", help="write a raw dataset's health report as one static HTML file")
    p.add_argument("dir", help="the raw v2.1 dataset directory")
    p.add_argument("-o", "--output", help="the HTML file (default: DIR_report.html beside DIR)")
    p.set_defaults(func=_report)
    try:
        upload_cli: Any = importlib.import_module("eva_export.upload.cli")
    except ImportError:
        upload_cli = None
    if upload_cli is not None and hasattr(upload_cli, "add_upload_commands"):
        upload_cli.add_upload_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
