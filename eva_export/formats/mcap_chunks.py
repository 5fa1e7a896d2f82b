"""A chunked MCAP writer that compresses chunks off the writer's thread (issue 28).

mcap's own ``Writer`` copies every message three times on the caller's thread (into its
chunk builder, out of it, into the chunk record) and compresses there, so an export of raw
camera frames was CPU-bound at 0.18-0.28x of the disk. Here a message's parts (a MessagePack
head and the frame's own buffer) are copied once, into the open chunk (a reused buffer of fixed
capacity); a full chunk goes to the process's small thread pool for its CRC and compression
(lz4, zstd and zlib release the GIL) while the next one fills; finished chunks are written in
order, their compressed bytes straight to the file, by an output thread that also hashes every
byte of the file as it goes (``sha256``: the manifest's digest, no read-back). Records other than chunks are built with mcap's own record classes, and the file is the
layout mcap's Writer makes (schemas and channels in the first chunk, message indexes after
each chunk, a summary with schemas, channels, statistics and chunk indexes, summary offsets,
summary CRC), so mcap's reader (``validate_crcs=True``) reads it unchanged.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from mcap.data_stream import RecordBuilder
from mcap.opcode import Opcode
from mcap.records import (
    Channel,
    ChunkIndex,
    DataEnd,
    Footer,
    Header,
    McapRecord,
    MessageIndex,
    Schema,
    Statistics,
    SummaryOffset,
)

from .written import StepThread, start_writeback

MAGIC = b"\x89MCAP0\r\n"
_MESSAGE_HEAD = struct.Struct("<BQHIQQ")  # opcode, record length, channel, sequence, log and publish time
_MESSAGE_FIXED = 2 + 4 + 8 + 8
_CHUNK_HEAD = struct.Struct("<BQQQQI")  # opcode, record length, start, end, uncompressed size and CRC
WRITEBACK_BYTES = 8 << 20
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FOOTER_HEAD = struct.Struct("<BQQQ")  # opcode, length, summary start, summary offset start (CRC'd)


def _compressor(compression: str) -> Callable[[memoryview], Any]:
    if compression == "lz4":
        import lz4.frame  # type: ignore[import-untyped]

        return lz4.frame.compress  # type: ignore[no-any-return]
    if compression == "zstd":
        import zstandard

        return zstandard.compress  # a compressor per call: a shared one is not thread-safe
    if compression == "":
        return lambda data: data
    raise ValueError(f"mcap chunk compression {compression!r}: lz4, zstd or ''")


def _end(b: RecordBuilder) -> bytes:
    data: bytes = b.end()  # type: ignore[no-untyped-call]  # mcap's RecordBuilder.end has no annotations
    return data


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (pid, workers) -> the process's pool
_POOLS_LOCK = threading.Lock()


def _shared_pool(workers: int) -> ThreadPoolExecutor:
    """One compression pool per process, shared by its writers: threads (and their malloc
    arenas) are not made again for every episode file; a forked worker makes its own."""
    key = (os.getpid(), workers)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix="mcap-chunk")
        return _POOLS[key]


_Piece = tuple[Any, Callable[[], None] | None]  # bytes of the file, and what to run once written


class _FileBytes:
    """The step of the writer's output thread (``written.StepThread``, at most 8 pieces behind
    the writer): the file's bytes written and hashed in order. The kernel's write path (page
    cache, dirty-page throttling) and SHA-256 both release the GIL, so they overlap with filling
    the next chunk. ``release`` runs once its bytes are written (a chunk buffer they were a view
    of goes back to the writer)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.sha = hashlib.sha256()
        self._written = 0  # bytes whose writeback was started
        self._since = 0  # bytes written after those

    def step(self, item: _Piece) -> None:
        data, release = item
        self._write(data)
        self.sha.update(data)
        self._since += memoryview(data).nbytes
        if self._since >= WRITEBACK_BYTES:  # the disk busy while the next chunks compress
            start_writeback(self._fh.fileno(), self._written, self._since)
            self._written += self._since
            self._since = 0
        if release is not None:
            release()

    def _write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:  # the file is unbuffered: a short write is continued, not lost
            k = self._fh.write(view)
            if not k:
                raise OSError(f"write returned {k}")
            view = view[k:]


@dataclass
class _Chunk:
    buf: bytearray  # a reused buffer of fixed capacity: growing one by += fragmented the heap
    size: int = 0
    empty: bool = True
    start: int = 0
    end: int = 0
    index: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # channel -> (log_time, offset)


