"""NaN/inf in accepted episodes: refused naming the raw file and episode, or kept exactly (never
nulled) when an operator passed the episode, and said in the card."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dsfactory import Ep, make_dataset

from eva_export.config import NONFINITE_POLICIES, parse_config
from eva_export.errors import ConfigError
from eva_export.export.paths import ExportPaths
from eva_export.export.records import ACCEPTED, REJECTED, QualitySplit
from eva_export.export.runner import ExportService
from eva_export.formats.common.card import CARD_FILE
from eva_export.formats.common.nonfinite import NonFinitePolicy, kept_of
from eva_export.formats.lerobot_v3.verify import read_episodes_meta
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED, FAILED

RED = [{"code": "nan_values", "severity": "error", "detail": "observation.state NaN for 3 frames"}]
BAD_ROWS = (2, 3, 4)  # rows of observation.state[1] set to NaN; row 6 element 0 to +inf


def poison(root: Path, episode: int) -> Path:
    """Put NaN and inf into one raw episode's observation.state (a real Parquet rewrite)."""
    path = root / f"data/chunk-000/episode_{episode:06d}.parquet"
    table = pq.read_table(path)
    i = table.schema.get_field_index("observation.state")
    typ = table.schema.field(i).type
    values = np.asarray(table.column(i).combine_chunks().flatten().to_numpy()).reshape(table.num_rows, -1).copy()
    values[list(BAD_ROWS), 1] = np.nan
    values[6, 0] = np.inf
    col = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=typ.value_type), typ.list_size)
    pq.write_table(table.set_column(i, table.schema.field(i), col), path)
    return path


def source(tmp_path: Path, verdict: str) -> tuple[Path, Path]:
    """Episode 1 holds NaN/inf: green without a verdict, or red and passed by an operator."""
    quality, issues = ("green", []) if not verdict else ("red", RED)
    src = make_dataset(tmp_path / "logs" / "demo" / "raw", [
        Ep(frames=8), Ep(frames=9, quality=quality, issues=issues, verdict=verdict), Ep(frames=7, quality="red"),
    ], cameras=1, width=32, height=24)
    return src, poison(src, 1)


def export(tmp_path: Path, src: Path, fmt: str, policy: str | None = None):  # type: ignore[no-untyped-def]
    ex = {"nonfinite": policy} if policy else {}
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")}, "export": ex})
    return ExportService(cfg, background=False, recover=False).run(src, fmt)


@pytest.mark.parametrize("fmt", ["lerobot_v3", "lerobot_v21"])
def test_unpassed_nonfinite_episode_is_refused_naming_file_and_episode(tmp_path: Path, fmt: str) -> None:
    src, bad = source(tmp_path, verdict="")
    job = export(tmp_path, src, fmt)
    assert job.state == FAILED
    assert f"{fmt} export refused: the accepted subset holds NaN/inf values in 1 episode(s)" in job.error
    assert f"{bad}: source episode 1: observation.state (4 NaN/inf)" in job.error
    assert "export.nonfinite = finite_runs" in job.error and "--verdict pass" in job.error
    assert not ExportPaths.of(src, fmt).pair_dir.exists()  # nothing published


def test_refuse_policy_refuses_even_a_passed_episode(tmp_path: Path) -> None:
    src, bad = source(tmp_path, verdict="pass")
    job = export(tmp_path, src, "lerobot_v3", policy="refuse")
    assert job.state == FAILED and f"{bad}: source episode 1: observation.state (4 NaN/inf)" in job.error
    assert "export.nonfinite = refuse" in job.error


def read_state(root: Path, episode: int, fmt: str) -> pa.Array:
    if fmt == "lerobot_v21":
        table = pq.read_table(root / f"data/chunk-000/episode_{episode:06d}.parquet")
    else:
        row = read_episodes_meta(root).to_pylist()[episode]
        table = pq.read_table(root / f"data/chunk-{row['data/chunk_index']:03d}/file-{row['data/file_index']:03d}.parquet")
        table = table.slice(row["dataset_from_index"], row["length"])
    return table.column("observation.state").combine_chunks()


@pytest.mark.parametrize("fmt", ["lerobot_v3", "lerobot_v21"])
def test_passed_nonfinite_episode_is_kept_exactly_and_said_in_the_card(tmp_path: Path, fmt: str) -> None:
    src, bad = source(tmp_path, verdict="pass")
    raw = pq.read_table(bad).column("observation.state").combine_chunks()
    job = export(tmp_path, src, fmt, policy="keep_passed")
    assert job.state == COMPLETED, job.error
    acc = ExportPaths.of(src, fmt).accepted
    state = read_state(acc, 1, fmt)  # subset episode 1 is source episode 1 (0 green, 1 passed)
    assert state.null_count == 0 and state.values.null_count == 0  # never turned into nulls
    got = np.asarray(state.values.to_numpy()).reshape(len(state), -1)
    want = np.asarray(raw.values.to_numpy()).reshape(len(raw), -1)
    assert np.isnan(got[list(BAD_ROWS), 1]).all() and got[6, 0] == np.inf
    np.testing.assert_array_equal(got, want)  # bit for bit the recorded values (NaN == NaN here)
    kept = kept_of(QualitySplit.read(acc))
    assert [(e.episode_index, e.source_episode_index, e.features, e.qc_verdict) for e in kept] == [
        (1, 1, (("observation.state", 4),), "pass")]
    card = (acc / CARD_FILE).read_text(encoding="utf-8")
    assert "1 episode(s) hold NaN/inf values, kept exactly as recorded" in card
    assert f"| 1 | 1 | pass | observation.state: 4 | {bad} |" in card
    assert verify_export(acc).ok
    assert kept_of(QualitySplit.read(ExportPaths.of(src, fmt).rejected)) == ()  # checked: none there


