"""The dataset card: ``README.md`` at a subset's root, in the layout a dataset hub renders.

YAML front matter as LeRobot's own card has it (``license``, ``task_categories: [robotics]``,
``tags`` starting with ``LeRobot``, a ``default`` config over ``data/*/*.parquet`` for the
LeRobot formats), then what was recorded (robot, fps, cameras, features), how the episodes were
split and why (counts by decision and by issue code), the operator verdicts, the sources and
their episodes, the non-finite values kept, and the tool version.

Every fact comes from the subset's typed records (meta/info.json, meta/episodes.jsonl,
meta/quality_split.json), never from a hand-written string of data: ``render`` is a pure
function of them, so the verifier re-renders and compares (``check_card``): a card whose counts
were edited, or records edited under an unchanged card, are both reported.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ... import __version__
from ...fsutil import atomic_write_text, iter_jsonl, read_json
from .exporter import VerifyReport
from .meta import EPISODES, INFO
from .nonfinite import NONFINITE_KEY, RUNS_KEY, NonFiniteEpisode, kept_of
from .records import ACCEPTED, REJECTED, DatasetInfo, EpisodeRow, Quality, QualitySplit, Verdict

CARD_FILE = "README.md"
#: The recordings' licence is the operator's to state; "other" is a licence id the hub accepts.
LICENSE = "other"
LEROBOT_FORMATS = ("lerobot_v21", "lerobot_v3")
#: quality_split.json keys (the marker's extra) the split writes for the card.
DECISIONS_KEY = "decisions"
TOOL_VERSION_KEY = "tool_version"


class Decision(StrEnum):
    """Why an episode is on its side of the split (the rule of records.SPLIT_RULE, per episode)."""

    OPERATOR_PASS = "operator_pass"  # accepted by an operator, whatever the quality said
    OPERATOR_FAIL = "operator_fail"  # rejected by an operator, whatever the quality said
    QUALITY_GREEN = "quality_green"  # no verdict, automatic quality green
    QUALITY_RED = "quality_red"  # no verdict, quality red (or any value but green)
    UNRATED = "unrated"  # no verdict and no quality at all: rejected, nobody judged it


def decision(row: EpisodeRow) -> Decision:
    verdict = row.qc_verdict.strip().lower()
    if verdict == Verdict.PASS:
        return Decision.OPERATOR_PASS
    if verdict == Verdict.FAIL:
        return Decision.OPERATOR_FAIL
    if row.quality.strip().lower() == Quality.GREEN:
        return Decision.QUALITY_GREEN
    if not row.quality.strip() and "quality" not in row.extra and not row.extra.get("qc_verdict"):
        return Decision.UNRATED
    return Decision.QUALITY_RED


@dataclass(frozen=True)
class SplitDecisions:
    """Episodes per decision on each side of one split (quality_split.json ``decisions``)."""

    accepted: dict[str, int]
    rejected: dict[str, int]

    @classmethod
    def of(cls, accepted: Iterable[EpisodeRow], rejected: Iterable[EpisodeRow]) -> SplitDecisions:
        return cls(_count(decision(r).value for r in accepted), _count(decision(r).value for r in rejected))

    def side(self, subset: str) -> dict[str, int]:
        return self.accepted if subset == ACCEPTED else self.rejected

    def to_dict(self) -> dict[str, Any]:
        return {ACCEPTED.value: dict(self.accepted), REJECTED.value: dict(self.rejected)}

    @classmethod
    def from_dict(cls, d: Any) -> SplitDecisions:
        if not isinstance(d, dict):
            raise ValueError(f"{DECISIONS_KEY} is not an object")
        return cls(*({str(k): int(v) for k, v in dict(d.get(s) or {}).items()} for s in (ACCEPTED, REJECTED)))


def _count(items: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(items).items()))


@dataclass(frozen=True)
class CardRecords:
    """The typed records a card is rendered from, read from one subset directory."""

    dataset_format: str
    info: DatasetInfo
    rows: tuple[EpisodeRow, ...]
    marker: QualitySplit

    @classmethod
    def read(cls, root: Path) -> CardRecords:
        root = Path(root)
        info = DatasetInfo.from_dict(read_json(root / INFO))
        rows = tuple(EpisodeRow.from_dict(d) for d in iter_jsonl(root / EPISODES)) if (root / EPISODES).is_file() else ()
        marker = QualitySplit.read(root)
        return cls(marker.dataset_format, info, rows, marker)

    @property
    def decisions(self) -> SplitDecisions:
        """The split's record when it wrote one; else this side counted from its own rows."""
        raw = self.marker.extra.get(DECISIONS_KEY)
        if raw is not None:
            return SplitDecisions.from_dict(raw)
        own = _count(decision(r).value for r in self.rows)
        return SplitDecisions(own, {}) if self.marker.subset == ACCEPTED else SplitDecisions({}, own)

    @property
    def kept_nonfinite(self) -> tuple[NonFiniteEpisode, ...]:
        return kept_of(self.marker)

    @property
    def tool_version(self) -> str:
        return str(self.marker.extra.get(TOOL_VERSION_KEY, __version__))


