"""Text for a terminal: what a job printed, passed through the audit trail and bundles to
``relaunch show`` / ``explain`` / ``incidents``, must not drive the operator's terminal.

Job logs are job-controlled: an ANSI sequence in a log line can recolour, move the cursor,
rewrite earlier lines (hiding what a timeline says), set the window title, or write to the
clipboard (OSC 52). :func:`printable` removes escape sequences and control characters and keeps
newlines and tabs.
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
