"""Streaming decoded messages out of a rosbag2 (MCAP) recording, record by record in file order
(the order the recorder received them in), for bag ingest (ingest.py). A damaged file ends the
stream and says where (``BagReader.damage``); what was read before the damage is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcap.exceptions import McapError
from mcap.records import Channel, Message, Schema
from mcap.stream_reader import StreamReader
from mcap_ros2.decoder import DecoderFactory

from .bagfiles import BagFiles, IngestError

log = logging.getLogger(__name__)


@dataclass
class BagMessage:
    log_time: float  # seconds (the recorder's receive clock)
    topic: str
    type_name: str
    data_size: int
    msg: Any  # decoded message (attribute names as in rclpy)


@dataclass
class BagReader:
    """Streams decoded messages of the wanted topics; a damaged file ends the stream (``damage``)."""

    bag: BagFiles
    topics: set[str]
    check_type: Callable[[str, str], None]
    damage: str = ""
    bytes_read: int = 0
    backwards: int = 0  # wanted messages logged earlier than the one before them
    first_backwards: str = ""
    _last_ns: int = -1
    _decoders: dict[tuple[str, int], Any] = field(default_factory=dict)

    def _note_time(self, f: Path, topic: str, log_ns: int) -> None:
        if log_ns < self._last_ns:
            self.backwards += 1
            if not self.first_backwards:
                self.first_backwards = (f"{f.name}: {topic} logged at {log_ns * 1e-9:.6f} s after a message at "
                                        f"{self._last_ns * 1e-9:.6f} s")
        self._last_ns = max(self._last_ns, log_ns)

    def __iter__(self) -> Iterator[BagMessage]:
        factory = DecoderFactory()
        for f in self.bag.files:
            schemas: dict[int, Schema] = {}
            channels: dict[int, Channel] = {}
            with open(f, "rb") as fh:
                try:
                    for rec in StreamReader(fh).records:
                        if isinstance(rec, Schema):
                            schemas[rec.id] = rec
                        elif isinstance(rec, Channel):
                            channels[rec.id] = rec
                            if rec.topic in self.topics:
                                sch = schemas.get(rec.schema_id)
                                self.check_type(rec.topic, sch.name if sch else "")
                        elif isinstance(rec, Message):
                            self.bytes_read = self.bytes_read + len(rec.data)
                            ch = channels.get(rec.channel_id)
                            if ch is None or ch.topic not in self.topics:
                                continue
                            key = (str(f), rec.channel_id)
                            dec = self._decoders.get(key)
                            sch = schemas.get(ch.schema_id)
                            if dec is None:
                                dec = self._decoders[key] = factory.decoder_for(ch.message_encoding, sch)
                                if dec is None:
                                    raise IngestError(f"topic {ch.topic}: cannot decode encoding "
                                                      f"{ch.message_encoding!r}")
                            self._note_time(f, ch.topic, rec.log_time)
                            yield BagMessage(rec.log_time * 1e-9, ch.topic, sch.name if sch else "",
                                             len(rec.data), dec(rec.data))
                except IngestError:
                    raise
                except (McapError, EOFError, ValueError, OSError, Exception) as exc:  # noqa: BLE001
                    # a recorder killed mid-write leaves a cut chunk or no footer: keep what was read
                    self.damage = (f"bag file {f.name} is damaged after {self.bytes_read} message bytes "
                                   f"({type(exc).__name__}: {exc}); the recording was read up to the damage")
                    log.warning(self.damage)
                    return
