"""Which plain texts every match of a pattern must contain.

The scanner's fallback engine looks for these with ``bytes.find``; the catalogue refuses a
pattern that has none (a pattern no literal can find would have to be run on every line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_CLASS_ESCAPES = frozenset("dDsSwWbBAZ0123456789")
# Lookarounds, conditionals and flag-scoped groups give no literal a match must contain as is.
_OPAQUE_GROUP = re.compile(r"\(\?(?:[=!<(]|[aiLmsux-]+:)")
_GROUP_OPENING = re.compile(r"^\((?:\?:|\?P<\w+>)?")
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
MIN_KEYWORD = 3


def required_literals(pattern: str) -> list[str] | None:
    """Texts one of which is in every match of ``pattern``: for each top-level alternative, its
    longest run of plain characters, or else the literals of a group it cannot skip. None when
    some alternative has no literal of at least ``MIN_KEYWORD`` characters."""
    tokens = _tokens(pattern)
    out: list[str] = []
    start = 0
    for end in [i for i, (kind, _) in enumerate(tokens) if kind == "|"] + [len(tokens)]:
        found = _branch_literals(tokens[start:end])
        if found is None:
            return None
        out.extend(found)
        start = end + 1
    return out


def _branch_literals(tokens: list[tuple[str, str]]) -> list[str] | None:
    runs = "".join(text if kind == "c" else "\0" for kind, text in tokens).split("\0")
    best = max(runs, key=len)
    if len(best) >= MIN_KEYWORD:
        return [best]
    for kind, text in tokens:
        if kind == "g" and not _OPAQUE_GROUP.match(text):
            found = required_literals(_GROUP_OPENING.sub("", text[:-1], count=1))
            if found:
                return found
    return None


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """The pattern's top level as ("c", literal char), ("g", group source), ("|", "") and
    ("x", "") for anything else; a token a quantifier makes optional becomes ("x", "")."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch in "?*{+":
            if ch != "+" and out:
                out[-1] = ("x", "")
            out.append(("x", ""))
            close = pattern.find("}", i) if ch == "{" else i
            i = close + 1 if close != -1 else len(pattern)
        elif ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            plain = nxt not in _CLASS_ESCAPES
            out.append(("c", _CONTROL_ESCAPES.get(nxt, nxt)) if plain else ("x", ""))
            i += 2
        elif ch in "[(":
            end = _skip_class(pattern, i) if ch == "[" else _skip_group(pattern, i)
            out.append(("g", pattern[i:end]) if ch == "(" else ("x", ""))
            i = end
        else:
            out.append(("|", "") if ch == "|" else ("x", "") if ch in ".^$" else ("c", ch))
            i += 1
    return out


def _skip_class(pattern: str, i: int) -> int:
    """Index just past the character class that starts at ``pattern[i] == "["``."""
    i += 2 if pattern.startswith("[^", i) else 1
    i += 1 if pattern.startswith("]", i) else 0
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _skip_group(pattern: str, i: int) -> int:
    """Index just past the group that starts at ``pattern[i] == "("``."""
    depth = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch in "\\[":
            i = i + 2 if ch == "\\" else _skip_class(pattern, i)
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        i += 1
        if depth == 0:
            break
    return i


def minimal_keywords(keywords: Iterable[str]) -> list[str]:
    """Drop keywords that contain a shorter kept one: that one is present whenever they are."""
    kept: list[str] = []
    for word in sorted(set(keywords), key=len):
        if not any(k in word for k in kept):
            kept.append(word)
    return kept
