"""formats/common/mp4_samples.py: the numpy pass over a long sample table answers exactly as the
sample-by-sample walk does (the same places, or a refusal), on seeded random tables, valid and
broken; and the one-pass NAL check refuses exactly the samples the walk refuses."""

from __future__ import annotations

import random

import pytest

from eva_export.formats.common import mp4_samples
from eva_export.formats.common.mp4_boxes import Unusual


def outcome(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except Unusual:
        return "unusual"


def table(rng: random.Random) -> tuple[list[int], list[tuple[int, int, int]], list[int], tuple[bytes, int, int]]:
    """A sample table as a muxer writes it, then perhaps broken in one field."""
    n_chunks = rng.randint(1, 12)
    spc = [rng.randint(1, 30) for _ in range(n_chunks)]
    sizes = [rng.randint(1, 900) for _ in range(sum(spc))]
    mdat = (b"mdat", 1000, 1000 + sum(sizes) + rng.choice([0, 0, 50]))
    chunks, at, k = [], mdat[1], 0
    for n in spc:
        chunks.append(at)
        at += sum(sizes[k:k + n])
        k += n
    runs = [(i + 1, n, 1) for i, n in enumerate(spc) if i == 0 or spc[i - 1] != n]
    how = rng.randrange(6)
    if how == 1:
        sizes[rng.randrange(len(sizes))] += rng.choice([1, 5000])
    elif how == 2:
        chunks[rng.randrange(len(chunks))] += rng.choice([-2000, -1, 1, 10 ** 7])
    elif how == 3:
        sizes.append(7) if rng.random() < 0.5 else sizes.pop()
    elif how == 4:
        r = rng.randrange(len(runs))
        runs[r] = (runs[r][0], runs[r][1] + rng.choice([-1, 1, 10 ** 9]) or 1, 1)
    elif how == 5:
        runs = runs[:-1] or runs
    return chunks, runs, sizes, mdat


def test_the_numpy_pass_places_samples_as_the_walk_does() -> None:
    rng = random.Random(45)
    seen = {"placed": 0, "unusual": 0}
    for _ in range(3000):
        chunks, runs, sizes, mdat = table(rng)
        want = outcome(mp4_samples._spans_loop, chunks, runs, sizes, mdat)
        got = outcome(mp4_samples._spans_vector, chunks, runs, sizes, mdat)
        assert got == want, (chunks, runs, sizes, mdat)
        seen["unusual" if want == "unusual" else "placed"] += 1
    assert min(seen.values()) > 500  # both answers were exercised


def walk_all(data: bytes, spans: list[tuple[int, int]]) -> None:
    for pos, n in spans:
        mp4_samples._walk_nals(data, pos, pos + n)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_one_pass_nal_check_refuses_what_the_walk_refuses(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        parts, spans, at = [], [], 0
        for _ in range(rng.randint(65, 120)):
            units = [bytes([rng.choice([0x65, 0x41, 0x06, 0x67, 0x68, 0x85, 0x01])]) + bytes(rng.randint(0, 6))
                     for _ in range(rng.choice([1, 1, 1, 2]))]
            body = b"".join(len(u).to_bytes(4, "big") + u for u in units)
            if rng.random() < 0.05:
                body = body[:-1] if len(body) > 5 else body + b"\0"
            if rng.random() < 0.03:
                body = (len(body) + 3).to_bytes(4, "big") + body[4:]
            parts.append(body)
            spans.append((at, len(body)))
            at += len(body)
        data = b"".join(parts)

        assert outcome(mp4_samples.check_nals, data, spans) == outcome(walk_all, data, spans)
