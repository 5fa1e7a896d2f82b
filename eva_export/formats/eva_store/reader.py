"""Random access to an eva_store: ``open_store(path)[i]`` -> one sample as NumPy arrays.

Built for training loaders with many worker processes:

* nothing is opened in ``open_store`` but manifest.json and the sample index; shard files are
  opened on first use, per process: the handle cache is keyed by ``os.getpid()``, so a store
  created before ``fork`` (a PyTorch ``DataLoader`` with workers) opens its own descriptors in
  every worker and never shares a file offset (reads use ``os.pread`` anyway);
* a shard's numeric columns (a few KB per episode) are read whole from Zarr on first use and
  kept for the life of the process, because one Zarr ``__getitem__`` costs milliseconds of
  Python while a NumPy row is free (opening a shard costs ~30 ms of CPU once per process);
  record descriptors stay open for the last ``MAX_OPEN_SHARDS`` shards; frames are read with
  one ``pread`` each through the offsets array (raw frames: one ``preadv`` into the array);
* optional temporal context: ``delta_timestamps={"action": [0.0, 0.1, ...]}`` returns stacked
  rows at those offsets, clamped at the episode's edges, with a ``<key>_is_pad`` mask (the
  convention of LeRobot's datasets).

No torch import anywhere: wrap a ``Store`` in a ``torch.utils.data.Dataset`` if needed (it
already has ``__len__`` and ``__getitem__``).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import msgpack
import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ...errors import EvaError
from .codecs import decode_image, unpack_record
from .records import KIND_RECORDS, KIND_ZARR, SAMPLE_INDEX_FILE, IndexRecord, Manifest, ShardSpec

MAX_OPEN_SHARDS = 64  # shards whose descriptors and numeric columns stay cached per process


class StoreError(EvaError):
    """An eva_store is unreadable or inconsistent; the message names the file."""


def _read_numeric(shard_dir: Path, spec: ShardSpec) -> dict[str, NDArray[np.generic]]:
    """Every Zarr column of a shard, whole, paid once per process: the result is small and never
    evicted. All of them are read in one call into zarr's event loop (its group open and array
    reads side by side): one call per array was ~12 ms a shard, this ~3.5 ms."""
    import asyncio

    import zarr.api.asynchronous as zarr_async
    from zarr.core.sync import sync

    wanted = [(name, block.paths[0].split("/", 1)) for name, block in spec.blocks.items() if block.kind == KIND_ZARR]
    if not wanted:
        return {}

    async def read_all() -> dict[str, NDArray[np.generic]]:
        group = await zarr_async.open_group(store=str(shard_dir / wanted[0][1][0]), mode="r")

        async def one(name: str, member: str) -> tuple[str, NDArray[np.generic]]:
            arr = cast(Any, await group.getitem(member))  # an AsyncArray (zarr's union type)
            return name, np.asarray(await arr.getitem(Ellipsis))

        return dict(await asyncio.gather(*(one(name, rel[1]) for name, rel in wanted)))

    return sync(read_all())


class _Shard:
    """One shard opened in this process: numeric columns in memory, record files by descriptor."""

    def __init__(self, root: Path, spec: ShardSpec, numeric: dict[str, NDArray[np.generic]] | None = None) -> None:
        self.spec = spec
        self.dir = root / spec.relative_dir
        self.numeric: dict[str, NDArray[np.generic]] = {}
        self.records: dict[str, tuple[int, NDArray[np.int64], int]] = {}  # name -> (fd, offsets, blob size)
        try:
            self.numeric = numeric if numeric is not None else _read_numeric(self.dir, spec)
            for name, block in spec.blocks.items():
                if block.kind == KIND_RECORDS:
                    payload, offsets_path = (self.dir / p for p in block.paths)
                    offsets = np.load(offsets_path, allow_pickle=False)
                    fd = os.open(payload, os.O_RDONLY)
                    self.records[name] = (fd, offsets, os.fstat(fd).st_size)
        except Exception as exc:
            self.close()
            raise StoreError(f"shard {spec.shard_id} ({self.dir}): cannot open ({type(exc).__name__}: {exc})") from exc

    def record(self, name: str, row: int) -> bytes:
        fd, offsets, size = self.records[name]
        start, end = int(offsets[row]), int(offsets[row + 1])
        if not 0 <= start <= end <= size:
            raise StoreError(f"{self.dir / self.spec.blocks[name].paths[1]}: record {row} spans [{start}, {end}), "
                             f"outside the {size}-byte payload")
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise StoreError(f"{self.dir / self.spec.blocks[name].paths[0]}: short read of record {row}")
        return data

    def frame(self, name: str, row: int) -> NDArray[np.uint8]:
        block = self.spec.blocks[name]
        path = self.dir / block.paths[0]
        if block.codec == "raw" and block.shape:
            return self._raw_frame(name, row, tuple(block.shape[1:]), path)
        try:
            codec, shape, data = unpack_record(self.record(name, row))
            return decode_image(data, codec, shape)
        except ValueError as exc:
            raise StoreError(f"{path}: record {row} does not decode ({exc})") from exc

    def _raw_frame(self, name: str, row: int, shape: tuple[int, ...], path: Path) -> NDArray[np.uint8]:
        """A raw frame read straight into its array: one copy, no MessagePack unpack of the pixels.

        The record is ``{"codec", "shape", "data"}`` with the pixels last, so they are its final
        ``prod(shape)`` bytes. The header before them is parsed and must say exactly that.
        """
        fd, offsets, size = self.records[name]
        start, end = int(offsets[row]), int(offsets[row + 1])
        nbytes = int(np.prod(shape))
        head_len = end - start - nbytes
        if not (0 <= start <= end <= size and 2 < head_len <= 256):
            raise StoreError(f"{self.dir / self.spec.blocks[name].paths[1]}: record {row} spans [{start}, {end}), "
                             f"which cannot hold a {shape} raw frame inside the {size}-byte payload")
        head = os.pread(fd, head_len, start)
        # MessagePack's bin header before the pixels: bin8, bin16 or bin32 by payload size
        marker, width = (0xC4, 1) if nbytes < 1 << 8 else (0xC5, 2) if nbytes < 1 << 16 else (0xC6, 4)
        try:
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(head[:-1 - width])
            fields: dict[str, Any] = {}
            for _ in range(unpacker.read_map_header()):
                key = unpacker.unpack()
                fields[key] = None if key == "data" else unpacker.unpack()
            ok = (list(fields) == ["codec", "shape", "data"] and fields["codec"] == "raw"
                  and tuple(fields["shape"]) == shape and head[-1 - width] == marker
                  and int.from_bytes(head[-width:], "big") == nbytes)
        except Exception:  # noqa: BLE001 - any parse failure is a bad record
            ok = False
        if not ok:
            raise StoreError(f"{path}: record {row} does not decode (not a raw {shape} frame record)")
        out = np.empty(shape, np.uint8)
        if os.preadv(fd, [out.data.cast("B")], start + head_len) != nbytes:
            raise StoreError(f"{path}: short read of record {row}")
        return out

    def close(self) -> None:
        for fd, _, _ in self.records.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.records = {}


class Store:
    """A whole store (or, through ``StoreView``, a split or an episode of it)."""

    def __init__(self, root: str | os.PathLike[str], delta_timestamps: dict[str, Sequence[float]] | None = None,
                 decode_images: bool = True) -> None:
        self.root = Path(root)
        try:
            self.manifest = Manifest.read(self.root)
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.root}: not a readable eva_store ({exc})") from exc
        try:
            table = IndexRecord.read_table(self.root / SAMPLE_INDEX_FILE)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds; name the file
            raise StoreError(f"{self.root / SAMPLE_INDEX_FILE}: unreadable ({exc})") from exc
        try:
            self._read_index(table)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - columns of another type, nulls: name the file
            raise StoreError(f"{self.root / SAMPLE_INDEX_FILE}: malformed ({type(exc).__name__}: {exc})") from None
        if len(self._row) != self.manifest.total_rows:
            raise StoreError(f"{self.root / SAMPLE_INDEX_FILE}: {len(self._row)} samples, manifest.json shards hold "
                             f"{self.manifest.total_rows} rows")
        mb = self.manifest.materialized_blocks
        self.frame_keys: tuple[str, ...] = tuple(mb.cameras) + tuple(mb.images)
        self.numeric_keys: tuple[str, ...] = tuple(mb.numeric)
        self.decode_images = decode_images
        self.fps = self.manifest.fps
        self.delta_frames: dict[str, NDArray[np.int64]] = {}
        for key, deltas in (delta_timestamps or {}).items():
            if key not in self.frame_keys and key not in self.numeric_keys:
                raise StoreError(f"delta_timestamps key {key!r} is not a block of this store")
            self.delta_frames[key] = np.rint(np.asarray(deltas, np.float64) * self.fps).astype(np.int64)
        self._pid = -1
        self._open: collections.OrderedDict[int, _Shard] = collections.OrderedDict()
        self._numeric_cache: dict[int, dict[str, NDArray[np.generic]]] = {}  # per process, like the descriptors

    def _read_index(self, table: pa.Table) -> None:
        """The sample index columns; every (shard, row) must lie inside its shard."""
        pos = {s.shard_id: i for i, s in enumerate(self.manifest.shards)}
        shard_ids = table.column("shard_id").to_pylist()
        unknown = sorted(set(shard_ids) - set(pos), key=str)
        if unknown:
            raise StoreError(f"{self.root / SAMPLE_INDEX_FILE}: names shards {unknown[:3]} absent from manifest.json")
        self._shard = np.fromiter((pos[s] for s in shard_ids), np.int32, len(shard_ids))
        self._row = np.asarray(table.column("row").to_numpy(), np.int64)
        rows = np.asarray([s.num_rows for s in self.manifest.shards], np.int64)
        bad: NDArray[np.int64] = np.flatnonzero((self._row < 0) | (self._row >= rows[self._shard]))
        if len(bad):
            raise StoreError(f"{self.root / SAMPLE_INDEX_FILE}: sample {int(bad[0])} names row {int(self._row[bad[0]])} "
                             f"outside its shard")
        self._episode = table.column("episode_index").to_numpy()
        self._split = np.asarray(table.column("split").to_pylist(), dtype=object)
        self._task = np.asarray(table.column("task").to_pylist(), dtype=object)
        self._key = np.asarray(table.column("sample_key").to_pylist(), dtype=object)

    # ---- per-process handles ---------------------------------------------------------------
    def _shard_handle(self, pos: int) -> _Shard:
        if self._pid != os.getpid():  # first use, or first use after fork: never reuse the parent's
            for old in self._open.values():
                old.close()  # the child's copies of the parent's descriptors
            self._open = collections.OrderedDict()
            self._numeric_cache = {}
            self._pid = os.getpid()
        h = self._open.get(pos)
        if h is None:
            h = _Shard(self.root, self.manifest.shards[pos], self._numeric_cache.get(pos))
            self._numeric_cache[pos] = h.numeric  # kept when the descriptors are evicted: reopening is cheap
            self._open[pos] = h
            if len(self._open) > MAX_OPEN_SHARDS:
                self._open.popitem(last=False)[1].close()
        else:
            self._open.move_to_end(pos)
        return h

    def close(self) -> None:
        for h in self._open.values():
            h.close()
        self._open.clear()

    def __getstate__(self) -> dict[str, object]:  # picklable for spawn-based workers: no descriptors
        state = dict(self.__dict__)
        state["_open"] = collections.OrderedDict()
        state["_numeric_cache"] = {}
        state["_pid"] = -1
        return state

    # ---- samples ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._row)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for a store of {n} samples")
        h = self._shard_handle(int(self._shard[i]))
        try:
            return self._sample(h, i)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - data that disagrees with its manifest: a store error
            raise StoreError(f"{h.dir}: sample {i} unreadable ({type(exc).__name__}: {exc})") from None

    def _sample(self, h: _Shard, i: int) -> dict[str, Any]:
        row = int(self._row[i])
        out: dict[str, Any] = {}
        for key in self.numeric_keys:
            out[key] = self._numeric(h, key, row)
        if self.decode_images:
            for key in self.frame_keys:
                out[key] = self._frames(h, key, row)
        out["task"] = self._task[i]
        out["sample_key"] = self._key[i]
        return out

    def _rows(self, h: _Shard, key: str, row: int) -> tuple[NDArray[np.generic] | None, NDArray[np.generic] | None]:
        deltas = self.delta_frames.get(key)
        if deltas is None:
            return None, None
        want = row + deltas
        return np.clip(want, 0, h.spec.num_rows - 1), (want < 0) | (want >= h.spec.num_rows)

    def _numeric(self, h: _Shard, key: str, row: int) -> Any:
        rows, pad = self._rows(h, key, row)
        col = h.numeric[key]
        if rows is None:
            return np.array(col[row])
        return {"value": col[rows], "is_pad": pad}

    def _frames(self, h: _Shard, key: str, row: int) -> Any:
        rows, pad = self._rows(h, key, row)
        if rows is None:
            return h.frame(key, row)
        return {"value": np.stack([h.frame(key, int(r)) for r in rows]), "is_pad": pad}

    def raw_record(self, i: int, key: str) -> bytes:
        """The encoded bytes of one frame record (for checks and benchmarks)."""
        return self._shard_handle(int(self._shard[i])).record(key, int(self._row[i]))

    # ---- views -----------------------------------------------------------------------------
    @property
    def episodes(self) -> list[int]:
        return [s.episode_index for s in self.manifest.shards]

    def indices(self, split: str | None = None, episode: int | None = None) -> NDArray[np.int64]:
        mask = np.ones(len(self), bool)
        if split is not None and split != "all":
            mask &= self._split == split
        if episode is not None:
            mask &= self._episode == episode
        return np.flatnonzero(mask)

    def split(self, name: str) -> StoreView:
        """Samples of split ``name`` (``train``/``val``; ``all`` is every sample)."""
        if name not in ("all", "train", "val"):
            raise StoreError(f"unknown split {name!r}: choose all, train or val")
        return StoreView(self, self.indices(split=name))

    def episode(self, episode_index: int) -> StoreView:
        idx = self.indices(episode=episode_index)
        if len(idx) == 0:
            raise StoreError(f"episode {episode_index} is not in this store (episodes {self.episodes[:10]}...)")
        return StoreView(self, idx)


class StoreView:
    """A subset of a store's samples (a split or an episode), indexed from 0."""

    def __init__(self, store: Store, indices: NDArray[np.int64]) -> None:
        self.store = store
        self.sample_indices = indices

    def __len__(self) -> int:
        return len(self.sample_indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.store[int(self.sample_indices[i])]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]




def open_store(path: str | os.PathLike[str], delta_timestamps: dict[str, Sequence[float]] | None = None,
               decode_images: bool = True) -> Store:
    """Open an eva_store directory (an exported accepted/ or rejected/ subset)."""
    return Store(path, delta_timestamps=delta_timestamps, decode_images=decode_images)
