"""Lines of a log: complete, numbered lines out of appended bytes, and the time a line states."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NamedTuple

_TIMESTAMP = re.compile(
    r"(\d{4}-\d\d-\d\d)[T _](\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)?(?![\d.])"
)


class Line(NamedTuple):
    no: int
    text: str


def line_timestamp(line: str) -> datetime | None:
    """The first ISO-like date-time on the line, in UTC; a time without offset is local time."""
    found = _TIMESTAMP.search(line)
    if not found:
        return None
    day, clock, zone = found.groups()
    zone = "+00:00" if zone == "Z" else zone or ""
    try:
        stamp = datetime.fromisoformat(f"{day}T{clock}{zone}")
    except ValueError:
        return None
    return stamp.astimezone(UTC)


class LineBuffer:
    """Turns appended byte chunks into complete, numbered lines.

    The last, unterminated line is kept until its newline arrives (or until it grows past
    ``max_line_bytes``, when it is released as it is). Bytes decode as UTF-8 with replacement.
    """

    def __init__(self, first_line_no: int = 1, *, max_line_bytes: int = 1 << 20) -> None:
        self.next_line_no = first_line_no
        self._partial = b""
        self._max_line_bytes = max_line_bytes

    @property
    def pending_bytes(self) -> int:
        return len(self._partial)

    def feed(self, data: bytes) -> list[Line]:
        buf = self._partial + data
        cut = buf.rfind(b"\n") + 1
        self._partial = buf[cut:]
        lines = buf[:cut].decode("utf-8", errors="replace").split("\n")[:-1] if cut else []
        if len(self._partial) > self._max_line_bytes:
            lines.append(self._partial.decode("utf-8", errors="replace"))
            self._partial = b""
        return list(self._number(lines))

    def flush(self) -> list[Line]:
        """Release the unterminated last line, if any (the stream is over)."""
        rest, self._partial = self._partial, b""
        return list(self._number([rest.decode("utf-8", errors="replace")])) if rest else []

    def discard_partial(self) -> None:
        """Forget the unterminated line (its file was truncated or replaced)."""
        self._partial = b""

    def _number(self, lines: list[str]) -> Iterator[Line]:
        for text in lines:
            yield Line(self.next_line_no, text.removesuffix("\r"))
            self.next_line_no += 1
