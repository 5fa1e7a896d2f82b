"""The ``eva-export`` command: export, list jobs, verify an export (and upload, when installed).

Exit codes: 0 success; 1 the export failed or verification found errors; 2 the request was
refused (bad config, unknown format, source outside the data roots, already running).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn

# Before numpy loads: the command does no BLAS work, and OpenBLAS's idle pool threads spinning on
# every core cost a 600-episode export ~0.15 CPU s (measured). A caller's own setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .config import Config, load_config, parse_config  # noqa: E402
from .errors import EvaError
from .formats.common.records import REVIEW_VERDICTS, Subset
from .formats.registry import FORMATS
from .formats.registry import SPECS as FORMAT_SPECS
from .jobs import COMPLETED, STALL_AFTER_S, JobStore, state_text
from .quality.cli import add_check_command
from .upload.cli import add_upload_commands  # no paramiko until an upload runs


def standalone_config(source: str, *more: str) -> Config:
    """Defaults for ``export SRC`` without --config: the source's parent is the data root (and
    holds the job records in .jobs/); nothing else of a config matters to an export. Several
    sources: the directory holding all their datasets (a ``raw`` source's dataset is its parent)."""
    parent = Path(os.path.realpath(os.path.abspath(source))).parent
    if more:
        homes = [Path(os.path.realpath(os.path.abspath(s))) for s in (source, *more)]
        parent = Path(os.path.commonpath([(h.parent if h.name == "raw" else h).parent for h in homes]))
    return parse_config({"collection": {"log_dir": str(parent)}})


def with_workers(config: Config, workers: int | None) -> Config:
    """The config with export.workers from --workers (None: keep the config's)."""
    import dataclasses

    if workers is None:
        return config
    if workers < 0:
        raise EvaError(f"--workers must be >= 0 (0: one per core), got {workers}")
    return dataclasses.replace(config, export=dataclasses.replace(config.export, workers=workers))


def _batch(args: argparse.Namespace) -> int:
    from .export.batch import main_batch

    return main_batch(args)


def _export(args: argparse.Namespace) -> int:
    from .export.runner import ExportService

    sources = list(args.source) + ([args.source_opt] if args.source_opt else [])
    if not sources:
        print("eva-export: export needs the source directory (eva-export export SRC [SRC ...] --format F)",
              file=sys.stderr)
        return 2
    source = sources[0] if len(sources) == 1 else " ".join(sources)
    try:
        config = with_workers(load_config(args.config) if args.config else standalone_config(*sources),
                              args.workers)
        svc = ExportService(config, background=False, recover=False)
        job = svc.run(sources, args.fmt, args.name or "")
    except EvaError as exc:
        print(f"eva-export: refused: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(job.to_dict(), indent=2))
    if job.unrated_episodes:
        total = job.accepted_episodes + job.rejected_episodes
        print(f"eva-export: warning: {job.unrated_episodes} of {total} episodes have no quality field and no "
              "verdict, so the rule put them in rejected. To accept them, rate them and export again: "
              f"eva-export review {source} --episodes all --verdict pass", file=sys.stderr)
    if job.reencoded_episodes:
        print(f"eva-export: note: {job.reencoded_episodes} episode(s) of the v3.0 source could not be cut out of "
              "their shared MP4 by stream copy (no keyframe at the episode start) and were re-encoded; their rows "
              "say which camera (source_video_reencoded)", file=sys.stderr)
    if job.state != COMPLETED:
        print(f"eva-export: export failed: {job.error}", file=sys.stderr)
        return 1
    return 0


def parse_episodes(text: str) -> list[int] | None:
    """'0,2,5-7' -> [0, 2, 5, 6, 7]; 'all' -> None (every episode)."""
    if text.strip().lower() == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"episodes {text!r}: use indices and ranges like 0,2,5-7, or all")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"episodes {text!r}: range {part} runs backwards")
        out.extend(range(a, b + 1))
    if not out:
        raise ValueError("no episodes given")
    return sorted(set(out))


