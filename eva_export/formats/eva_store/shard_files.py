"""The files of one eva_store shard as they are written: each one's SHA-256 taken from the bytes
written (the shard's record carries them), and the MessagePack record payloads with their
offsets."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from .records import BlockSpec


class ShardFiles:
    """The SHA-256 of each file a shard writes, in write order (its ShardRecord's ``files``)."""

    def __init__(self) -> None:
        self.digests: list[tuple[str, str]] = []

    def add(self, rel: str, data: bytes) -> None:
        self.hashed(rel, hashlib.sha256(data).hexdigest())

    def hashed(self, rel: str, sha256: str) -> None:
        """A file hashed as it was written, in parts."""
        self.digests.append((rel, sha256))


class RecordWriter:
    """Appends MessagePack records to one payload file and keeps their offsets."""

    def __init__(self, shard_dir: Path, name: str, files: ShardFiles) -> None:
        self.rel = BlockSpec.msgpack_records_path(name)
        self.offsets_rel = BlockSpec.msgpack_records_offsets_path(name)
        self.payload = shard_dir / self.rel
        self.offsets_path = shard_dir / self.offsets_rel
        self.payload.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.payload, "wb")  # noqa: SIM115 - held across add() calls, closed by close()
        self._sha = hashlib.sha256()
        self.files = files
        self.offsets = [0]

    def add(self, record: bytes) -> None:
        self._f.write(record)
        self._sha.update(record)
        self.offsets.append(self.offsets[-1] + len(record))

    def close(self) -> None:
        self._f.close()
        buf = io.BytesIO()
        np.save(buf, np.asarray(self.offsets, np.int64), allow_pickle=False)
        with open(self.offsets_path, "wb") as fh:
            fh.write(buf.getvalue())
        self.files.hashed(self.rel, self._sha.hexdigest())
        self.files.add(self.offsets_rel, buf.getvalue())

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1
