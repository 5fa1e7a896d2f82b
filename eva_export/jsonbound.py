"""Bounded JSON parsing for metadata that comes from other machines.

Python's ``json`` turns ``1e400`` into ``inf`` (then ``int()`` raises OverflowError), recurses
once per nesting level (100,000 ``[`` raise RecursionError) and reads any line length. Here
every number literal must be finite and every integer at most ``INT_DIGITS_MAX`` digits, the
nesting depth is capped before parsing, and every failure is a ``ValueError`` whose message
names the line. The constants ``NaN``/``Infinity`` stay accepted: statistics of a column holding
NaN are written that way by our own writer and by LeRobot's.

Decoded records then take their fields through ``as_int`` / ``as_str`` / ``as_list`` /
``as_dict`` / ``check_bounds``: exact JSON types (an integer is not a boolean, a float or a
string) and bounded sizes (texts as long as a review note, key and item counts), each refusal a
ValueError naming the field. Row files are read line by line under ``ROW_MAX_BYTES`` and
``BLANK_LINES_MAX`` (fsutil.iter_jsonl_spans).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, SupportsFloat, SupportsIndex, SupportsInt

import numpy as np

#: Deepest nesting of arrays/objects accepted (our deepest record nests about 6 levels).
MAX_DEPTH = 64
#: Longest integer literal (int64 has 19 digits; anything longer is not a count or an index).
INT_DIGITS_MAX = 20
#: Largest JSON document (a whole file, or one line of a JSON Lines file), in bytes.
MAX_BYTES = 64 << 20

_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
# A number that could be out of range has a 3-digit exponent or a run of over INT_DIGITS_MAX
# digits; a text with neither is parsed without the per-number hooks (two million calls on a
# 1000-episode export). A match (maybe inside a string) just takes the hooked parse.
# Each byte as its class: digit -> "0", e/E -> "e", +/- -> "+", anything else -> " ".
_CLASS_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else 0x65 if b in b"eE" else 0x2B if b in b"+-" else 0x20
                   for b in range(256))
_LONG_RUN = b"0" * (INT_DIGITS_MAX + 1)


def _plain(text: str) -> bool:
    """No 3-digit exponent (``[eE][+-]?[0-9]{3}``) and no run of more than INT_DIGITS_MAX digits:
    substring searches in one byte translation of the text. (A regex costs more than json.loads
    on a stats line: it stops at every "e" of every key; a regex for the run backtracks.)"""
    classes = text.encode("utf-8", "surrogatepass").translate(_CLASS_MAP)
    return b"e000" not in classes and b"e+000" not in classes and _LONG_RUN not in classes


class _OutOfRange(ValueError):
    """A number literal past the bounds; carries the literal so the line can be found."""

    def __init__(self, literal: str, why: str) -> None:
        super().__init__(why)
        self.literal = literal


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _OutOfRange(literal, f"number {literal[:24]} is out of range (not a finite float)")
    return value


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > INT_DIGITS_MAX:
        raise _OutOfRange(literal, f"integer {literal[:24]}... ({len(literal)} digits) is out of range")
    return int(literal)


# Every byte but the quote, backslash and bracket ones (deleted before the nesting is counted).
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"\\[]{}')
_QUOTED_RE = re.compile(rb'"[^"]*"')
_STEP = [0] * 256
_STEP[0x5B] = _STEP[0x7B] = 1
_STEP[0x5D] = _STEP[0x7D] = -1
_STEPS = np.array(_STEP, np.int8)


def depth(text: str) -> int:
    """Deepest bracket nesting of a JSON text (brackets inside strings do not count)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0  # cannot be deeper than the number of opening brackets
    raw = text.encode("utf-8", "surrogatepass")
    marks = raw.translate(None, _NOT_STRUCTURE)  # quotes and brackets only: a tenth of a stats line
    if b"\\" not in marks:
        # No escapes: each string is exactly a pair of quotes (UTF-8 multibyte characters hold
        # no ASCII bytes), so dropping the pairs leaves the structure.
        if marks.count(b'"') % 2 == 0:
            # every quote paired: a bracket is inside a string when an odd number of quotes
            # precede it; five numpy passes, under half the pairs' regex and a Python fold
            codes = np.frombuffer(marks, np.uint8)
            steps = _STEPS[codes]
            steps[(np.cumsum(codes == 0x22) & 1).astype(bool)] = 0
            return int(steps.cumsum(dtype=np.int64).max(initial=0))
        # an unterminated string: its quote is left unpaired and what follows it counts, as before
        return max(itertools.accumulate(map(_STEP.__getitem__, _QUOTED_RE.sub(b"", marks))), default=0)
    codes = np.frombuffer(_STRING_RE.sub("", text).encode("utf-8", "surrogatepass"), np.uint8)
    # comparisons, not np.isin: the same steps at a third of the cost on a line-sized text
    steps = (((codes == 0x5B) | (codes == 0x7B)).astype(np.int64)
             - ((codes == 0x5D) | (codes == 0x7D)).astype(np.int64))
    return int(np.cumsum(steps).max(initial=0))


def _line_of(text: str, needle: str) -> int:
    pos = text.find(needle)
    return text.count("\n", 0, pos) + 1 if pos >= 0 else 1