# ---- rendering ----------------------------------------------------------------------------------
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}  # plain, YAML reads them as non-strings


def _yaml_str(s: str) -> str:
    """A YAML scalar: plain when safe, else double-quoted (JSON strings are valid YAML)."""
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9_./-]*", s) and s.lower() not in _YAML_WORDS
    return s if plain else json.dumps(s, ensure_ascii=False)


def front_matter(rec: CardRecords) -> list[str]:
    lerobot = rec.dataset_format in LEROBOT_FORMATS
    tags = (["LeRobot"] if lerobot else []) + ["eva_export", rec.dataset_format, rec.marker.subset]
    if rec.info.robot_type:
        tags.append(rec.info.robot_type)
    lines = ["---", f"license: {LICENSE}", "task_categories:", "- robotics", "tags:"]
    lines += [f"- {_yaml_str(t)}" for t in tags]
    if lerobot and rec.rows:  # an empty subset has no file for the hub's loader to read
        lines += ["configs:", "- config_name: default", "  data_files: data/*/*.parquet"]
    return [*lines, "---", ""]


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def _ranges(indices: Iterable[int]) -> str:
    """0, 1, 2, 5 -> "0-2, 5"."""
    out: list[str] = []
    values = sorted(set(indices))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def recorded(rec: CardRecords) -> list[str]:
    info = rec.info
    frames = sum(r.length for r in rec.rows)
    tasks = Counter(t for r in rec.rows for t in r.tasks)
    lines = ["## What was recorded", "",
             f"- **Robot type:** {info.robot_type or 'not recorded'}",
             f"- **Frames per second:** {info.fps}",
             f"- **Episodes:** {len(rec.rows)} ({frames} frames)",
             f"- **Tasks:** {len(tasks)}", ""]
    if tasks:
        lines += _table(["task", "episodes"], ([t, n] for t, n in sorted(tasks.items())))
    cams = [(k, f) for k, f in info.features.items() if f.is_visual]
    lines += ["### Cameras", ""]
    if cams:
        lines += _table(["key", "height x width", "stored as", "codec", "fps"],
                        ([k, "x".join(str(s) for s in f.shape[:2]), f.dtype,
                          str((f.info or {}).get("video.codec", "embedded images")),
                          (f.info or {}).get("video.fps", info.fps)] for k, f in cams))
    else:
        lines += ["No camera.", ""]
    lines += ["### Features", ""]
    lines += _table(["name", "dtype", "shape", "names"],
                    ([k, f.dtype, list(f.shape), f.names] for k, f in info.features.items() if not f.is_visual))
    return lines


def judged(rec: CardRecords) -> list[str]:
    m = rec.marker
    dec = rec.decisions
    lines = ["## How the episodes were split", "",
             f"This is the **{m.subset}** subset of one quality split: {m.accepted_count} episode(s) accepted, "
             f"{m.rejected_count} rejected, {m.unrated_count} of them unrated.", "",
             f"Rule: {m.rule}.", ""]
    names = sorted(set(dec.accepted) | set(dec.rejected))
    if names:
        lines += _table(["decision", "accepted", "rejected"],
                        ([n, dec.accepted.get(n, 0), dec.rejected.get(n, 0)] for n in names))
    issues = Counter(key for r in rec.rows for key in {(i.code, i.severity) for i in r.quality_issues})
    lines += ["Quality issues flagged in this subset (episodes per issue code):", ""]
    if issues:
        lines += _table(["code", "severity", "episodes"], ([c, s, n] for (c, s), n in sorted(issues.items())))
    else:
        lines += ["None.", ""]
    return lines


