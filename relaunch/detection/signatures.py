"""The failure-signature catalogue: reviewed patterns kept as data (``signatures.json``).

A line is matched after the prefixes other layers add are stripped (``srun -l``'s ``N: ``,
PyTorch's ``[rank<r>]:``, syslog and kernel stamps), so that anchored patterns such as a Python
exception line work whatever wrapped them. One line yields at most one match: the first entry,
in catalogue order, whose pattern matches (so specific entries come before generic ones).
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relaunch.models.recovery import Category

MAX_TEXT = 500
_ALLOWED_GROUPS = frozenset({"host", "xid"})
_GLOBAL_FLAGS = re.compile(r"^\(\?[aiLmsux]+\)")

# Prefixes, outermost first: srun -l label, syslog priority/time/host/tag, kernel stamps, PyTorch
# rank. Every part is optional, so this always matches (maybe empty); it never crosses a newline.
_PREFIX = re.compile(
    r"(?:[ \t]*(?:P\d+ )?(?P<task>\d+): )?"
    r"(?:<\d+>)?"
    r"(?:(?:(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ (?:[\w./-]+(?:\[\d+\])?: )?)?"
    r"(?:kernel: ?)?(?:<\d+>)?(?:\[ *\d+\.\d+\] ?)?(?:\[ *[TC]\d+\] ?)?"
    r"(?:\[rank(?P<rank>\d+)\]: ?)?"
)
_PG_RANK = re.compile(r"\[(?:PG ID \d+ PG GUID \S+ )?Rank (\d+)\]")
_TIMESTAMP = re.compile(
    r"(\d{4}-\d\d-\d\d)[T _](\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)?(?![\d.])"
)


class Role(StrEnum):
    """What a matched line means for attribution (see failure-signatures.md §0)."""

    ROOT = "root"
    CASCADE = "cascade"
    TEARDOWN = "teardown"
    CONFIRM = "confirm"
    CONTEXT = "context"


class Culprit(StrEnum):
    """Where the node to blame comes from when this signature is the anchor."""

    LINE_HOST = "line_host"
    RANK_PREFIX = "rank_prefix"
    SOURCE_NODE = "source_node"
    NONE = "none"


class Signature(BaseModel):
    """One reviewed catalogue entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    pattern: str
    category: Category
    role: Role
    culprit: Culprit
    severity: int = Field(ge=1, le=5)
    source: str = Field(min_length=1)
    examples: list[str] = Field(min_length=1)
    note: str = ""

    @model_validator(mode="after")
    def _check_pattern(self) -> Signature:
        if _GLOBAL_FLAGS.match(self.pattern):
            raise ValueError(f"{self.id}: no global inline flags (literals are looked for as is)")
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"{self.id}: bad pattern: {exc}") from exc
        unknown = set(compiled.groupindex) - _ALLOWED_GROUPS
        if unknown:
            raise ValueError(f"{self.id}: unsupported named groups {sorted(unknown)}")
        if (self.culprit is Culprit.LINE_HOST) != ("host" in compiled.groupindex):
            raise ValueError(f"{self.id}: a `host` group goes with culprit line_host, and only it")
        if required_literals(self.pattern) is None:
            raise ValueError(
                f"{self.id}: every alternative needs a literal of {MIN_KEYWORD}+ characters "
                "that any match contains (it is what the scan looks for)"
            )
        return self


class CatalogueFile(BaseModel):
    """The shape of ``signatures.json``."""

    model_config = ConfigDict(extra="forbid")

    version: int
    description: str = ""
    signatures: list[Signature] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> CatalogueFile:
        ids = [s.id for s in self.signatures]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate signature ids: {duplicates}")
        return self


class SignatureMatch(BaseModel):
    """A line that matched a catalogue entry."""

    signature: str
    category: Category
    role: Role
    severity: int
    source: str
    line_no: int
    text: str
    rank: int | None = Field(
        default=None, description="the srun -l task label, else the PyTorch rank on the line"
    )
    host: str | None = Field(
        default=None, description="the `host` group as printed (may be a hostlist), or the node"
    )
    xid: int | None = None
    timestamp: datetime | None = Field(default=None, description="the line's own time, in UTC")


class Line(NamedTuple):
    no: int
    text: str


class _Compiled(NamedTuple):
    signature: Signature
    regex: re.Pattern[str]