def loads(text: str, first_line: int = 1) -> Any:
    """Parse one JSON document under the bounds; ValueError("line N: ...") on any fault."""
    if len(text) > MAX_BYTES:
        raise ValueError(f"line {first_line}: {len(text)} characters, more than the {MAX_BYTES} accepted")
    if depth(text) > MAX_DEPTH:
        raise ValueError(f"line {first_line}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        if _plain(text):  # no literal can overflow: no per-number hook
            return json.loads(text)
        return json.loads(text, parse_float=_finite_float, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {first_line + exc.lineno - 1}: invalid JSON ({exc.msg})") from None
    except _OutOfRange as exc:  # raised in a parse hook, which knows no position: search the literal
        raise ValueError(f"line {first_line + _line_of(text, exc.literal) - 1}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. int() digit limits; depth was capped above
        raise ValueError(f"line {first_line}: {exc}") from None


def decode(data: bytes, first_line: int = 1) -> str:
    """UTF-8 text of a document or line; ValueError naming the line when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise ValueError(f"line {line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None


#: Range of every count, index and size read from metadata (int64).
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
#: Longest free text (a note, a task, a quality issue's detail, any string of a row) read from a source,
#: in UTF-8 bytes: the bound of a review note (confine.NOTE_MAX_BYTES).
TEXT_MAX_BYTES = 4096
#: Most keys of one object read from a row (an episode row has about ten).
KEYS_MAX = 1024
#: Most items of one array in a row (frame ranges of a quality issue can be many; the line
#: length bounds them too).
ITEMS_MAX = 1 << 16
#: Longest line of a row file (episodes.jsonl, tasks.jsonl, the quality sidecar): a row is a few
#: hundred bytes; a 50 MB one is refused after reading this much, not parsed.
ROW_MAX_BYTES = 4 << 20
#: Most keys in one row line, counted as colons before parsing (a colon inside a string counts
#: too: an overcount only refuses sooner). 300,000 keys in a 4 MiB line took 1.3 s to parse.
ROW_KEYS_MAX = 1 << 16
#: Most blank lines a JSON Lines file may hold (50 million of them would take a minute to skip).
BLANK_LINES_MAX = 1000


def _kind(value: object) -> str:
    """A value's JSON kind and a short view of it, for a refusal message (never the whole value)."""
    kind = {bool: "boolean", float: "float", str: "string", type(None): "null", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)
    if isinstance(value, (list, dict)):
        return f"{kind} of {len(value)} items"
    return f"{kind} {str(value)[:40]!r}" if isinstance(value, str) else f"{kind} {str(value)[:40]}"


def as_int(value: object, what: str, lo: int = INT_MIN, hi: int = INT_MAX) -> int:
    """A metadata field that must be a JSON integer in [lo, hi]: a boolean, a float (even 90.0),
    a string ("2"), null, an array or an object is refused by name, never converted."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} is {_kind(value)}, expected an integer")
    out = int(value)
    if not lo <= out <= hi:
        want = ("within the int64 range" if (lo, hi) == (INT_MIN, INT_MAX) else
                "non-negative (and within int64)" if (lo, hi) == (0, INT_MAX) else f"within [{lo}, {hi}]")
        raise ValueError(f"{what} is {str(out)[:40]}; it must be {want}")
    return out


def as_str(value: object, what: str, max_bytes: int = TEXT_MAX_BYTES) -> str:
    """A metadata field that must be a JSON string of at most ``max_bytes`` UTF-8 bytes."""
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_kind(value)}, expected a string")
    if len(value) > max_bytes // 4 and (size := len(value.encode("utf-8", "surrogatepass"))) > max_bytes:
        raise ValueError(f"{what} is {size} bytes of text; at most {max_bytes} are accepted")
    return value


def check_bounds(value: object, what: str, max_text: int = TEXT_MAX_BYTES, max_items: int = ITEMS_MAX) -> None:
    """Every string in a decoded value at most ``max_text`` bytes, every object at most
    KEYS_MAX keys (each a bounded string) and every array at most ``max_items`` items; a
    refusal names ``what`` (the field holding the value)."""
    quick = max_text // 4  # a str of at most this many characters cannot exceed max_text bytes
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if len(v) > quick:
                as_str(v, f"a text in {what}", max_text)
        elif isinstance(v, dict):
            if len(v) > KEYS_MAX:
                raise ValueError(f"{what} has an object of {len(v)} keys; at most {KEYS_MAX} are accepted")
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            if len(v) > max_items:
                raise ValueError(f"{what} has an array of {len(v)} items; at most {max_items} are accepted")
            stack.extend(v)


def as_dict(value: object, what: str) -> dict[str, Any]:
    """A metadata field that must be a JSON object (``"features": []`` is refused by name)."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {type(value).__name__}, expected a JSON object")
    return value


def int_like(value: object) -> int:
    """``int(value)`` of a decoded value, as Python takes it ("30", 30.0 and True too): for
    readers that always converted leniently; the same TypeError for any other kind."""
    if isinstance(value, (str, bytes, bytearray, SupportsInt, SupportsIndex)):
        return int(value)
    raise TypeError(f"int() argument must be a string, a bytes-like object or a real number, "
                    f"not '{type(value).__name__}'")


def float_like(value: object) -> float:
    """``float(value)`` of a decoded value, as Python takes it; the same TypeError otherwise."""
    if isinstance(value, (str, bytes, bytearray, SupportsFloat, SupportsIndex)):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not '{type(value).__name__}'")


def as_list(value: object, what: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} is {type(value).__name__}, expected a JSON array")
    return list(value)