def reviewed(rec: CardRecords) -> list[str]:
    verdicts = Counter(r.qc_verdict.strip().lower() or "none" for r in rec.rows)
    stamps = sorted(r.reviewed_at for r in rec.rows if r.reviewed_at)
    notes = sum(1 for r in rec.rows if r.note)
    lines = ["## Operator review", "",
             f"- **Verdicts in this subset:** pass {verdicts.get(Verdict.PASS, 0)}, fail {verdicts.get(Verdict.FAIL, 0)}, "
             f"none {verdicts.get('none', 0)}",
             f"- **Episodes reviewed:** {len(stamps)}" + (f" (from {stamps[0]} to {stamps[-1]})" if stamps else ""),
             f"- **Episodes with a note:** {notes}",
             "- **Reviewer:** not recorded (verdicts carry no reviewer identity)", ""]
    return lines


def sources(rec: CardRecords) -> list[str]:
    """Each raw dataset the subset's episodes come from, and which of its episodes."""
    m = rec.marker
    by_source: dict[str, list[EpisodeRow]] = {}
    for r in rec.rows:
        by_source.setdefault(str(r.extra.get("source_dataset", m.source_dir)), []).append(r)
    lines = ["## Sources", ""]
    if not by_source:
        lines += [f"- `{m.source_dir}`: no episode of it is in this subset", ""]
        return lines

    def raw(r: EpisodeRow) -> int:
        v = r.extra.get("source_episode_index", r.episode_index)
        return v if isinstance(v, int) else r.episode_index

    lines += _table(["source dataset", "episodes", "frames", "source episodes", "subset episodes"],
                    ([src, len(rs), sum(r.length for r in rs), _ranges(raw(r) for r in rs),
                      _ranges(r.episode_index for r in rs)] for src, rs in sorted(by_source.items())))
    reenc = m.extra.get("reencoded_source_episodes")
    if isinstance(reenc, dict) and reenc:
        lines += ["Cameras re-encoded (no exact stream-copy cut of the source existed): "
                  + "; ".join(f"{k}: source episodes {_ranges(int(i) for i in v)}" for k, v in sorted(reenc.items())), ""]
    return lines


def nonfinite(rec: CardRecords) -> list[str]:
    kept = rec.kept_nonfinite
    lines = ["## Non-finite values", ""]
    review = rec.marker.subset == REJECTED
    if review and NONFINITE_KEY not in rec.marker.extra:
        return [*lines, "Not checked: the rejected subset is kept for review, not for training.", ""]
    if NONFINITE_KEY not in rec.marker.extra:
        return [*lines, "Not checked by this export.", ""]
    lines += _cut(rec)
    if not kept:
        return [*lines, "None: every numeric value of this subset is finite.", ""]
    why = ("the rejected subset is kept for review" if review
           else "an operator passed them or export.nonfinite is keep; this subset will not train as is")
    lines += [f"{len(kept)} episode(s) hold NaN/inf values, kept exactly as recorded (not replaced, not "
              f"nulled) because {why}. Their rows holding them are left out of meta/stats.json (its count "
              "says how many rows went in). Mask them before training:", ""]
    return lines + _table(["episode", "source episode", "verdict", "NaN/inf values", "source file"],
                          ([e.episode_index, e.source_episode_index, e.qc_verdict or "none",
                            ", ".join(f"{k}: {n}" for k, n in e.features), e.source_file] for e in kept))


def _min_run(cut: list[Any]) -> str:
    return "/".join(sorted({str(c.get("min_frames", "?")) for c in cut if isinstance(c, dict)})) or "?"


def _cut(rec: CardRecords) -> list[str]:
    """The passed episodes exported as their finite runs (export/finite_runs.py's record)."""
    cut = rec.marker.extra.get(RUNS_KEY)
    if not isinstance(cut, list) or not cut:
        return []
    lines = [f"{len(cut)} passed source episode(s) held NaN/inf values. Each is exported as its finite runs: "
             f"every run of frames whose numeric values are all finite, at least {_min_run(cut)} frames long, is an "
             "episode of its own (its row's `finite_run` names the source episode and frame range). Nothing is "
             "filled in or interpolated; the other frames are left out:", ""]
    lines += _table(["source episode", "NaN/inf values", "frames", "runs kept [from, to)", "short runs dropped",
                     "frames left out", "source file"],
                    ([c.get("source_episode_index"), ", ".join(f"{k}: {n}" for k, n in dict(c.get("features", {})).items()),
                      c.get("frames"), " ".join(f"[{a}, {b})" for a, b in c.get("runs", [])) or "none",
                      c.get("dropped_runs"), c.get("dropped_frames"), c.get("source_file")] for c in cut
                     if isinstance(c, dict)))
    return [*lines, ""]


