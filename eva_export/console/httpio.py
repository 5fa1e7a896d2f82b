"""Bounded parsing of what a browser (or anyone on loopback) sends the console.

Every value taken from a request goes through here, so that bad input ends in ``Refused`` (a 4xx
with a reason) instead of an exception that closes the connection unanswered: Python's ``int``
raises on 4300+ digit strings, ``int(float('inf'))`` raises OverflowError, and a lone surrogate
in a JSON string cannot be encoded into a ROS message.
"""

from __future__ import annotations

import json
import mimetypes
import re
from http import HTTPStatus
from io import BufferedIOBase
from pathlib import Path
from typing import NoReturn

#: Episode indices are int32 in the ROS interfaces.
MAX_INDEX = 2**31 - 1
#: Byte offsets: 19 digits cover any file size (int64).
MAX_OFFSET_DIGITS = 19
MAX_NOTE = 4000
MAX_NAME = 255
CHUNK = 256 * 1024


class Refused(Exception):
    """Bad input: answered with ``status`` and the message as the reason."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def bounded_index(value: object, what: str = "episode") -> int:
    """A non-negative int32 from a JSON number or a decimal string; anything else is refused."""
    reason = f"{what} must be an integer in 0..{MAX_INDEX}"
    if isinstance(value, bool):
        raise Refused(HTTPStatus.BAD_REQUEST, reason)
    if isinstance(value, str):
        # checked before int(): a 5000-digit string would raise inside int()
        if not re.fullmatch(r"[0-9]{1,10}", value):
            raise Refused(HTTPStatus.BAD_REQUEST, reason)
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= MAX_INDEX:
        raise Refused(HTTPStatus.BAD_REQUEST, reason)
    return value


def valid_text(value: object, what: str, limit: int) -> str:
    """A string that encodes as UTF-8 (no lone surrogates, no NUL) and is at most ``limit`` long."""
    if not isinstance(value, str):
        raise Refused(HTTPStatus.BAD_REQUEST, f"{what} must be a string")
    if len(value) > limit:
        raise Refused(HTTPStatus.BAD_REQUEST, f"{what} is longer than {limit} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(HTTPStatus.BAD_REQUEST, f"{what} is not valid UTF-8 text (lone surrogate)") from None
    if "\x00" in value:
        raise Refused(HTTPStatus.BAD_REQUEST, f"{what} contains a NUL character")
    return value


def _no_constants(name: str) -> NoReturn:
    raise Refused(HTTPStatus.BAD_REQUEST, f"body is not JSON: {name} is not a JSON number")


def parse_json_object(raw: bytes) -> dict[str, object]:
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Refused(HTTPStatus.BAD_REQUEST, "body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    return body


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """One ``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` range; None when unsatisfiable.

    Raises ``Refused`` (416) for a header that is not one such range or has absurd numbers."""
    m = re.fullmatch(r"\s*bytes=([0-9]*)-([0-9]*)\s*", header[:200])
    if not m or len(header) > 200 or (not m.group(1) and not m.group(2)):
        raise Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "Range must be one bytes=a-b range")
    if len(m.group(1)) > MAX_OFFSET_DIGITS or len(m.group(2)) > MAX_OFFSET_DIGITS:
        raise Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                      f"Range offsets have more than {MAX_OFFSET_DIGITS} digits")
    if size == 0:
        return None
    if not m.group(1):
        n = int(m.group(2))
        return (max(size - n, 0), size - 1) if n > 0 else None
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)


def media_headers(path: Path, size: int, span: tuple[int, int], partial: bool) -> list[tuple[str, str]]:
    start, end = span
    headers = [("Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream"),
               ("Accept-Ranges", "bytes"), ("Content-Length", str(end - start + 1)),
               ("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff")]
    if partial:
        headers.append(("Content-Range", f"bytes {start}-{end}/{size}"))
    return headers


def copy_span(path: Path, span: tuple[int, int], out: BufferedIOBase) -> None:
    """Stream bytes start..end of ``path``: memory stays flat whatever the file size."""
    start, end = span
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start + 1
        while left > 0:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
