"""Kernel messages that hold newlines, as ``dmesg`` and ``journalctl -k`` print them: the record's
first line after the kernel's prefix, its other lines indented under it with no prefix of their
own. The catalogue never reads an indented line (it may be a piece of a report that quotes a
user's text: docs/trust.md); this module reads one such record whose start is the driver's own.

The NVIDIA driver reports a GPU that fell off the bus without an Xid in one message of three
lines (``NVRM: The NVIDIA GPU <pci>`` / ``NVRM: (PCI ID: <id>) installed in this system has`` /
``NVRM: fallen off the bus and is not responding to commands.``; seen in dmesg on an H100 fleet,
NVIDIA/NVSentinel#155, driver 570). A reader that splits records into prefixed lines (rsyslog's
imklog) gives each line its own prefix, and the catalogue's ``nvrm_fallen_off_bus`` matches the
third; ``dmesg`` and the journal keep the record whole and indent the rest, which is read here:
the record's start must be the kernel's message (not a piece of a user process's report) and
the continuation lines must follow it directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from relaunch.detection.hung_tasks import (
    kernel_line,
    line_end,
    lines_with,
    piece_of_user_report,
)
from relaunch.detection.lines import line_timestamp

_START = re.compile(
    r"NVRM: The NVIDIA GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*$"
)
_CONTINUATION = re.compile(r"\s{1,64}NVRM: ")
_FALLEN = re.compile(r"\s{1,64}NVRM: fallen off the bus")
_WORD = "NVRM: The NVIDIA GPU "
RECORD_LINES = 4


@dataclass(frozen=True)
class Record:
    """A multi-line driver record: the line number and text of its start, its time."""

    line_no: int
    text: str
    time: datetime | None


def fallen_off_bus(text: str) -> list[Record]:
    """The driver's three-line "fallen off the bus" records of one node's kernel log, printed
    whole (continuation lines indented). A log without the record's first words costs one
    substring search."""
    out: list[Record] = []
    for found in lines_with(text, _WORD):
        message = found.message
        if (
            message is not None
            and _START.match(message.text)
            and not piece_of_user_report(text, found.start, message.stamp)
            and _continues_to_fallen(text, found.end)
        ):
            out.append(Record(found.line_no, found.line[:500], line_timestamp(found.line)))
    return out


def _continues_to_fallen(text: str, end: int) -> bool:
    """Whether the indented lines right after a record's start reach 'fallen off the bus'."""
    start = end + 1
    for _ in range(RECORD_LINES):
        if start > len(text):
            return False
        stop = line_end(text, start)
        line = kernel_line(text, start, stop)
        start = stop + 1
        if _FALLEN.match(line):
            return True
        if not _CONTINUATION.match(line):
            return False
    return False