class Catalogue:
    """The compiled catalogue. Build it with :meth:`load`.

    Scanning does not run every pattern on every line: each literal that some pattern requires
    (see :func:`required_literals`) is looked for in the whole text with ``str.find``, and only
    the lines found that way are matched entry by entry. A clean log costs a few fast scans.
    """

    def __init__(self, signatures: Sequence[Signature]) -> None:
        self._entries = [_Compiled(s, re.compile(s.pattern)) for s in signatures]
        self._by_id = {s.id: s for s in signatures}
        keywords = (word for sig in signatures for word in required_literals(sig.pattern) or [])
        self._keywords = _minimal(keywords)

    @classmethod
    def load(cls, path: Path | None = None) -> Catalogue:
        """The packaged catalogue (compiled once per process), or the one at ``path``."""
        if path is None:
            return _default_catalogue()
        return cls.from_json(path.read_text(encoding="utf-8"))

    @classmethod
    def from_json(cls, text: str) -> Catalogue:
        return cls(CatalogueFile.model_validate(json.loads(text)).signatures)

    @property
    def signatures(self) -> list[Signature]:
        return [entry.signature for entry in self._entries]

    def get(self, signature_id: str) -> Signature:
        return self._by_id[signature_id]

    def match_line(
        self, line: str, *, line_no: int, source: str, source_node: str | None = None
    ) -> SignatureMatch | None:
        """The first entry, in catalogue order, that matches ``line`` (no newline), or None."""
        prefix = _PREFIX.match(line)
        assert prefix is not None  # every part of the prefix is optional
        body = line[prefix.end() :]
        for entry in self._entries:
            found = entry.regex.search(body)
            if found:
                return _build(
                    entry.signature, found, prefix, body, line, line_no, source, source_node
                )
        return None

    def scan_lines(
        self, lines: Iterable[tuple[int, str]], *, source: str, source_node: str | None = None
    ) -> list[SignatureMatch]:
        """Match numbered lines, each without its newline (as :class:`LineBuffer` yields them)."""
        numbered = list(lines)
        text = "\n".join(line for _, line in numbered)
        out: list[SignatureMatch] = []
        for index in self._candidates(text, len(numbered)):
            no, line = numbered[index]
            found = self.match_line(line, line_no=no, source=source, source_node=source_node)
            if found is not None:
                out.append(found)
        return out

    def scan(
        self,
        text: str,
        *,
        source: str,
        first_line_no: int = 1,
        source_node: str | None = None,
    ) -> list[SignatureMatch]:
        """Match every line of ``text``; line numbers start at ``first_line_no``."""
        lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
        numbered = enumerate(lines if text else [], start=first_line_no)
        return self.scan_lines(numbered, source=source, source_node=source_node)

    def _candidates(self, text: str, count: int) -> list[int]:
        """Indexes of the lines of ``text`` (``count`` of them, joined by newlines) that hold a
        literal some pattern requires: the only lines that can match."""
        starts = [0]
        pos = text.find("\n")
        while pos != -1:
            starts.append(pos + 1)
            pos = text.find("\n", pos + 1)
        hits: set[int] = set()
        for keyword in self._keywords:
            pos = text.find(keyword)
            while pos != -1:
                index = bisect.bisect_right(starts, pos) - 1
                hits.add(index)
                pos = text.find(keyword, starts[index + 1]) if index + 1 < count else -1
        return sorted(i for i in hits if i < count)


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


def _minimal(keywords: Iterable[str]) -> list[str]:
    """Drop keywords that contain a shorter kept one: that one is present whenever they are."""
    kept: list[str] = []
    for word in sorted(set(keywords), key=len):
        if not any(k in word for k in kept):
            kept.append(word)
    return kept


@functools.cache
def _default_catalogue() -> Catalogue:
    text = resources.files("relaunch.detection").joinpath("signatures.json").read_text("utf-8")
    return Catalogue.from_json(text)


def _build(
    signature: Signature,
    found: re.Match[str],
    prefix: re.Match[str],
    body: str,
    line: str,
    line_no: int,
    source: str,
    source_node: str | None,
) -> SignatureMatch:
    groups = found.groupdict()
    rank_text = prefix.group("task") or prefix.group("rank")
    if rank_text is None:
        pg = _PG_RANK.search(body)
        rank_text = pg.group(1) if pg else None
    host = groups.get("host")
    if signature.culprit is Culprit.SOURCE_NODE:
        host = source_node
    xid = groups.get("xid")
    return SignatureMatch(
        signature=signature.id,
        category=signature.category,
        role=signature.role,
        severity=signature.severity,
        source=source,
        line_no=line_no,
        text=line.rstrip("\r\n")[:MAX_TEXT],
        rank=int(rank_text) if rank_text is not None else None,
        host=host,
        xid=int(xid) if xid is not None else None,
        timestamp=line_timestamp(line),
    )


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
