"""The staged pair verified before publication, its two subsets at once where a worker is up.

Every export job runs the format's verifier (``eva-export verify``) on both staged subsets and
publishes nothing when it finds anything. A large job's worker process (eva_export.pool) is
idle by then: the rejected subset is verified there while this thread verifies the accepted
one. The findings are the same either way, in the same order; a worker that cannot take the
verifier (it does not pickle: a test's injected exporter) or fails to run it leaves the subset
to this thread.
"""

from __future__ import annotations

from pathlib import Path

from .. import pool
from ..errors import ExportError
from ..formats.common.exporter import Exporter
from .paths import SUBSETS
from .records import REJECTED


def subset_errors(verifier: Exporter, subset: Path) -> list[str]:
    """One subset's findings (a pool unit: in a worker, or here)."""
    return list(verifier.verify(subset).errors)


def verify_staged(fmt: str, pair: Path, verifier: Exporter) -> None:
    """Run the format's verifier on both staged subsets; raise on findings.

    The exporter that wrote the pair verifies it (it knows its layout; tests inject one). Cheap
    by design: totals against the files, frame counts from the container index or by demuxing
    (no full decode), and one sample read per subset.
    """
    # a verifier that does not pickle fails there, on its way to the worker: verified here then
    aside = pool.beside(pool.Unit(f"verify {pair / REJECTED}", subset_errors, (verifier, pair / REJECTED)))
    findings = []
    for name in SUBSETS:
        errors = None
        if name == REJECTED and aside is not None:
            try:
                errors = aside.result()
            except Exception:  # noqa: BLE001 - the worker's failure is not the subset's: verified here
                errors = None
        if errors is None:
            errors = subset_errors(verifier, pair / name)
        findings += [f"{name}: {e}" for e in errors]
    if findings:
        shown = "; ".join(findings[:8]) + (f"; ... ({len(findings) - 8} more)" if len(findings) > 8 else "")
        raise ExportError(f"the staged {fmt} export failed verification, nothing was published: {shown}")
