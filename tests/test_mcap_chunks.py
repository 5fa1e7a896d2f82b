"""mcap_chunks.ChunkWriter against mcap's own reader: many chunks compressed off the thread,
read back seeking (summary, chunk and message indexes) and streaming, CRCs validated."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from mcap.exceptions import McapError
from mcap.reader import make_reader
from mcap.records import Channel, Message
from mcap.stream_reader import CRCValidationError, StreamReader

from eva_export.formats.mcap_eva.chunks import ChunkWriter


def _write(path: Path, compression: str, n: int = 40) -> list[tuple[str, int, int, bytes]]:
    """Two channels, ``n`` messages each, 10 KB apiece in 16 KB chunks: about 50 chunks."""
    sent = []
    with open(path, "wb", buffering=0) as fh:
        w = ChunkWriter(fh, 16 * 1024, compression, workers=2)
        try:
            w.start("test-profile", "test-lib")
            sid = w.register_schema("s", "jsonschema", b"{}")
            chans = {t: w.register_channel(t, "raw", sid, {"k": t}) for t in ("a", "b")}
            for i in range(n):
                for t, c in chans.items():
                    head, body = f"{t}{i}:".encode(), bytes([i % 251]) * 10_000
                    w.add_message(c, (i + 1) * 1000, (i + 1) * 1000 + 1, i, head, memoryview(body))
                    sent.append((t, i, (i + 1) * 1000, head + body))
            w.finish()
        finally:
            w.close()
    return sent


@pytest.mark.parametrize("compression", ["lz4", "zstd", ""])
def test_written_file_reads_back_seeking_and_streaming(tmp_path: Path, compression: str) -> None:
    path = tmp_path / "f.mcap"
    sent = _write(path, compression)
    with open(path, "rb") as fh:
        reader = make_reader(fh, validate_crcs=True)
        assert reader.get_header().profile == "test-profile"
        summary = reader.get_summary()
        assert summary is not None and summary.statistics is not None
        assert len(summary.chunk_indexes) > 20 and summary.statistics.chunk_count == len(summary.chunk_indexes)
        assert all(ci.compression == compression for ci in summary.chunk_indexes)
        assert summary.statistics.message_count == 80
        assert sorted(summary.statistics.channel_message_counts.values()) == [40, 40]
        assert (summary.statistics.message_start_time, summary.statistics.message_end_time) == (1000, 40_000)
        got = [(c.topic, m.sequence, m.log_time, m.data) for _, c, m in reader.iter_messages(log_time_order=True)]
        assert sorted(got) == sorted(sent)
        only_b = [m.sequence for _, _, m in reader.iter_messages(topics=["b"], starting_at=5000, ending_before=8000)]
        assert only_b == [4, 5, 6]  # through the chunk and message indexes
    with open(path, "rb") as fh:
        records = list(StreamReader(io.BufferedReader(fh), validate_crcs=True).records)
    streamed = [r for r in records if isinstance(r, Message)]  # the chunks' records, decompressed
    topics = {r.id: r.topic for r in records if isinstance(r, Channel)}
    assert [(topics[m.channel_id], m.sequence, m.log_time, m.data) for m in streamed] == sent  # in write order


def test_a_flipped_byte_in_a_chunk_fails_the_crc(tmp_path: Path) -> None:
    path = tmp_path / "f.mcap"
    _write(path, "")  # uncompressed: the byte lands in message data, not in a frame header
    data = bytearray(path.read_bytes())
    pos = data.index(b"a7:") + 100
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    with open(path, "rb") as fh, pytest.raises(CRCValidationError):
        list(make_reader(fh, validate_crcs=True).iter_messages())


def test_close_without_finish_leaves_no_work_and_the_pool_serves_the_next_file(tmp_path: Path) -> None:
    with open(tmp_path / "cut.mcap", "wb", buffering=0) as fh:
        w = ChunkWriter(fh, 1024, "lz4", workers=2)
        w.start("p", "l")
        c = w.register_channel("a", "raw", 0, {})
        for i in range(20):
            w.add_message(c, i, i, i, bytes(2048))
        w.close()  # as on an export error: the chunks in flight are dropped
    assert not w._pending
    with open(tmp_path / "cut.mcap", "rb") as fh, pytest.raises(McapError):
        make_reader(fh).get_summary()  # no footer: never mistaken for a finished file
    sent = _write(tmp_path / "next.mcap", "lz4", n=5)
    with open(tmp_path / "next.mcap", "rb") as fh:
        got = [(c.topic, m.sequence, m.log_time, m.data) for _, c, m in make_reader(fh, validate_crcs=True).iter_messages()]
    assert sorted(got) == sorted(sent)


def test_a_message_larger_than_the_chunk_buffer(tmp_path: Path) -> None:
    path = tmp_path / "big.mcap"
    big = bytes(range(256)) * (12 << 12)  # 12 MiB: past the 16 KiB chunk and its 2 MiB slack
    with open(path, "wb", buffering=0) as fh:
        w = ChunkWriter(fh, 16 * 1024, "lz4", workers=2)
        w.start("p", "l")
        c = w.register_channel("a", "raw", 0, {})
        w.add_message(c, 1, 1, 0, b"x" * 100)
        w.add_message(c, 2, 2, 1, b"h", big)
        w.add_message(c, 3, 3, 2, b"tail")
        w.finish()
    with open(path, "rb") as fh:
        got = [m.data for _, _, m in make_reader(fh, validate_crcs=True).iter_messages()]
    assert got == [b"x" * 100, b"h" + big, b"tail"]
