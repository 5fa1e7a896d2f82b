"""Streaming decoded messages out of a rosbag2 (MCAP) recording, record by record in file order
(the order the recorder received them in), for bag ingest (ingest.py). A damaged file ends the
stream and says where (``BagReader.damage``); what was read before the damage is kept.

The top-level records come from mcap's ``StreamReader`` with chunks handed over whole (one read
per chunk); the records inside a chunk are walked here over a ``memoryview``, so a camera frame
is never copied between the file read and the encoder (image messages: bagcdr.py).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from mcap.data_stream import ReadDataStream
from mcap.exceptions import McapError
from mcap.opcode import Opcode
from mcap.records import Channel, Chunk, Message, Schema
from mcap.stream_reader import StreamReader
from mcap_ros2.decoder import DecoderFactory

from . import cdr as bagcdr
from .files import BagFiles, IngestError

log = logging.getLogger(__name__)

_RECORD = struct.Struct("<BQ")  # opcode, length
_MESSAGE = struct.Struct("<HIQQ")  # channel id, sequence, log time, publish time


@dataclass
class BagMessage:
    log_time: float  # seconds (the recorder's receive clock)
    topic: str
    type_name: str
    data_size: int
    msg: Any  # decoded message (attribute names as in rclpy)


class ChunkDamage(McapError):
    """A chunk whose records do not tile its data (a file cut inside the chunk)."""


def chunk_data(chunk: Chunk) -> bytes:
    """The chunk's records, decompressed (a cut is found by ``chunk_records``)."""
    if chunk.compression == "zstd":
        import zstandard

        data: bytes = zstandard.decompress(chunk.data, chunk.uncompressed_size)
    elif chunk.compression == "lz4":
        import lz4.frame  # type: ignore[import-untyped]

        data = lz4.frame.decompress(chunk.data)
    elif chunk.compression == "":
        data = chunk.data
    else:
        raise ChunkDamage(f"chunk compression {chunk.compression!r} is not supported")
    return data


def chunk_records(data: bytes) -> list[tuple[int, int, int]]:
    """(opcode, start, end) of every record in a chunk; the whole chunk is checked before any of
    its records is used (as mcap's own reader does: a cut chunk gives none of its messages)."""
    out: list[tuple[int, int, int]] = []
    pos, n = 0, len(data)
    while pos < n:
        if pos + _RECORD.size > n:
            raise ChunkDamage(f"a record header is cut at chunk byte {pos}")
        op, length = _RECORD.unpack_from(data, pos)
        start = pos + _RECORD.size
        pos = start + length
        if pos > n:
            raise ChunkDamage(f"record at chunk byte {start - _RECORD.size} needs {pos} bytes, the chunk has {n}")
        out.append((op, start, pos))
    return out


@dataclass
class BagReader:
    """Streams decoded messages of the wanted topics; a damaged file ends the stream (``damage``)."""

    bag: BagFiles
    topics: set[str]
    check_type: Callable[[str, str], None]
    damage: str = ""
    file_name: str = ""  # the file being read (for errors about its messages)
    bytes_read: int = 0
    backwards: int = 0  # wanted messages logged earlier than the one before them
    first_backwards: str = ""
    _last_ns: int = -1
    _decoders: dict[tuple[str, int], Any] = field(default_factory=dict)
    _schemas: dict[int, Schema] = field(default_factory=dict)
    _channels: dict[int, Channel] = field(default_factory=dict)
    _factory: Any = None

    def _note_time(self, f: Path, topic: str, log_ns: int) -> None:
        if log_ns < self._last_ns:
            self.backwards += 1
            if not self.first_backwards:
                self.first_backwards = (f"{f.name}: {topic} logged at {log_ns * 1e-9:.6f} s after a message at "
                                        f"{self._last_ns * 1e-9:.6f} s")
        self._last_ns = max(self._last_ns, log_ns)

    def _schema_or_channel(self, rec: Schema | Channel) -> None:
        if isinstance(rec, Schema):
            self._schemas[rec.id] = rec
            return
        self._channels[rec.id] = rec
        if rec.topic in self.topics:
            sch = self._schemas.get(rec.schema_id)
            self.check_type(rec.topic, sch.name if sch else "")

    def _message(self, f: Path, channel_id: int, log_ns: int, payload: memoryview | bytes) -> BagMessage | None:
        self.bytes_read += len(payload)
        ch = self._channels.get(channel_id)
        if ch is None or ch.topic not in self.topics:
            return None
        sch = self._schemas.get(ch.schema_id)
        type_name = sch.name if sch else ""
        msg: Any = bagcdr.decode(type_name, memoryview(payload)) if ch.message_encoding == "cdr" else None
        if msg is None:
            key = (str(f), channel_id)
            dec = self._decoders.get(key)
            if dec is None:
                dec = self._decoders[key] = self._factory.decoder_for(ch.message_encoding, sch)
                if dec is None:
                    raise IngestError(f"topic {ch.topic}: cannot decode encoding {ch.message_encoding!r}")
            msg = dec(bytes(payload))
        self._note_time(f, ch.topic, log_ns)
        return BagMessage(log_ns * 1e-9, ch.topic, type_name, len(payload), msg)

    def _chunk(self, f: Path, chunk: Chunk) -> Iterator[BagMessage]:
        data = chunk_data(chunk)
        view = memoryview(data)
        for op, start, end in chunk_records(data):
            if op == Opcode.MESSAGE:
                if end - start < _MESSAGE.size:
                    raise ChunkDamage(f"a message record of {end - start} bytes")
                channel_id, _seq, log_ns, _pub = _MESSAGE.unpack_from(data, start)
                m = self._message(f, channel_id, log_ns, view[start + _MESSAGE.size:end])
                if m is not None:
                    yield m
            elif op in (Opcode.SCHEMA, Opcode.CHANNEL):
                stream = ReadDataStream(BytesIO(data[start:end]))
                self._schema_or_channel(Schema.read(stream) if op == Opcode.SCHEMA else Channel.read(stream))

    def _records(self, f: Path) -> Iterator[BagMessage]:
        with open(f, "rb") as fh:
            for rec in StreamReader(fh, emit_chunks=True).records:
                if isinstance(rec, Chunk):
                    yield from self._chunk(f, rec)
                elif isinstance(rec, (Schema, Channel)):
                    self._schema_or_channel(rec)
                elif isinstance(rec, Message):
                    m = self._message(f, rec.channel_id, rec.log_time, rec.data)
                    if m is not None:
                        yield m

    def __iter__(self) -> Iterator[BagMessage]:
        self._factory = DecoderFactory()
        for f in self.bag.files:
            # ids are per file: a split bag's next file declares its own schemas and channels
            self._schemas, self._channels = {}, {}
            self.file_name = str(f)
            try:
                yield from self._records(f)
            except IngestError:
                raise
            except (McapError, EOFError, ValueError, OSError, Exception) as exc:  # noqa: BLE001
                # a recorder killed mid-write leaves a cut chunk or no footer: keep what was read
                self.damage = (f"bag file {f.name} is damaged after {self.bytes_read} message bytes "
                               f"({type(exc).__name__}: {exc}); the recording was read up to the damage")
                log.warning(self.damage)
                return
