"""One pass over a log for every catalogue pattern at once: which lines are worth matching.

A scan has two steps. A *prefilter* runs over the raw bytes once and names the lines that can
match some entry; the catalogue then matches only those lines entry by entry, in Python, which
gives the groups (host, Xid) and the exact semantics. A clean log costs one pass.

Two prefilters, chosen by what is installed:

- ``hyperscan`` (Intel's multi-pattern regex engine; the wheel exists for x86-64 Linux):
  every entry's pattern in one database. Patterns are compiled unanchored and in prefilter mode
  where hyperscan lacks a construct (a lookahead), so the candidates are a superset of the lines
  that match. Measured at about 1 GB/s on a mixed training log (bench/attribution.py).
- ``literals``: the fallback everywhere else: ``bytes.find`` for every literal a pattern
  requires (relaunch.detection.literals). About 5x slower on the same log, still one pass per
  literal with no per-line Python work.

google-re2's ``Set`` was measured too: it tells which patterns match a text, not where, so it
must be called once per line and ran at about 22 MB/s — slower than either.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from relaunch.detection.literals import minimal_keywords, required_literals


class Prefilter(Protocol):
    """Finds offsets inside the lines that may match; any order, repeats allowed."""

    name: str

    def offsets(self, data: bytes) -> list[int]: ...


class LiteralPrefilter:
    """Candidates are the lines holding a literal that some pattern requires."""

    name = "literals"

    def __init__(self, patterns: Sequence[str]) -> None:
        words = (w for p in patterns for w in required_literals(p) or [])
        self._keywords = [w.encode() for w in minimal_keywords(words)]

    def offsets(self, data: bytes) -> list[int]:
        out: list[int] = []
        for word in self._keywords:
            pos = data.find(word)
            while pos != -1:
                out.append(pos)
                # One hit per line is enough: go on from the next line.
                end = data.find(b"\n", pos)
                pos = data.find(word, end + 1) if end != -1 else -1
        return out


class HyperscanPrefilter:
    """Every pattern in one hyperscan block-mode database."""

    name = "hyperscan"

    def __init__(self, patterns: Sequence[str], hs: Any) -> None:
        self._hs = hs
        expressions: list[bytes] = []
        flags: list[int] = []
        for pattern in patterns:
            expression, flag = self._compilable(_unanchored(pattern))
            expressions.append(expression)
            flags.append(flag)
        self._db = hs.Database(mode=hs.HS_MODE_BLOCK)
        self._db.compile(
            expressions=expressions,
            ids=list(range(len(expressions))),
            elements=len(expressions),
            flags=flags,
        )
        # One scratch space per database: scans from several threads take turns.
        self._lock = threading.Lock()

    def _compilable(self, pattern: str) -> tuple[bytes, int]:
        hs = self._hs
        multiline = hs.HS_FLAG_MULTILINE
        for flag in (multiline, multiline | hs.HS_FLAG_PREFILTER):
            try:
                hs.Database(mode=hs.HS_MODE_BLOCK).compile(
                    expressions=[pattern.encode()], flags=[flag]
                )
            except hs.error:
                continue
            return pattern.encode(), flag
        # Nothing hyperscan accepts: look for the pattern's required literals instead.
        words = required_literals(pattern) or [pattern]
        return "|".join(re.escape(w) for w in words).encode(), multiline

    def offsets(self, data: bytes) -> list[int]:
        if not data:
            return []
        out: list[int] = []
        add = out.append

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            add(end - 1)

        with self._lock:
            self._db.scan(data, match_event_handler=on_match)
        return out


def _unanchored(pattern: str) -> str:
    """The pattern as the prefilter runs it over whole lines, prefixes included: a leading
    ``^`` (which anchors at the body after the prefix) is dropped, and a trailing ``$`` also
    accepts a carriage return before the newline."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\r?$"
    return pattern


def make_prefilter(patterns: Sequence[str], engine: str | None = None) -> Prefilter:
    """The fastest prefilter available, or the one named (``hyperscan`` or ``literals``)."""
    if engine not in (None, "hyperscan", "literals"):
        raise ValueError(f"unknown scan engine {engine!r} (hyperscan or literals)")
    if engine != "literals":
        try:
            import hyperscan
        except ImportError:
            if engine == "hyperscan":
                raise
        else:
            return HyperscanPrefilter(patterns, hyperscan)
    return LiteralPrefilter(patterns)