def _review(args: argparse.Namespace) -> int:
    """Rate episodes of a v2.1 dataset through the capture node's single writer (no ROS); of
    a v3.0 / v2.0 source (not ours) in its sidecar, leaving its own files byte-identical."""
    from .formats.common import sidecar
    from .formats.common.meta import read_info
    from .formats.lerobot_v21.writer import DatasetWriter
    from .formats.sources import open_source

    root = Path(args.dir)
    try:
        wanted = parse_episodes(args.episodes)
        if args.take_id and (wanted is None or len(wanted) != 1):
            raise ValueError("--take-id names one take: give its one index in --episodes")
        source = open_source(root)
        if not source.owned and args.take_id:
            raise ValueError(f"{root}: not a dataset capture wrote, its episodes have no take ids")
        if not source.owned:
            listed = source.episode_indices(root)
            chosen = listed if wanted is None else wanted
            missing = sorted(set(chosen) - set(listed))
            if missing:  # check all before writing any: a typo rates nothing
                raise ValueError(f"{root}: no episode(s) {missing}; the dataset has {listed}")
            sidecar.append_review(root, chosen, args.verdict, args.note)
            print(f"{root}: {len(chosen)} episode(s) set to verdict {args.verdict} in {sidecar.SIDECAR}")
            return 0
        writer = DatasetWriter(root, read_info(root))
        indices = [e.episode_index for e in writer.episodes] if wanted is None else wanted
        known = {e.episode_index for e in writer.episodes}
        unknown = [i for i in indices if i not in known]
        if unknown and not args.take_id:  # check all before writing any: a typo rates nothing
            lost = "; ".join(f"episode {i} {why}" for i in unknown if (why := writer.promises.absent_reason(i)))
            raise ValueError(f"{root}: no episode(s) {unknown}; the dataset has {sorted(known)}"
                             + (f" ({lost})" if lost else ""))
        for i in indices:
            writer.review(i, args.verdict, args.note, args.take_id)
    except (EvaError, ValueError, OSError) as exc:
        print(f"eva-export: review refused: {exc}", file=sys.stderr)
        return 2
    print(f"{root}: {len(indices)} episode(s) set to verdict {args.verdict}"
          + (f" with note {args.note!r}" if args.note is not None else ""))
    return 0


def _clean(args: argparse.Namespace) -> int:
    from .export.clean import clean, parse_age

    try:
        age = parse_age(args.older_than)
        if args.dirs:
            roots = [Path(d) for d in args.dirs]
            config = load_config(args.config) if args.config else None
        else:
            config = load_config(args.config)
            roots = list(config.export.data_roots)
        jobs = [config.export.jobs_dir] if config else [r / ".jobs" / "export" for r in roots]
        rep = clean(roots, jobs, age)
    except EvaError as exc:
        print(f"eva-export: clean refused: {exc}", file=sys.stderr)
        return 2
    for line in rep.restored:
        print(f"restored  {line}")
    for line in rep.removed:
        print(f"removed   {line}")
    for line in rep.skipped:
        print(f"skipped   {line}")
    print(f"freed {rep.freed_bytes} bytes of staging")
    return 0


def _jobs(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except EvaError as exc:
        print(f"eva-export: {exc}", file=sys.stderr)
        return 2
    # "status": the state as a reader should see it ("stalled: ..." for a running job whose
    # process stopped recording it); the record's own "state" is left as written
    print(json.dumps([{**j.to_dict(), "status": state_text(j, args.stalled_after)}
                      for j in JobStore(config.export.jobs_dir).all()], indent=2))
    return 0


def _verify_one(path: Path) -> tuple[bool, list[str]]:
    from .formats.verify import verify_export  # h5py, mcap, PyAV: imported only to verify

    rep = verify_export(path)
    return rep.ok, [f"ok    {c}" for c in rep.checks] + [f"FAIL  {e}" for e in rep.errors]


def _verify(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    targets = [root / s for s in Subset] if (root / Subset.ACCEPTED).is_dir() else [root]
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


def _ingest(args: argparse.Namespace) -> int:
    from .capture.ingest import BagIngest

    try:
        cfg = load_config(args.config)
        ing = BagIngest(cfg.collection, args.bag, args.dataset, args.task or "", args.episodes or "")
    except (EvaError, OSError) as exc:
        print(f"eva-export: ingest refused: {exc}", file=sys.stderr)
        return 2
    try:
        res = ing.run()
    except (EvaError, OSError) as exc:
        print(f"eva-export: ingest failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"message": res.message, "dataset_dir": str(cfg.collection.dataset_dir(ing.dataset_name)),
                      "episodes": res.episodes, "messages": res.messages_done, "bytes": res.bytes_done,
                      "damage": res.damage}, indent=2))
    return 0


