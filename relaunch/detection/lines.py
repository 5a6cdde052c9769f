"""Lines of a log: complete, numbered lines out of appended bytes, and the time a line states."""

from __future__ import annotations

import re
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


def lines_since(text: str, start: datetime | None) -> str:
    """The lines of ``text`` from ``start`` on: a line stating an earlier time is dropped, a
    line stating none is kept (line endings kept as they are). ``start`` None keeps all.

    For a node's kernel log: an Xid from before the job started on the node is the node's
    history (its reputation), not this interruption's evidence."""
    if start is None:
        return text
    kept = []
    for line in text.splitlines(keepends=True):
        stamp = line_timestamp(line)
        if stamp is None or stamp >= start:
            kept.append(line)
    return "".join(kept)


MAX_LINE_BYTES = 1 << 20


class LineSplitter:
    """Turns appended byte chunks into complete lines (bytes, without the newline or a CR
    before it).

    The last, unterminated line waits for its newline. A line longer than ``max_line_bytes``
    is cut to its first ``max_line_bytes`` bytes, which come out as soon as they are in; the
    rest of it (up to its newline) is skipped and ``cut_lines`` counts it. So nothing is held
    without bound, every line out is one line of the stream, and how the stream was chunked
    changes nothing.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._partial = b""
        self._max = max_line_bytes
        self._skipping = False  # inside the rest of a line that was cut
        self.cut_lines = 0

    def feed(self, data: bytes) -> list[bytes]:
        if self._skipping:
            end = data.find(b"\n")
            if end == -1:
                return []
            data, self._skipping = data[end + 1 :], False
        buf = self._partial + data
        cut = buf.rfind(b"\n") + 1
        lines = [line.removesuffix(b"\r") for line in buf[: cut - 1].split(b"\n")] if cut else []
        self._partial = buf[cut:]
        if len(self._partial) > self._max:
            lines.append(self._partial)
            self._partial, self._skipping = b"", True
        out = []
        for line in lines:
            if len(line) > self._max:
                line = line[: self._max]
                self.cut_lines += 1
            out.append(line)
        return out

    def reset(self) -> None:
        """Forget the unterminated line (its file was truncated or replaced)."""
        self._partial, self._skipping = b"", False


class LineBuffer:
    """Turns appended byte chunks into complete, numbered lines (a :class:`LineSplitter`'s,
    decoded as UTF-8 with replacement)."""

    def __init__(self, first_line_no: int = 1, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.next_line_no = first_line_no
        self._lines = LineSplitter(max_line_bytes=max_line_bytes)

    def feed(self, data: bytes) -> list[Line]:
        return [self._number(raw) for raw in self._lines.feed(data)]

    def discard_partial(self) -> None:
        """Forget the unterminated line (its file was truncated or replaced)."""
        self._lines.reset()

    def _number(self, raw: bytes) -> Line:
        line = Line(self.next_line_no, raw.decode("utf-8", errors="replace"))
        self.next_line_no += 1
        return line