def render(rec: CardRecords) -> str:
    m = rec.marker
    title = f"# {rec.info.robot_type or 'Robot'} recordings: {m.subset} ({rec.dataset_format})"
    intro = [title, "",
             f"Exported by eva_export {rec.tool_version} (job `{m.job_id or 'none'}`, {m.created_at or 'time not recorded'}) "
             f"from `{m.source_dir}`. This card is generated from "
             "[meta/info.json](meta/info.json), [meta/episodes.jsonl](meta/episodes.jsonl) and "
             "[meta/quality_split.json](meta/quality_split.json); `eva-export verify` checks it against them.", ""]
    parts = front_matter(rec) + intro + recorded(rec) + judged(rec) + reviewed(rec) + sources(rec) + nonfinite(rec)
    return "\n".join(parts).rstrip("\n") + "\n"


def write_card(root: Path) -> Path:
    """Render the card of the subset at ``root`` from its records and write README.md there."""
    path = Path(root) / CARD_FILE
    atomic_write_text(path, render(CardRecords.read(Path(root))))
    return path


def _decision_problems(rec: CardRecords) -> list[str]:
    """The split's decision counts add up to its episode counts (a marker edited by hand does not)."""
    if DECISIONS_KEY not in rec.marker.extra:
        return []
    dec, m = rec.decisions, rec.marker
    out = []
    for side, count in ((ACCEPTED, m.accepted_count), (REJECTED, m.rejected_count)):
        if sum(dec.side(side).values()) != count:
            out.append(f"quality_split.json: {DECISIONS_KEY} count {sum(dec.side(side).values())} {side} "
                       f"episodes, {side}_count says {count}")
    runs = rec.marker.extra.get(RUNS_KEY)  # a source episode cut into finite runs: one row per run
    extra_rows = sum(len(c.get("runs", [])) - 1 for c in runs if isinstance(c, dict)) if isinstance(runs, list) else 0
    if sum(dec.side(m.subset).values()) + extra_rows != len(rec.rows):
        out.append(f"quality_split.json: {DECISIONS_KEY} count {sum(dec.side(m.subset).values())} {m.subset} "
                   f"episodes, episodes.jsonl holds {len(rec.rows)}")
    return out


def check_card(report: VerifyReport, root: Path) -> None:
    """README.md exists and is exactly what the subset's records render to."""
    path = Path(root) / CARD_FILE
    try:
        rec = CardRecords.read(Path(root))
        release = rec.marker.extra.get(TOOL_VERSION_KEY)
        if not path.is_file() and release is None:
            # exported by a release before cards (its marker has no tool_version): still readable
            report.checks.append(f"{CARD_FILE}: none (exported before dataset cards existed)")
            return
        if not path.is_file():
            report.errors.append(f"{CARD_FILE}: the dataset card is missing")
            return
        want = render(rec)
        have = path.read_text(encoding="utf-8")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        report.errors.append(f"{CARD_FILE}: cannot be checked against the records ({exc})")
        return
    problems = _decision_problems(rec)
    report.errors += problems
    if release is not None and release != __version__ and not problems:
        # another release words its cards differently: an exact compare would fail every export
        # it made; the decision counts above are still checked against the marker
        report.checks.append(f"{CARD_FILE}: rendered by eva_export {release}, not compared line by line")
        return
    if have == want and not problems:
        report.checks.append(f"{CARD_FILE}: the dataset card matches info.json, episodes.jsonl and quality_split.json")
        return
    a, b = have.splitlines(), want.splitlines()
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    said = a[n] if n < len(a) else "(end of file)"
    given = b[n] if n < len(b) else "(end of file)"
    report.errors.append(f"{CARD_FILE}: the dataset card does not match the records: line {n + 1} says "
                         f"{said!r}, the records give {given!r}")
