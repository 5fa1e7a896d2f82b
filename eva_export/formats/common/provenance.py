"""Name the raw dataset's file and episode behind a staged subset's renumbered episode.

Exporters read a staged, renumbered subset (``.staging-*/native/...``); a message naming that
path or the subset's episode number points the user at nothing they have. The subset's
episodes.jsonl rows carry ``source_episode_index`` and its quality_split.json the raw
dataset's directory, which is all it takes to name the user's own files. A merged export's rows
name their own source (``source_dataset``, export/merge.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .meta import DatasetMeta
from .records import QualitySplit


@dataclass(frozen=True)
class RawNames:
    """Subset episode index -> the raw episode index and the raw files of that episode."""

    root: Path  # the raw dataset (the subset itself when it carries no provenance)
    raw_index: tuple[tuple[int, int], ...]  # (subset index, raw index)
    meta: DatasetMeta
    roots: tuple[tuple[int, str], ...] = ()  # (subset index, source dataset) of a merged export's rows

    @classmethod
    def of(cls, meta: DatasetMeta) -> RawNames:
        try:
            root = Path(QualitySplit.read(meta.root).source_dir)
        except (OSError, ValueError, KeyError):
            root = meta.root
        pairs, roots = [], []
        for ep in meta.episodes:
            if isinstance(ep.extra.get("source_dataset"), str):
                roots.append((ep.episode_index, str(ep.extra["source_dataset"])))
            raw = ep.extra.get("source_episode_index", ep.episode_index)
            pairs.append((ep.episode_index, int(raw) if isinstance(raw, int) else ep.episode_index))
        return cls(root, tuple(pairs), meta, tuple(roots))

    def root_of(self, episode_index: int) -> Path:
        return Path(dict(self.roots).get(episode_index, str(self.root)))

    def index(self, episode_index: int) -> int:
        return dict(self.raw_index).get(episode_index, episode_index)

    def episode(self, episode_index: int) -> str:
        return f"episode {self.index(episode_index)}"

    def video(self, key: str, episode_index: int) -> Path:
        try:
            return self.root_of(episode_index) / self.meta.info.video_file(key, self.index(episode_index))
        except ValueError:
            return self.root_of(episode_index)

    def data(self, episode_index: int) -> Path:
        return self.root_of(episode_index) / self.meta.info.data_file(self.index(episode_index))