def _review_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="the dataset directory (v2.1: its rows; v3.0 / v2.0: the meta/ sidecar)")
    p.add_argument("--episodes", required=True, help="indices and ranges (0,2,5-7) or all")
    p.add_argument("--verdict", required=True, choices=[v for v in REVIEW_VERDICTS if v])
    p.add_argument("--note", default=None, help="replace the episode note")
    p.add_argument("--take-id", default="", help="the take id STOP returned: rate the one index given only if it "
                                                 "holds that take (a lost take's index may hold a later one)")
    p.set_defaults(func=_review)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eva-export", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="quality-split and export a raw dataset: LeRobot v2.1, v3.0 or v2.0 (synchronous)")
    p.add_argument("source", nargs="*", help="the raw dataset directory (LeRobot v2.1, v3.0 or v2.0); several are "
                   "merged into one accepted/rejected pair (--name required)")
    p.add_argument("--source", dest="source_opt", help="the same, as an option")
    p.add_argument("--name", help="the merged set's name: its pair goes to <data root>/NAME/export/<format>")
    p.add_argument("--config", help="the eva_export YAML config (default: data root = the source's parent)")
    p.add_argument("--format", required=True, dest="fmt", choices=FORMATS,
                   help="; ".join(f"{s.name}: {s.description}" for s in FORMAT_SPECS))
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes for episode units (default: export.workers; 0 = one per core, 1 = serial)")
    p.set_defaults(func=_export)
    p = sub.add_parser("batch", help="export every raw dataset under ROOT (local worker pool, or Ray with --ray)")
    p.add_argument("root", help="a directory holding raw v2.1 datasets (a fleet's day); searched recursively")
    p.add_argument("--format", required=True, dest="fmt", choices=FORMATS)
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: one per core); with --ray: units in flight")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run the episode units as Ray tasks: 'auto' joins the running cluster, 'local' starts "
                        "one on this machine, or a cluster address (needs pip install .[ray])")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument("--merge", action="store_true",
                   help="one merged set per task (datasets grouped by their tasks), ROOT/merged_<task>/export/<format>")
    p.set_defaults(func=_batch)
    _review_parser(sub.add_parser("review", help="set or clear the operator verdict of episodes (no ROS needed)"))
    p = sub.add_parser("clean", help="remove old staging, publication backups and finished job records")
    p.add_argument("dirs", nargs="*", help="data roots (default: the config's export.data_roots)")
    p.add_argument("--older-than", default="7d", help="age, e.g. 12h, 7d (default 7d); 0 removes all")
    p.add_argument("--config", help="the eva_export YAML config")
    p.set_defaults(func=_clean)
    p = sub.add_parser("jobs", help="list recorded export jobs as JSON")
    p.add_argument("--config", required=True)
    p.add_argument("--stalled-after", type=float, default=STALL_AFTER_S, metavar="SECONDS",
                   help=f"show a running job with no heartbeat this long as stalled ({STALL_AFTER_S:.0f})")
    p.set_defaults(func=_jobs)
    p = sub.add_parser("verify", help="verify an exported subset (or a <format> dir holding the pair)")
    p.add_argument("dir")
    p.set_defaults(func=_verify)
    p = sub.add_parser("ingest", help="turn a rosbag2 (MCAP) recording into raw v2.1 episodes (no ROS needed)")
    p.add_argument("bag", help="a rosbag2 directory (metadata.yaml + *.mcap) or one .mcap file")
    p.add_argument("--config", required=True, help="the eva_export YAML config (collection.streams maps topics)")
    p.add_argument("--dataset", required=True, help="the raw dataset to create or append to")
    p.add_argument("--task", default="", help="task of the episodes (default: the dataset's configured task)")
    p.add_argument("--episodes", default="", help="'' one per bag; 'ranges:T0-T1,...' seconds from the "
                                                  "bag's first message; 'marker' cut on the marker topic")
    p.set_defaults(func=_ingest)
    p = sub.add_parser("report", help="write a raw dataset's health report as one static HTML file")
    p.add_argument("dir", help="the raw dataset directory (LeRobot v2.1, v3.0 or v2.0)")
    p.add_argument("-o", "--output", help="the HTML file (default: DIR_report.html beside DIR)")
    p.set_defaults(func=_report)
    add_check_command(sub)
    add_upload_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args))



def _end_threads() -> None:
    """What the interpreter's exit does for threads, in its order: the threading exit hooks
    first (a ThreadPoolExecutor's tell its idle workers to end: a pool kept for the process,
    as the mcap writer's compression pool is, never ends otherwise), then every non-daemon
    thread joined."""
    shutdown = getattr(threading, "_shutdown", None)  # CPython's own step of the exit
    if callable(shutdown):
        shutdown()
        return
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()


def run() -> NoReturn:
    """The ``eva-export`` command: ``main``, then the interpreter's own exit minus its teardown.

    Everything an exit does for the program's sake is done here in its order (non-daemon threads
    joined, atexit handlers: logging, worker pools, temporary files; the standard streams
    flushed); what is skipped is freeing every module and library (PyArrow's and FFmpeg's
    pools among them), 40 ms of a half-second export that no one waits for the results of."""
    code = 1
    try:
        code = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    finally:
        _end_threads()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
