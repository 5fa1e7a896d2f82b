"""The files of a rosbag2 MCAP bag: found through metadata.yaml (or the directory), each
confined to the ingest roots after resolving symlinks, each checked to be a ROS 2 MCAP file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mcap.exceptions import McapError
from mcap.reader import make_reader
from mcap.records import Header
from mcap.stream_reader import StreamReader

from ... import confine
from ...errors import EvaError

MCAP_MAGIC = b"\x89MCAP0\r\n"
ROS2_PROFILE = "ros2"


class IngestError(EvaError):
    """A bag that cannot be ingested (wrong storage, not a ROS 2 bag, missing topic ...)."""


# ---- the bag -----------------------------------------------------------------------------------
@dataclass
class BagFiles:
    path: Path
    files: list[Path]
    metadata: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files)


_DB3_HELP = ("convert it to MCAP first: `ros2 bag convert -i {p} -o out.yaml` with out.yaml holding "
             "`output_bags: [{{uri: {p}_mcap, storage_id: mcap}}]` (or record with `ros2 bag record -s mcap`, "
             "the default since ROS 2 Iron)")


def _confined_file(f: Path, roots: list[Path], where: Path) -> Path:
    """``f`` itself, once its resolved target (symlinks followed) lies inside one of ``roots``."""
    if not any(confine.is_inside(r, f) for r in roots):
        raise IngestError(f"{where}: bag file {f} resolves to {os.path.realpath(f)}, outside the ingest roots "
                          f"{[str(r) for r in roots]}; refused")
    return f


def _listed_files(p: Path, mfile: Path, meta: dict[str, Any]) -> list[Path]:
    """metadata.yaml's relative_file_paths: relative names inside the bag directory only."""
    rel = meta.get("relative_file_paths") or []
    if not isinstance(rel, list):
        raise IngestError(f"{mfile}: relative_file_paths is not a list")
    for r in map(str, rel):
        if os.path.isabs(r) or ".." in Path(r).parts or "\x00" in r:
            raise IngestError(f"{mfile}: relative_file_paths entry {confine.short_repr(r, 80)} is absolute or has "
                              f"'..'; a bag names only files inside its own directory")
    return [p / r for r in map(str, rel) if (p / r).is_file()]


def open_bag(path: Path | str, roots: list[Path] | None = None) -> BagFiles:
    """The MCAP files of a rosbag2 directory (metadata.yaml order) or one .mcap file, checked.

    Every file must resolve (after symlinks) inside ``roots`` (default: the bag's own directory).
    """
    p = Path(path)
    if not p.exists():
        raise IngestError(f"bag {p} does not exist")
    meta: dict[str, Any] | None = None
    if p.is_dir():
        mfile = p / "metadata.yaml"
        if mfile.is_file():
            try:
                raw = yaml.safe_load(mfile.read_text()) or {}
                meta = raw.get("rosbag2_bagfile_information") or {}
                if not isinstance(meta, dict):
                    raise AttributeError("rosbag2_bagfile_information is not a mapping")
            except (yaml.YAMLError, OSError, AttributeError, UnicodeDecodeError, RecursionError) as exc:
                raise IngestError(f"{mfile}: unreadable metadata.yaml ({exc})") from exc
            if str(meta.get("storage_identifier", "mcap")) == "sqlite3":
                raise IngestError(f"{p} is a sqlite3 (.db3) rosbag2 bag; " + _DB3_HELP.format(p=p))
            files = _listed_files(p, mfile, meta)
            if not files:
                files = sorted(p.glob("*.mcap"))
        else:
            files = sorted(p.glob("*.mcap"))
        if not files:
            if any(p.glob("*.db3")):
                raise IngestError(f"{p} holds a sqlite3 (.db3) rosbag2 bag; " + _DB3_HELP.format(p=p))
            raise IngestError(f"{p} holds no .mcap file (not a rosbag2 MCAP bag)")
    else:
        if p.suffix == ".db3":
            raise IngestError(f"{p} is a sqlite3 (.db3) rosbag2 file; " + _DB3_HELP.format(p=p.parent))
        files = [p]
    allowed = roots if roots is not None else [p if p.is_dir() else p.parent]
    for f in files:
        _check_ros2_mcap(_confined_file(f, allowed, p))
    return BagFiles(p, files, meta)


def _check_ros2_mcap(f: Path) -> None:
    with open(f, "rb") as fh:
        head = fh.read(len(MCAP_MAGIC))
        if head.startswith(b"SQLite f"):  # "SQLite format 3": a .db3 file under another name
            raise IngestError(f"{f} is a sqlite3 (.db3) bag; " + _DB3_HELP.format(p=f.parent))
        if head != MCAP_MAGIC:
            raise IngestError(f"{f} is not an MCAP file (not a rosbag2 MCAP bag)")
        fh.seek(0)
        try:
            header = next(StreamReader(fh).records)
        except (McapError, StopIteration, ValueError, EOFError) as exc:
            raise IngestError(f"{f}: unreadable MCAP header ({exc})") from exc
    if not isinstance(header, Header) or header.profile != ROS2_PROFILE:
        prof = header.profile if isinstance(header, Header) else "?"
        raise IngestError(f"{f} is not a ROS 2 bag (MCAP profile {prof!r}, expected {ROS2_PROFILE!r}); "
                          f"an eva-client MCAP export cannot be ingested, only `ros2 bag record` output")


def bag_channels(bag: BagFiles) -> dict[str, str] | None:
    """topic -> type name from the MCAP summaries (or metadata.yaml); None when unknown (damaged)."""
    out: dict[str, str] = {}
    try:
        for f in bag.files:
            with open(f, "rb") as fh:
                summary = make_reader(fh).get_summary()
            if summary is None:
                raise McapError("no summary")
            for ch in summary.channels.values():
                sch = summary.schemas.get(ch.schema_id)
                out[ch.topic] = sch.name if sch is not None else ""
        return out
    except (McapError, ValueError, EOFError, OSError, KeyError):
        pass
    if bag.metadata:
        for t in bag.metadata.get("topics_with_message_count") or []:
            md = (t or {}).get("topic_metadata") or {}
            if "name" in md:
                out[str(md["name"])] = str(md.get("type", ""))
        return out or None
    return None


