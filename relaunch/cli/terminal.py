"""Text for a terminal: what a job printed, passed through the audit trail and bundles to
``relaunch show`` / ``explain`` / ``incidents``, must not drive the operator's terminal.

Job logs are job-controlled: an ANSI sequence in a log line can recolour, move the cursor,
rewrite earlier lines (hiding what a timeline says), set the window title, or write to the
clipboard (OSC 52). :func:`printable` removes escape sequences and control characters and keeps
newlines and tabs. Slurm's own records carry text a job's user chose too (a job's name, comment,
paths): `relaunch slurm jobs` and the errors that quote them pass through the same function,
and JSON printed to a terminal through :func:`json_text`.
"""

from __future__ import annotations

import re

# One pass, linear: each alternative starts at a fixed character and its repetitions stop at
# the next ESC (or BEL), so no input makes the scan backtrack.
_UNPRINTABLE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor movement, erasing
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window title, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -~]?"  # any other escape, or a lone ESC
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 (but tab and newline), DEL, C1 (8-bit CSI/OSC)
    r"|[\u202a-\u202e\u2066-\u2069]"  # bidirectional overrides: text that reads reversed
)


def printable(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (tab and newline
    kept): safe to print to an operator's terminal."""
    return _UNPRINTABLE.sub("", text)


# What JSON encoders leave raw inside a string and a terminal may still act on: DEL, the C1
# controls (U+009B is CSI to some terminals), bidirectional overrides, line separators.
_JSON_RAW = re.compile(r"[\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def json_text(text: str) -> str:
    """JSON text (control characters below U+0020 already escaped by the encoder) with every
    other character a terminal may act on written as a ``\\uXXXX`` escape: the same JSON,
    safe to print."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
