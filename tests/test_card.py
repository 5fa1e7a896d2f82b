"""The dataset card (README.md) of every export: hub front matter, facts from the records, and
verification that refuses a card or marker edited by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dsfactory import Ep, make_dataset

from eva_export.config import parse_config
from eva_export.errors import ExportError
from eva_export.export.paths import ExportPaths
from eva_export.export.records import ACCEPTED, REJECTED, QualitySplit
from eva_export.export.runner import ExportService
from eva_export.export.split import classify
from eva_export.export.verify_pair import verify_staged
from eva_export.formats.common.card import CARD_FILE, DECISIONS_KEY, Decision, decision
from eva_export.formats.common.records import EpisodeRow
from eva_export.formats.registry import get_exporter
from eva_export.formats.verify import verify_export
from eva_export.jobs import COMPLETED

RED = [{"code": "drops", "severity": "error", "detail": "3 frames dropped on cam0"},
       {"code": "jitter", "severity": "warning", "detail": "late frames"}]
SUBSET_OF = {Decision.OPERATOR_PASS: ACCEPTED, Decision.QUALITY_GREEN: ACCEPTED, Decision.OPERATOR_FAIL: REJECTED,
             Decision.QUALITY_RED: REJECTED, Decision.UNRATED: REJECTED}


def mixed_source(tmp_path: Path) -> Path:
    """0 green, 1 red, 2 red+pass, 3 green+fail, 4 green (task B), 5 unrated."""
    return make_dataset(tmp_path / "logs" / "demo" / "raw", [
        Ep(frames=12, quality="green"),
        Ep(frames=13, quality="red", issues=RED),
        Ep(frames=14, quality="red", issues=RED, verdict="pass", note="operator: fine"),
        Ep(frames=15, quality="green", verdict="fail", note="gripper slipped"),
        Ep(frames=16, quality="green", task="place the cube"),
        Ep(frames=11, quality=""),
    ], cameras=1, width=32, height=24)


def run_export(tmp_path: Path, fmt: str) -> ExportPaths:
    src = mixed_source(tmp_path)
    cfg = parse_config({"collection": {"log_dir": str(tmp_path / "logs")}})
    job = ExportService(cfg, background=False, recover=False).run(src, fmt)
    assert job.state == COMPLETED, job.error
    return ExportPaths.of(src, fmt)


def front_matter(card: str) -> dict[str, object]:
    assert card.startswith("---\n")
    head, _, _ = card[4:].partition("\n---\n")
    data = yaml.safe_load(head)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module", params=["lerobot_v21", "lerobot_v3"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ExportPaths:
    return run_export(tmp_path_factory.mktemp(str(request.param)), str(request.param))


@pytest.mark.parametrize("verdict,quality,extra", [
    ("pass", "red", {}), ("fail", "green", {}), ("", "green", {}), ("", "red", {}), ("", "", {}),
    ("", "yellow", {}), ("PASS ", "", {}), ("", "", {"quality": None}),
])
def test_decision_agrees_with_the_split_rule(verdict: str, quality: str, extra: dict[str, object]) -> None:
    row = EpisodeRow.from_dict({"episode_index": 0, "tasks": ["t"], "length": 3, **(
        {"qc_verdict": verdict} if verdict else {}), **({"quality": quality} if quality else {}), **extra})
    assert SUBSET_OF[decision(row)] == classify(row)


def test_every_lerobot_subset_has_a_card_the_hub_reads(exported: ExportPaths) -> None:
    for name in (ACCEPTED, REJECTED):
        root = exported.subset(name)
        card = (root / CARD_FILE).read_text(encoding="utf-8")
        meta = front_matter(card)
        assert meta["license"] == "other" and meta["task_categories"] == ["robotics"]
        tags = meta["tags"]
        assert isinstance(tags, list) and tags[0] == "LeRobot" and exported.fmt in tags and name in tags
        assert meta["configs"] == [{"config_name": "default", "data_files": "data/*/*.parquet"}]
        assert list(root.glob("data/*/*.parquet")), "the config's glob names the data files"
        report = verify_export(root)
        assert report.ok, report.errors
        assert any(c.startswith("README.md: the dataset card matches") for c in report.checks)
        manifest = json.loads((root / "meta/manifest.json").read_text())
        assert CARD_FILE in {f["path"] for f in manifest["files"]}  # published and uploaded with the rest


def test_card_states_the_facts_of_the_records(exported: ExportPaths) -> None:
    acc = (exported.accepted / CARD_FILE).read_text(encoding="utf-8")
    rej = (exported.rejected / CARD_FILE).read_text(encoding="utf-8")
    marker = QualitySplit.read(exported.accepted)
    assert marker.extra[DECISIONS_KEY] == {"accepted": {"operator_pass": 1, "quality_green": 2},
                                           "rejected": {"operator_fail": 1, "quality_red": 1, "unrated": 1}}
    for card in (acc, rej):  # both halves say how the whole split went, and why
        assert "3 episode(s) accepted, 3 rejected, 1 of them unrated" in card
        for line in ("| operator_fail | 0 | 1 |", "| operator_pass | 1 | 0 |", "| quality_green | 2 | 0 |",
                     "| quality_red | 0 | 1 |", "| unrated | 0 | 1 |"):
            assert line in card
        assert f"Exported by eva_export {marker.extra['tool_version']} (job `{marker.job_id}`" in card
        assert "| observation.images.cam0 | 24x32 | video |" in card
        assert "| observation.state | float32 | [6] |" in card and "- **Frames per second:** 30" in card
    assert "- **Episodes:** 3 (42 frames)" in acc and "| place the cube | 1 |" in acc
    assert "| drops | error | 1 |" in acc and "| jitter | warning | 1 |" in acc  # episode 2, passed on red
    assert "pass 1, fail 0, none 2" in acc and "- **Episodes with a note:** 1" in acc
    assert f"| {marker.source_dir} | 3 | 42 | 0, 2, 4 | 0-2 |" in acc
    assert f"| {marker.source_dir} | 3 | 39 | 1, 3, 5 | 0-2 |" in rej
    assert "None: every numeric value of this subset is finite." in acc
    assert "None: every numeric value of this subset is finite." in rej  # checked too, kept for review


def test_a_tampered_count_in_the_card_is_refused(exported: ExportPaths, tmp_path: Path) -> None:
    card = exported.accepted / CARD_FILE
    original = card.read_text(encoding="utf-8")
    try:
        card.write_text(original.replace("| quality_green | 2 | 0 |", "| quality_green | 5 | 0 |"), encoding="utf-8")
        report = verify_export(exported.accepted)
        assert not report.ok
        assert any("README.md: the dataset card does not match the records" in e and "quality_green | 5" in e
                   and "quality_green | 2" in e for e in report.errors), report.errors
        card.unlink()
        assert any("README.md: the dataset card is missing" in e for e in verify_export(exported.accepted).errors)
    finally:
        card.write_text(original, encoding="utf-8")
    assert verify_export(exported.accepted).ok


def test_a_tampered_marker_under_an_unchanged_card_is_refused(exported: ExportPaths) -> None:
    path = exported.rejected / "meta/quality_split.json"
    original = path.read_text(encoding="utf-8")
    try:
        d = json.loads(original)
        d[DECISIONS_KEY]["rejected"]["unrated"] = 0  # hides the unjudged episode
        path.write_text(json.dumps(d), encoding="utf-8")
        errors = verify_export(exported.rejected).errors
        assert any("does not match the records" in e for e in errors), errors
        assert any("decisions count 2 rejected episodes, rejected_count says 3" in e for e in errors), errors
    finally:
        path.write_text(original, encoding="utf-8")


def test_verification_before_publication_refuses_a_tampered_card(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "raw", [Ep(frames=5), Ep(frames=6, quality="red")], cameras=1, width=32, height=24)
    pair = tmp_path / "pair"
    for name, idx in ((ACCEPTED, [0]), (REJECTED, [1])):
        native = tmp_path / "native" / name
        make_dataset(native, [Ep(frames=5 + idx[0])], cameras=1, width=32, height=24)
        QualitySplit(str(src), name, "lerobot_v21", idx, episode_count=1, frame_count=5 + idx[0],
                     accepted_count=1, rejected_count=1).write(native)
        get_exporter("lerobot_v3").export(native, pair / name, None)  # type: ignore[arg-type]
    verify_staged("lerobot_v3", pair, get_exporter("lerobot_v3"))  # untouched: passes
    card = pair / REJECTED / CARD_FILE
    card.write_text(card.read_text(encoding="utf-8").replace("**Episodes:** 1", "**Episodes:** 0"), encoding="utf-8")
    with pytest.raises(ExportError, match=r"nothing was published: rejected: README.md: the dataset card does not"):
        verify_staged("lerobot_v3", pair, get_exporter("lerobot_v3"))


@pytest.mark.parametrize("fmt", ["hdf5", "mcap", "eva_store"])
def test_other_formats_carry_a_card_without_the_lerobot_config(fmt: str, tmp_path: Path) -> None:
    native = make_dataset(tmp_path / "native", [Ep(frames=4), Ep(frames=3)], cameras=1, width=32, height=24)
    QualitySplit(str(tmp_path / "raw"), ACCEPTED, "lerobot_v21", [0, 1], episode_count=2, frame_count=7).write(native)
    out = tmp_path / fmt
    get_exporter(fmt).export(native, out, None)  # type: ignore[arg-type]
    card = (out / CARD_FILE).read_text(encoding="utf-8")
    meta = front_matter(card)
    assert meta["task_categories"] == ["robotics"] and "LeRobot" not in meta["tags"] and "configs" not in meta  # type: ignore[operator]
    assert fmt in meta["tags"]  # type: ignore[operator]
    assert "| observation.images.cam0 | 24x32 | image | embedded images |" in card
    assert "Not checked by this export." in card  # no export job ran the non-finite check
    assert verify_export(out).ok


def test_cards_of_other_releases_are_not_compared_line_by_line(exported: ExportPaths, tmp_path: Path) -> None:
    """An export made by another release (its marker's tool_version) keeps verifying after an
    upgrade, and one made before cards existed (no tool_version, no card) is not refused for it."""
    import shutil

    for case in ("other_release", "before_cards"):
        root = tmp_path / case
        shutil.copytree(exported.accepted, root, symlinks=True)
        marker = root / "meta/quality_split.json"
        d = json.loads(marker.read_text(encoding="utf-8"))
        card = root / CARD_FILE
        if case == "other_release":
            d["tool_version"] = "0.0.1"
            card.write_text(card.read_text(encoding="utf-8").replace("Exported by", "Written by"), encoding="utf-8")
        else:
            d.pop("tool_version")
            card.unlink()
        marker.write_text(json.dumps(d), encoding="utf-8")
        rep = verify_export(root)
        assert not [e for e in rep.errors if "dataset card" in e or "cannot be checked" in e], rep.errors
        want = "rendered by eva_export 0.0.1" if case == "other_release" else "exported before dataset cards existed"
        assert any(want in c for c in rep.checks), rep.checks