class ChunkWriter:
    """Write an MCAP file (chunked, message-indexed, CRCs) to ``fh``; ``close`` always."""

    def __init__(self, fh: BinaryIO, chunk_size: int, compression: str, workers: int | None = None) -> None:
        self._fh = fh
        self.chunk_size = chunk_size
        self.compression = compression
        self._compress = _compressor(compression)
        self._workers = workers if workers is not None else min(2, os.cpu_count() or 1)
        self._free: list[bytearray] = []  # buffers of written chunks, for the next ones
        self._capacity = chunk_size + (2 << 20)  # a chunk ends at the first message past chunk_size
        self._pending: deque[tuple[_Chunk, Future[tuple[Any, int]]]] = deque()
        self._pos = 0  # bytes written: offsets for the indexes without asking the file
        self._bytes = _FileBytes(fh)
        self._io: StepThread[_Piece] = StepThread(self._bytes.step, "mcap-out", 8)
        self._chunk = self._new_chunk()
        self._schemas: list[Schema] = []
        self._channels: list[Channel] = []
        self._chunk_indexes: list[ChunkIndex] = []
        self._stats = Statistics(attachment_count=0, channel_count=0, channel_message_counts={}, chunk_count=0,
                                 message_count=0, message_end_time=0, message_start_time=0, metadata_count=0,
                                 schema_count=0)

    # ---- records outside chunks ----------------------------------------------------------------
    def _out(self, data: Any, release: Callable[[], None] | None = None) -> None:
        self._io.put((data, release))  # every byte of the file passes here, in order: hashed as written
        self._pos += memoryview(data).nbytes

    @property
    def sha256(self) -> str:
        """SHA-256 of the whole file, once ``finish`` returned (the manifest's digest)."""
        return self._bytes.sha.hexdigest()

    def _records(self, *records: McapRecord) -> None:
        b = RecordBuilder()
        for r in records:
            r.write(b)
        self._out(_end(b))

    def start(self, profile: str, library: str) -> None:
        self._out(MAGIC)
        self._records(Header(profile=profile, library=library))

    def register_schema(self, name: str, encoding: str, data: bytes) -> int:
        schema = Schema(id=len(self._schemas) + 1, name=name, encoding=encoding, data=data)
        self._schemas.append(schema)
        self._in_chunk(schema)
        return schema.id

    def register_channel(self, topic: str, message_encoding: str, schema_id: int, metadata: dict[str, str]) -> int:
        channel = Channel(id=len(self._channels) + 1, topic=topic, message_encoding=message_encoding,
                          schema_id=schema_id, metadata=metadata)
        self._channels.append(channel)
        self._in_chunk(channel)
        return channel.id

    def _in_chunk(self, record: McapRecord) -> None:
        """Schemas and channels go into the open chunk, as mcap's Writer puts them: under its CRC."""
        b = RecordBuilder()
        record.write(b)
        self._append(self._chunk, memoryview(_end(b)))

    # ---- messages and chunks -------------------------------------------------------------------
    def add_message(self, channel: int, log_time: int, publish_time: int, sequence: int, *parts: Any) -> None:
        """One message whose data is ``parts`` concatenated (bytes-like, C-contiguous)."""
        views = [memoryview(p).cast("B") for p in parts]
        size = sum(v.nbytes for v in views)
        ck, st = self._chunk, self._stats
        if not ck.index:
            ck.start = ck.end = log_time
        ck.start, ck.end = min(ck.start, log_time), max(ck.end, log_time)
        ck.index.setdefault(channel, []).append((log_time, ck.size))
        head = _MESSAGE_HEAD.pack(Opcode.MESSAGE, _MESSAGE_FIXED + size, channel, sequence, log_time, publish_time)
        self._append(ck, memoryview(head), *views)
        if st.message_count == 0:
            st.message_start_time = st.message_end_time = log_time
        st.message_start_time = min(st.message_start_time, log_time)
        st.message_end_time = max(st.message_end_time, log_time)
        st.message_count += 1
        st.channel_message_counts[channel] = st.channel_message_counts.get(channel, 0) + 1
        if ck.size >= self.chunk_size:
            self._submit(inline=False)

    @staticmethod
    def _append(ck: _Chunk, *views: memoryview) -> None:
        need = ck.size + sum(v.nbytes for v in views)
        if need > len(ck.buf):  # a message larger than the slack: a new buffer (never resized in
            grown = bytearray(max(2 * len(ck.buf), need))  # place: a worker may hold a view of it)
            grown[:ck.size] = memoryview(ck.buf)[:ck.size]
            ck.buf = grown
        for v in views:
            ck.buf[ck.size:ck.size + v.nbytes] = v  # same-length slice: a copy, no resize
            ck.size += v.nbytes
        ck.empty = False

    def _new_chunk(self) -> _Chunk:
        return _Chunk(self._free.pop() if self._free else bytearray(self._capacity))

    def _pack(self, data: memoryview) -> tuple[Any, int]:
        return self._compress(data), zlib.crc32(data)

    def _submit(self, inline: bool) -> None:
        ck, self._chunk = self._chunk, self._new_chunk()
        if ck.empty:
            self._free.append(ck.buf)
            return
        fut: Future[tuple[Any, int]]
        if inline:  # the last chunk, nothing to overlap it with
            fut = Future()
            fut.set_result(self._pack(memoryview(ck.buf)[:ck.size]))
        else:
            fut = _shared_pool(self._workers).submit(self._pack, memoryview(ck.buf)[:ck.size])
        self._pending.append((ck, fut))
        # Bounded: one chunk compressing per worker while the next fills (memory near hdf5's).
        while self._pending and (len(self._pending) >= self._workers or self._pending[0][1].done()):
            self._write_chunk(*self._pending.popleft())

    def _write_chunk(self, ck: _Chunk, fut: Future[tuple[Any, int]]) -> None:
        data, crc = fut.result()
        comp = self.compression.encode()
        size = memoryview(data).nbytes
        length = 8 + 8 + 8 + 4 + 4 + len(comp) + 8 + size
        start = self._pos
        self._out(_CHUNK_HEAD.pack(Opcode.CHUNK, length, ck.start, ck.end, ck.size, crc)
                  + _U32.pack(len(comp)) + comp + _U64.pack(size))
        buf = ck.buf
        if self.compression:  # the compressed bytes as they are: no copy into a record buffer
            self._out(data)
            self._free.append(buf)
        else:  # a view of the chunk's buffer: reused only once written
            self._out(data, lambda: self._free.append(buf))
        index_start = self._pos
        b = RecordBuilder()
        offsets = {}
        for channel, records in ck.index.items():
            offsets[channel] = index_start + b.count
            MessageIndex(channel_id=channel, records=records).write(b)
        self._out(_end(b))
        self._chunk_indexes.append(ChunkIndex(
            message_start_time=ck.start, message_end_time=ck.end, chunk_start_offset=start,
            chunk_length=index_start - start, message_index_offsets=offsets,
            message_index_length=self._pos - index_start, compression=self.compression,
            compressed_size=size, uncompressed_size=ck.size))
        self._stats.chunk_count += 1

    # ---- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        """The last chunk, then data end, summary, summary offsets, footer and magic."""
        self._submit(inline=not self._pending)
        while self._pending:
            self._write_chunk(*self._pending.popleft())
        self._records(DataEnd(data_section_crc=0))
        summary_start = self._pos
        self._stats.schema_count, self._stats.channel_count = len(self._schemas), len(self._channels)
        b = RecordBuilder()
        groups: list[SummaryOffset] = []
        for opcode, records in ((Opcode.SCHEMA, self._schemas), (Opcode.CHANNEL, self._channels),
                                (Opcode.STATISTICS, [self._stats]), (Opcode.CHUNK_INDEX, self._chunk_indexes)):
            begin = b.count
            for r in records:
                r.write(b)
            groups.append(SummaryOffset(group_opcode=opcode, group_start=summary_start + begin,
                                        group_length=b.count - begin))
        offsets_start = summary_start + b.count
        for g in groups:
            g.write(b)
        summary = _end(b)
        crc = zlib.crc32(_FOOTER_HEAD.pack(Opcode.FOOTER, 8 + 8 + 4, summary_start, offsets_start),
                         zlib.crc32(summary))
        self._out(summary)
        self._records(Footer(summary_start=summary_start, summary_offset_start=offsets_start, summary_crc=crc))
        self._out(MAGIC)
        self._io.drain()
        self.close()

    def close(self) -> None:
        """Drop the chunks not yet written (the caller removes a file that did not finish)
        and wait for their compression, so no worker touches this writer's buffers after."""
        futures = [f for _, f in self._pending]
        self._pending.clear()
        for f in futures:
            f.cancel()
        wait(futures)
        self._io.close()
        self._free.clear()
