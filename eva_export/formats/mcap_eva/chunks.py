"""A chunked MCAP writer that compresses chunks off the writer's thread.

mcap's own ``Writer`` copies every message three times on the caller's thread (into its
chunk builder, out of it, into the chunk record) and compresses there, so an export of raw
camera frames was CPU-bound at 0.18-0.28x of the disk. Here a message's large parts (the
frame's own buffer) are not copied at all: the open chunk is a list of views of them, with the
small parts (MessagePack and record heads) gathered into one buffer between them. A full chunk
goes to the process's small thread pool for its CRC and compression, both streamed over those
pieces (lz4, zstd and zlib release the GIL), while the next one fills; at most one chunk per
worker is in flight. Finished chunks are written in order, compressed bytes or the frames
themselves, by ``pwritev`` on an output thread that also hashes every byte of the file as it
goes (``sha256``: the manifest's digest, no read-back), in whole blocks past the page cache
(``written.DirectAppender``). So the writer's thread only gathers.
Records other than chunks are built with mcap's own record classes, and the file is the
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

from ..common.written import DirectAppender, StepThread

MAGIC = b"\x89MCAP0\r\n"
_MESSAGE_HEAD = struct.Struct("<BQHIQQ")  # opcode, record length, channel, sequence, log and publish time
_MESSAGE_FIXED = 2 + 4 + 8 + 8
_CHUNK_HEAD = struct.Struct("<BQQQQI")  # opcode, record length, start, end, uncompressed size and CRC
_SMALL = 64 << 10  # parts below this are copied into their chunk; larger ones are referenced
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FOOTER_HEAD = struct.Struct("<BQQQ")  # opcode, length, summary start, summary offset start (CRC'd)


Packed = tuple[list[Any], int, int]  # a chunk's data as buffers to write in order, their size, the CRC


def _packer(compression: str, level: int) -> Callable[[list[memoryview]], Packed]:
    """What a pool thread runs on a full chunk's pieces: their CRC and their compression, each
    streamed over the pieces as they are (the frames' own buffers: no copy into one record).
    lz4, zstd and zlib release the GIL. A compressor per call: one shared is not thread-safe."""
    if compression == "lz4":
        import lz4.frame  # type: ignore[import-untyped]

        # level 0 is liblz4's fast mode. A negative level is its fast acceleration (1 - level),
        # still a standard frame, but on camera frames it loses ratio faster than it gains speed
        # (-16: 2.4x the speed at half the ratio; README, Raw-frame formats, fourth pass).
        def start() -> Any:
            c = lz4.frame.LZ4FrameCompressor(compression_level=level)  # 64 KiB blocks: few copies
            return c, [c.begin()]
    elif compression == "zstd":
        import zstandard

        def start() -> Any:
            c = zstandard.ZstdCompressor(level=level or 3).compressobj()  # 3: zstandard.compress's level
            return c, []
    elif compression == "":
        def pack_raw(pieces: list[memoryview]) -> Packed:
            crc = 0
            for v in pieces:
                crc = zlib.crc32(v, crc)
            return pieces, sum(v.nbytes for v in pieces), crc
        return pack_raw
    else:
        raise ValueError(f"mcap chunk compression {compression!r}: lz4, zstd or ''")

    def pack(pieces: list[memoryview]) -> Packed:
        c, out = start()
        crc = 0
        for v in pieces:
            crc = zlib.crc32(v, crc)
            part = c.compress(v)
            if part:
                out.append(part)
        out.append(c.flush())
        return out, sum(len(o) for o in out), crc
    return pack


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


class _FileBytes:
    """The step of the writer's output thread (``written.StepThread``): each item (buffers in
    file order) hashed and written (``written.DirectAppender``: whole blocks (``DirectAppender.BLOCK``, 4 MiB) past the page
    cache where the file system takes it). The kernel's write path and SHA-256 both release
    the GIL, so they overlap with filling and compressing the next chunks."""

    def __init__(self, fh: BinaryIO) -> None:
        name = getattr(fh, "name", None)
        self._out = DirectAppender(fh.fileno(), name if isinstance(name, str) else None)
        self.sha = hashlib.sha256()

    def step(self, views: list[Any]) -> None:
        for v in views:
            self.sha.update(v)
        self._out.write(views)

    def finish(self) -> None:
        """The last bytes (under a block) written; after the output thread drained."""
        self._out.finish()

    def close(self) -> None:
        self._out.close()


@dataclass
class _Chunk:
    pieces: list[memoryview] = field(default_factory=list)  # the records, in order (views of the callers' buffers)
    small: bytearray = field(default_factory=bytearray)  # small parts since the last piece, copied together
    size: int = 0
    start: int = 0
    end: int = 0
    index: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # channel -> (log_time, offset)


class ChunkWriter:
    """Write an MCAP file (chunked, message-indexed, CRCs) to ``fh``; ``close`` always.

    A message's large parts are kept as views until their chunk is written: the caller must
    not change those buffers after ``add_message`` (frames from a decoder are fresh arrays).
    """

    def __init__(self, fh: BinaryIO, chunk_size: int, compression: str, workers: int | None = None,
                 level: int = 0) -> None:
        self.chunk_size = chunk_size
        self.compression = compression
        self._pack = _packer(compression, level)
        self._workers = workers if workers is not None else min(2, os.cpu_count() or 1)
        self._pending: deque[tuple[_Chunk, Future[Packed]]] = deque()
        self._pos = 0  # bytes written: offsets for the indexes without asking the file
        self._bytes = _FileBytes(fh)
        self._io: StepThread[list[Any]] = StepThread(self._bytes.step, "mcap-out", 2)  # 2 chunks behind at most
        self._chunk = _Chunk()
        self._schemas: list[Schema] = []
        self._channels: list[Channel] = []
        self._chunk_indexes: list[ChunkIndex] = []
        self._stats = Statistics(attachment_count=0, channel_count=0, channel_message_counts={}, chunk_count=0,
                                 message_count=0, message_end_time=0, message_start_time=0, metadata_count=0,
                                 schema_count=0)

    # ---- records outside chunks ----------------------------------------------------------------
    def _out(self, *views: Any) -> None:
        self._io.put(list(views))  # every byte of the file passes here, in order: hashed as written
        self._pos += sum(memoryview(v).nbytes for v in views)

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
        for v in views:
            if v.nbytes < _SMALL:  # message heads, schemas: gathered, so a chunk has few pieces
                ck.small += v
            else:  # a frame: kept as it is until written, not copied
                if ck.small:
                    ck.pieces.append(memoryview(ck.small))
                    ck.small = bytearray()
                ck.pieces.append(v)
            ck.size += v.nbytes

    def _submit(self, inline: bool) -> None:
        ck, self._chunk = self._chunk, _Chunk()
        if ck.small:
            ck.pieces.append(memoryview(ck.small))
        if not ck.size:
            return
        fut: Future[Packed]
        if inline:  # the last chunk, nothing to overlap it with
            fut = Future()
            fut.set_result(self._pack(ck.pieces))
        else:
            fut = _shared_pool(self._workers).submit(self._pack, ck.pieces)
        self._pending.append((ck, fut))
        # Bounded: a chunk compressing on every worker while the next fills (memory near hdf5's).
        while self._pending and (len(self._pending) > self._workers or self._pending[0][1].done()):
            self._write_chunk(*self._pending.popleft())

    def _write_chunk(self, ck: _Chunk, fut: Future[Packed]) -> None:
        data, size, crc = fut.result()
        comp = self.compression.encode()
        length = 8 + 8 + 8 + 4 + 4 + len(comp) + 8 + size
        start = self._pos
        head = (_CHUNK_HEAD.pack(Opcode.CHUNK, length, ck.start, ck.end, ck.size, crc)
                + _U32.pack(len(comp)) + comp + _U64.pack(size))
        index_start = start + len(head) + size
        b = RecordBuilder()
        offsets = {}
        for channel, records in ck.index.items():
            offsets[channel] = index_start + b.count
            MessageIndex(channel_id=channel, records=records).write(b)
        self._out(head, *data, _end(b))  # the chunk's bytes as they are (compressed or the frames)
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
        self._bytes.finish()
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
        self._bytes.close()
