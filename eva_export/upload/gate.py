"""The upload gate: only the current accepted export of a source and format is uploaded.

``check_upload`` returns the accepted directory's quality marker when every check holds
and raises UploadRefused naming the failed check otherwise. No job is created and no
thread starts on a refusal.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from ..config import check_name
from ..errors import UnsafeNameError, UploadRefused
from ..export.records import ACCEPTED, QUALITY_SPLIT_FILE, QualitySplit
from ..formats.registry import UnknownFormatError, get_spec
from ..jobs import COMPLETED, Job, JobKind, JobStore


def _resolved(path: str | Path) -> str:
    return str(Path(path).expanduser().resolve())


def _export_of(export_jobs: JobStore, directory: str) -> tuple[Job, str] | None:
    """The newest completed export whose accepted or rejected dir is ``directory``."""
    found = None
    for job in export_jobs.all():
        if job.kind != JobKind.EXPORT or job.state != COMPLETED:
            continue
        for subset, d in (("accepted", job.accepted_dir), ("rejected", job.rejected_dir)):
            if d and _resolved(d) == directory:
                found = (job, subset)
    return found


def _refuse_foreign(other: tuple[Job, str] | None, accepted_dir: str, fmt: str, source: str,
                    hint: str) -> None:
    """Refuse a directory that some other export (another format or source) produced."""
    if other is None:
        return
    job = other[0]
    if job.format != fmt:
        raise UploadRefused(f"{accepted_dir} was exported as {job.format}, not {fmt} (a {job.format} "
                            f"directory is never uploaded as {fmt}); {hint}")
    if _resolved(job.source_dir) != source:
        raise UploadRefused(f"{accepted_dir} was exported from {job.source_dir}, not from the current "
                            f"source {source}; {hint}")


def _check_latest(export_jobs: JobStore, source: str, target: str, accepted_dir: str, fmt: str) -> None:
    """``target`` is the accepted directory of the latest completed ``fmt`` export of ``source``."""
    latest = export_jobs.latest_completed(JobKind.EXPORT, source, fmt)
    if latest is None:
        _refuse_foreign(_export_of(export_jobs, target), accepted_dir, fmt, source,
                        f"export {source} as {fmt} first")
        raise UploadRefused(
            f"{source} has never been exported as {fmt} (no completed export job): export it first"
        )
    if not latest.accepted_dir or _resolved(latest.accepted_dir) != target:
        if latest.rejected_dir and _resolved(latest.rejected_dir) == target:
            raise UploadRefused(
                f"{accepted_dir} is the rejected subset of export {latest.job_id}; only the accepted "
                f"directory ({latest.accepted_dir}) is uploaded"
            )
        other = _export_of(export_jobs, target)
        _refuse_foreign(other, accepted_dir, fmt, source,
                        f"the current {fmt} accepted directory is {latest.accepted_dir}")
        if other is not None and other[1] == "rejected":
            raise UploadRefused(
                f"{accepted_dir} is a rejected subset; only accepted directories are uploaded"
            )
        raise UploadRefused(
            f"{accepted_dir} is not the accepted directory of the latest completed {fmt} export of "
            f"{source} (job {latest.job_id}: {latest.accepted_dir}); export again or upload that one"
        )


def _read_marker(target: str, source: str, fmt: str) -> QualitySplit:
    """The quality marker of ``target``: an accepted, non-empty split of this source and format."""
    marker_path = Path(target) / QUALITY_SPLIT_FILE
    try:
        marker = QualitySplit.read(Path(target))
    except (OSError, ValueError, TypeError) as exc:
        raise UploadRefused(
            f"cannot read {marker_path}: {exc}; the directory is not a finished export"
        ) from exc
    if marker.subset != ACCEPTED:
        raise UploadRefused(
            f"{marker_path} says subset {marker.subset!r}: a rejected directory is never uploaded"
        )
    if marker.dataset_format != fmt:
        raise UploadRefused(
            f"{marker_path} says dataset_format {marker.dataset_format!r}, not {fmt!r}: "
            f"an older or other-format export is never uploaded; export as {fmt} again"
        )
    if _resolved(marker.source_dir) != source:
        raise UploadRefused(
            f"{marker_path} says source_dir {marker.source_dir!r}, which is not the current source "
            f"{source}: export this source again"
        )
    if not marker.source_episode_indices:  # the split put every episode in rejected
        unrated = f"; {marker.unrated_count} episode(s) have no quality field and no verdict (rate them with " \
                  "eva-export review, then export again)" if marker.unrated_count else ""
        raise UploadRefused(
            f"{marker_path} says the accepted subset is empty (0 of "
            f"{marker.accepted_count + marker.rejected_count} episodes accepted): nothing to upload{unrated}"
        )
    return marker


def check_upload(
    request_source_dir: str,
    fmt: str,
    accepted_dir: str,
    export_jobs: JobStore,
    backend: object | None,
    running: Collection[str],
) -> QualitySplit:
    """Refuse (UploadRefused) unless ``accepted_dir`` is the current accepted export.

    Args:
        request_source_dir: the raw source directory the operator has selected.
        fmt: the format selected now.
        accepted_dir: the directory to upload.
        export_jobs: the export service's job store.
        backend: the upload backend (configured or injected), None when there is none.
        running: resolved directories that have an upload running now.

    Returns:
        The accepted directory's meta/quality_split.json.
    """
    if not request_source_dir or not fmt or not accepted_dir:
        raise UploadRefused("source_dir, format and accepted_dir are all required")
    try:
        get_spec(fmt)  # the registry's own "unknown export format" message
    except UnknownFormatError as exc:
        raise UploadRefused(str(exc)) from None
    if backend is None:
        raise UploadRefused("no upload backend is configured (no backend section under collection.storage, "
                            "e.g. collection.storage.sftp); nothing was started")
    source = _resolved(request_source_dir)
    target = _resolved(accepted_dir)

    _check_latest(export_jobs, source, target, accepted_dir, fmt)
    marker = _read_marker(target, source, fmt)
    if target in running:
        raise UploadRefused(f"an upload of {target} is already running; wait for it to finish")
    return marker


def publish_name(source_dir: str, fmt: str) -> str:
    """``<dataset-name>_<format>_accepted``; the dataset name is the parent of a ``raw`` source."""
    src = Path(_resolved(source_dir))
    dataset = src.parent.name if src.name == "raw" else src.name
    try:
        check_name(dataset, "dataset name")
    except UnsafeNameError as exc:
        raise UploadRefused(f"cannot name the upload of {src}: {exc}") from exc
    return f"{dataset}_{fmt}_accepted"
