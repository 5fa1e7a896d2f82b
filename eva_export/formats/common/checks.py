"""Verification steps every format's verifier runs: the report, info.json and quality marker,
totals, and the record of one real read (state, action, frame)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...fsutil import iter_jsonl, read_json
from ...jsonbound import as_int
from .card import check_card
from .exporter import VerifyReport
from .meta import EPISODES, INFO, TASKS
from .records import FORMAT_V21, QUALITY_SPLIT_FILE, EpisodeRow, QualitySplit, TaskRow
from .video import image_row_problem


def start_report(out_dir: Path, dataset_format: str, *, embedded_images: bool = False,
                 ) -> tuple[VerifyReport, dict[str, Any] | None]:
    """Open a report; check info.json and quality_split.json exist and name ``dataset_format``
    (a format with ``embedded_images`` must say so in info.json and list no videos)."""
    out_dir = Path(out_dir)
    report = VerifyReport(path=str(out_dir), dataset_format=dataset_format)
    info: dict[str, Any] | None = None
    try:
        info = read_json(out_dir / INFO)
        if not isinstance(info, dict) or not isinstance(info.get("features", {}), dict):
            raise ValueError("not a JSON object with a features object")
        as_int(info.get("total_episodes", 0), "total_episodes")
        as_int(info.get("total_frames", 0), "total_frames")
    except (OSError, ValueError) as exc:
        report.errors.append(f"{INFO}: unreadable ({exc})")
        info = None
    try:
        qs = QualitySplit.read(out_dir)
        if qs.dataset_format != dataset_format:
            report.errors.append(f"{QUALITY_SPLIT_FILE}: dataset_format {qs.dataset_format!r}, "
                                 f"expected {dataset_format!r}")
        else:
            report.checks.append(f"quality_split.json: subset {qs.subset}, dataset_format {qs.dataset_format}, "
                                 f"{len(qs.source_episode_indices)} source episodes")
        if info is not None and qs.episode_count and qs.episode_count != info.get("total_episodes"):
            report.errors.append(f"{QUALITY_SPLIT_FILE}: episode_count {qs.episode_count} but info.json "
                                 f"total_episodes {info.get('total_episodes')}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        report.errors.append(f"{QUALITY_SPLIT_FILE}: missing or unreadable ({exc})")
    check_card(report, out_dir)  # README.md: present and exactly what the records render to
    if info is not None:
        fmt = str(info.get("dataset_format", FORMAT_V21))
        if fmt != dataset_format:
            report.errors.append(f"{INFO}: dataset_format {fmt!r}, expected {dataset_format!r}")
        report.episodes = int(info.get("total_episodes", 0))
        report.frames = int(info.get("total_frames", 0))
        if embedded_images and (
                not info.get("embedded_images") or info.get("total_videos") != 0 or "video_path" in info):
            report.errors.append("info.json must have embedded_images true, total_videos 0 and no video_path")
    return report, info

def read_episode_rows(out_dir: Path, report: VerifyReport) -> list[EpisodeRow]:
    """episodes.jsonl, with its tasks checked against tasks.jsonl."""
    try:
        rows = [EpisodeRow.from_dict(d) for d in iter_jsonl(Path(out_dir) / EPISODES)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        report.errors.append(f"{EPISODES}: unreadable ({exc})")
        return []
    check_tasks(report, Path(out_dir), rows)
    return rows


def check_tasks(report: VerifyReport, out_dir: Path, rows: list[EpisodeRow]) -> None:
    """tasks.jsonl maps indices and strings one to one and holds every episode's task: with an
    index listed twice a reader gives an episode the other task."""
    if not (out_dir / TASKS).is_file():
        return
    try:
        tasks = [TaskRow.from_dict(d) for d in iter_jsonl(out_dir / TASKS)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        report.errors.append(f"{TASKS}: unreadable ({exc})")
        return
    idx, texts = [t.task_index for t in tasks], [t.task for t in tasks]
    if len(set(idx)) != len(idx) or len(set(texts)) != len(texts):
        report.errors.append(f"{TASKS}: task_index values {idx[:10]} and tasks {texts[:10]} are not one to one")
        return
    unknown = sorted({t for r in rows for t in r.tasks if t not in texts})
    if unknown:
        report.errors.append(f"{TASKS}: episodes name tasks it does not hold: {unknown[:5]}")
    else:
        report.checks.append(f"{TASKS}: {len(tasks)} task(s), indices and strings one to one")

def check_totals(report: VerifyReport, info: dict[str, Any], episodes: int, frames: int, what: str) -> None:
    if info.get("total_episodes") != episodes or info.get("total_frames") != frames:
        report.errors.append(f"info.json claims {info.get('total_episodes')} episodes / {info.get('total_frames')} "
                             f"frames, {what} holds {episodes} / {frames}")
    else:
        report.checks.append(f"info.json totals match {what}: {episodes} episodes, {frames} frames")

def check_sample(report: VerifyReport, state: Any, action: Any, frame: Any, where: str,
                 empty: bool = False) -> None:
    """Record the real read of one state value, one action value and one image frame.

    ``empty``: the subset physically holds no episode (every episode landed on the other side
    of the split). That is a valid output when info.json says 0 episodes and 0 frames; there
    is nothing to read, and check_totals has already compared the claim with the files.
    """
    if empty:
        if report.episodes == 0 and report.frames == 0:
            report.checks.append(f"empty subset: 0 episodes, 0 frames; nothing to read in {where}")
        else:
            report.errors.append(f"real read: no episode to read in {where}, but info.json claims "
                                 f"{report.episodes} episodes / {report.frames} frames")
        return
    parts = []
    errors_before = len(report.errors)
    if state is None:
        report.errors.append(f"real read: no state value in {where}")
    else:
        parts.append(f"state[0]={np.asarray(state).reshape(-1)[:1].tolist()}")
    if action is None:
        report.errors.append(f"real read: no action value in {where}")
    else:
        parts.append(f"action[0]={np.asarray(action).reshape(-1)[:1].tolist()}")
    if frame is None:
        report.errors.append(f"real read: no image frame in {where}")
    else:
        arr = np.asarray(frame)
        if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
            report.errors.append(f"real read: image frame in {where} has shape {arr.shape} {arr.dtype}")
        else:
            parts.append(f"frame {arr.shape[1]}x{arr.shape[0]} rgb mean={float(arr.mean()):.1f}")
    if len(report.errors) == errors_before:
        report.checks.append(f"real read from {where}: " + ", ".join(parts))


def check_image_rows(report: VerifyReport, table: pa.Table, shapes: dict[str, tuple[int, ...]], where: str,
                     episode: int | None = None) -> None:
    """Every embedded image of ``table`` decodes to its feature's shape; one error per camera."""
    epi = table.column("episode_index").to_pylist() if "episode_index" in table.column_names else None
    for key, shape in shapes.items():
        if key not in table.column_names:
            report.errors.append(f"{where}: no {key!r} column")
            continue
        for i, value in enumerate(table.column(key).to_pylist()):
            why = image_row_problem(value, shape)
            if why:
                ep = episode if episode is not None else (epi[i] if epi else "?")
                report.errors.append(f"{where}: episode {ep} row {i}: {key} {why}")
                break