def test_keep_policy_keeps_an_unpassed_episode_and_a_rejected_one_never_blocks(tmp_path: Path) -> None:
    src, bad = source(tmp_path, verdict="")
    poison(src, 2)  # red, no verdict: rejected, never checked
    job = export(tmp_path, src, "lerobot_v3", policy="keep")
    assert job.state == COMPLETED, job.error
    paths = ExportPaths.of(src, "lerobot_v3")
    kept = kept_of(QualitySplit.read(paths.accepted))
    assert [(e.source_episode_index, e.qc_verdict, e.source_file) for e in kept] == [(1, "", str(bad))]
    assert "| 1 | 1 | none | observation.state: 4 |" in (paths.accepted / CARD_FILE).read_text(encoding="utf-8")
    rej = read_state(paths.rejected, 0, "lerobot_v3")  # rejected episode 0 = source episode 2, kept as is
    assert np.isnan(np.asarray(rej.values.to_numpy()).reshape(len(rej), -1)[list(BAD_ROWS), 1]).all()
    assert {ACCEPTED, REJECTED} == {p.name for p in paths.pair_dir.iterdir()}


def test_the_option_is_checked_and_matches_the_policies() -> None:
    assert tuple(p.value for p in NonFinitePolicy) == NONFINITE_POLICIES
    assert parse_config({"collection": {"log_dir": "/tmp/x"}}).export.nonfinite == "finite_runs"
    with pytest.raises(ConfigError, match=r"export.nonfinite must be one of \['finite_runs', 'keep_passed', 'refuse', 'keep'\]"):
        parse_config({"collection": {"log_dir": "/tmp/x"}, "export": {"nonfinite": "null"}})
    with pytest.raises(ConfigError, match=r"export.nonfinite_min_run at least 1 frame \(got 0\)"):
        parse_config({"collection": {"log_dir": "/tmp/x"}, "export": {"nonfinite_min_run": 0}})


# ---- the units' own counts: the scan reads a staged table only when they do not apply


def split_poisoned(tmp_path: Path):  # type: ignore[no-untyped-def]
    from eva_export.export.split import split_dataset

    src, _bad = source(tmp_path, verdict="pass")
    res = split_dataset(src, tmp_path / "out")
    return res.subsets[ACCEPTED]


def test_scan_takes_the_units_counts_without_reading_the_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eva_export.formats.common import nonfinite

    acc = split_poisoned(tmp_path)
    read = [(e.episode_index, e.features) for e in nonfinite.scan_subset(acc.dir)]
    assert read == [(1, (("observation.state", 4),))]

    def no_read(*_a: object, **_k: object) -> None:
        raise AssertionError("a staged table was read")

    monkeypatch.setattr(nonfinite.pq, "ParquetFile", no_read)
    assert [(e.episode_index, e.features) for e in nonfinite.scan_subset(acc.dir, acc.nonfinite)] == read


def test_a_table_changed_after_its_unit_counted_it_is_read(tmp_path: Path) -> None:
    import os

    from eva_export.formats.common import nonfinite

    acc = split_poisoned(tmp_path)
    path = poison(acc.dir, 0)  # a finite episode made non-finite after the split counted it
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later mtime, whatever the clock's tick
    found = nonfinite.scan_subset(acc.dir, acc.nonfinite)
    assert [(e.episode_index, e.features) for e in found] == [(0, (("observation.state", 4),)),
                                                             (1, (("observation.state", 4),))]
    other = nonfinite.KnownCounts(["action"])  # counted for other features: not used
    assert other.keys != acc.nonfinite.keys
    assert len(nonfinite.scan_subset(acc.dir, other)) == 2


def test_unit_record_states_its_counts_or_nothing() -> None:
    from eva_export.formats.common.commits import TableNonFinite, UnitRecord

    facts = TableNonFinite((1, 2, 3, 4), ("observation.state", "action"), (("action", 5),))
    rec = UnitRecord(7, 0, 4, 0, {"episode_index": 0}, {}, {"cam": 10}, facts)
    assert UnitRecord.from_dict(rec.to_dict()) == rec
    old = rec.to_dict()
    del old["nonfinite"]  # a record written before the counts existed
    assert UnitRecord.from_dict(old).nonfinite is None
    for bad in ({"file": [1, 2, 3], "keys": [], "counts": []}, {"file": [1, 2, 3, 4], "keys": [1], "counts": []},
                {"file": [1, 2, 3, 4], "keys": [], "counts": [["a", 0]]}, {"file": [1, 2, 3, 4.0], "keys": [],
                                                                          "counts": []}, [], None):
        assert TableNonFinite.from_dict(bad) is None, bad
