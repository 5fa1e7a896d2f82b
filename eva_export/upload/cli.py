"""``eva-export upload``: start an upload of the current accepted export from a shell.

Wire it in with ``add_upload_commands(subparsers)``; the parsed namespace carries
``func`` (``args.func(args) -> int`` exit code).

Exit codes: 0 completed (or started, without --wait), 1 the upload failed,
2 refused by the gate or a configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..config import load_config
from ..errors import ConfigError, UploadRefused
from ..formats.registry import help_text as format_help
from ..jobs import COMPLETED, Job


def add_upload_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``upload`` command to an argparse subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "upload",
        help="upload the current accepted export over SFTP",
        description=(
            "Upload the accepted directory of the latest completed export of SOURCE as FORMAT. "
            "The job is printed as JSON. Without --wait the job is printed as soon as it starts; "
            "the command still finishes the transfer before it exits (progress is in the job "
            "file under upload.jobs_dir)."
        ),
    )
    p.add_argument("--config", required=True, help="the eva_export YAML config")
    p.add_argument("--source", required=True, help="the raw source directory that was exported")
    p.add_argument("--format", required=True, dest="fmt", help=format_help())
    p.add_argument("--accepted", required=True, help="the export's accepted directory")
    p.add_argument("--wait", action="store_true", help="print the finished job instead of the started one")
    p.set_defaults(func=run_upload)
    return p


def _print_job(job: Job) -> None:
    print(json.dumps(job.to_dict(), indent=2), flush=True)


def run_upload(args: argparse.Namespace) -> int:
    """Run ``eva-export upload``; return the exit code."""
    from .runner import UploadService  # paramiko is imported only when uploading

    try:
        service = UploadService(load_config(args.config))
        job = service.start(args.source, args.fmt, args.accepted)
    except UploadRefused as exc:
        print(f"upload refused: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    if not args.wait:
        _print_job(job)
    final = service.wait(job.job_id)  # a CLI process cannot leave the transfer behind
    if args.wait and final is not None:
        _print_job(final)
    if final is None or final.state != COMPLETED:
        if not args.wait and final is not None:
            print(f"upload failed: {final.error}", file=sys.stderr)
        return 1
    return 0
