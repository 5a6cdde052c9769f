"""The failure-signature catalogue: reviewed patterns kept as data (``signatures.json``).

A line is matched after the prefixes other layers add are stripped (``srun -l``'s ``N: ``,
PyTorch's ``[rank<r>]:``, syslog and kernel stamps), so that anchored patterns such as a Python
exception line work whatever wrapped them. One line yields at most one match: the first entry,
in catalogue order, whose pattern matches (so specific entries come before generic ones).

A trusted kernel source (a node's kernel log, a kernel line the node agent forwards) is matched
another way (``kernel=True``): only entries with a ``kernel`` pattern take part, that pattern must
match from the first character of the kernel's message (relaunch.detection.kernel_lines), a line
that is not the kernel's (another syslog tag or facility) matches nothing, and a line that
reports a user process matches only application entries (a segfault, an OOM kill), whatever
driver text it quotes. Job output is matched by the ordinary patterns: it only points.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relaunch.detection.kernel_lines import (
    KernelLines,
    KernelRecord,
    kernel_message,
    reports_user_process,
    without_comm,
)
from relaunch.detection.lines import line_timestamp
from relaunch.detection.literals import MIN_KEYWORD, required_literals
from relaunch.detection.scanner import Prefilter, make_prefilter
from relaunch.detection.xids import Implicates, Outcome, Remedy, judge, reads_the_line
from relaunch.models.recovery import Category

MAX_TEXT = 500
# Lines are matched on their first MAX_LINE bytes (characters for text): every failure line in
# the reference is far shorter, and a bound keeps any pattern's cost per line bounded whatever a
# job prints. Longer lines are cut, never skipped, and counted in ScanStats.
MAX_LINE = 4096
_ALLOWED_GROUPS = frozenset({"host", "xid"})
_GLOBAL_FLAGS = re.compile(r"^\(\?[aiLmsux]+\)")

# Prefixes, outermost first: srun -l label, Open MPI's --timestamp-output / --tag-output
# (`2019-06-02T16:13:44.884Z: [1,12]<stdout>:`), syslog priority/time/host/tag, kernel stamps,
# PyTorch rank. Every part is optional, so this always matches (maybe empty); it never crosses a
# newline.
_PREFIX = re.compile(
    r"(?:[ \t]*(?:P\d+ )?(?P<task>\d+): )?"
    r"(?:(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z: )?\[\d+,\d+\]<std(?:out|err)>: ?)?"
    r"(?:<\d+>)?"
    r"(?:(?:(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ (?:[\w./-]+(?:\[\d+\])?: )?)?"
    r"(?:kernel: ?)?(?:<\d+>)?(?:\[ *\d+\.\d+\] ?)?(?:\[ *[TC]\d+\] ?)?"
    r"(?:\[rank(?P<rank>\d+)\]: ?)?"
)
_PG_RANK = re.compile(r"\[(?:PG ID \d+ PG GUID \S+ )?Rank (\d+)\]")


class Role(StrEnum):
    """What a matched line means for attribution (see docs/failure-signatures.md §0)."""

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
    decoder: Literal["xid"] | None = Field(
        default=None,
        description="xid: the match's id, category, role and severity come from the Xid table",
    )
    kernel: str | None = Field(
        default=None,
        description="the pattern in a trusted kernel source: matched from the first character "
        "of the kernel's message, as the driver writes it, with no room for text before it; "
        "None: the entry never matches a trusted kernel line",
    )

    @model_validator(mode="after")
    def _check_pattern(self) -> Signature:
        if _GLOBAL_FLAGS.match(self.pattern):
            raise ValueError(f"{self.id}: no global inline flags (literals are looked for as is)")
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"{self.id}: bad pattern: {exc}") from exc
        if self.kernel is not None:
            wildcard = self.kernel.startswith(("^", ".", "(?:.", "[^"))
            if _GLOBAL_FLAGS.match(self.kernel) or (
                wildcard and self.category is not Category.APPLICATION
            ):
                # Only a report about a process (its comm first) starts with free text.
                raise ValueError(f"{self.id}: a kernel pattern starts with the driver's words")
            try:
                kernel = re.compile(self.kernel)
            except re.error as exc:
                raise ValueError(f"{self.id}: bad kernel pattern: {exc}") from exc
            if set(kernel.groupindex) != set(compiled.groupindex) - {"host"}:
                raise ValueError(f"{self.id}: the kernel pattern has the pattern's groups")
            if self.culprit is not Culprit.SOURCE_NODE:
                raise ValueError(f"{self.id}: a kernel line blames its own node (source_node)")
        unknown = set(compiled.groupindex) - _ALLOWED_GROUPS
        if unknown:
            raise ValueError(f"{self.id}: unsupported named groups {sorted(unknown)}")
        if self.decoder == "xid" and "xid" not in compiled.groupindex:
            raise ValueError(f"{self.id}: the xid decoder needs an `xid` group")
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
    task: int | None = Field(default=None, description="the srun -l task label, if any")
    torch_rank: int | None = Field(
        default=None, description="PyTorch's global rank on the line ([rank<r>] or [Rank <r>])"
    )
    host: str | None = Field(
        default=None, description="the `host` group as printed (may be a hostlist), or the node"
    )
    xid: int | None = None
    xid_action: str | None = Field(
        default=None, description="the Xid catalogue's bucket for the line, after decoding it"
    )
    xid_outcome: Outcome | None = Field(
        default=None, description="what the bucket means: drain, restart, follow_154, ..."
    )
    xid_detail: str | None = Field(default=None, description="how the bucket was reached")
    timestamp: datetime | None = Field(default=None, description="the line's own time, in UTC")


@dataclass
class ScanStats:
    """What a scan did beyond matching, for the caller to report (the watcher's counters, a
    bundle's attribution)."""

    cut_lines: int = 0  # candidate lines longer than MAX_LINE, matched on their start only


class _Compiled(NamedTuple):
    signature: Signature
    regex: re.Pattern[str]


class _Kernel(NamedTuple):
    signature: Signature
    regex: re.Pattern[str]
    on_user_process: bool  # an application entry: may match a line about a user process


class Catalogue:
    """The compiled catalogue. Build it with :meth:`load`.

    Scanning does not run every pattern on every line: a prefilter (relaunch.detection.scanner:
    hyperscan where installed, else literal search) passes once over the bytes and names the
    lines that can match; only those are matched entry by entry. A clean log costs one pass.
    """

    def __init__(self, signatures: Sequence[Signature], *, engine: str | None = None) -> None:
        self._entries = [_Compiled(s, re.compile(s.pattern)) for s in signatures]
        self._kernel = [
            _Kernel(s, re.compile(s.kernel), s.category is Category.APPLICATION)
            for s in signatures
            if s.kernel is not None
        ]
        self._by_id = {s.id: s for s in signatures}
        self._xid_entry = next((s for s in signatures if s.decoder == "xid"), None)
        self._prefilter = make_prefilter([s.pattern for s in signatures], engine)
        kernel_patterns = [k.regex.pattern for k in self._kernel]
        self._kernel_prefilter = (
            make_prefilter(kernel_patterns, engine) if kernel_patterns else None
        )

    @classmethod
    def load(cls, path: Path | None = None, *, engine: str | None = None) -> Catalogue:
        """The packaged catalogue (compiled once per process), or the one at ``path``;
        ``engine`` forces a prefilter (``hyperscan`` or ``literals``)."""
        if path is None and engine is None:
            return _default_catalogue()
        if path is None:
            text = resources.files("relaunch.detection").joinpath("signatures.json")
            return cls.from_json(text.read_text("utf-8"), engine=engine)
        return cls.from_json(path.read_text(encoding="utf-8"), engine=engine)

    @classmethod
    def from_json(cls, text: str, *, engine: str | None = None) -> Catalogue:
        return cls(CatalogueFile.model_validate(json.loads(text)).signatures, engine=engine)

    @property
    def engine(self) -> str:
        """The prefilter in use: ``hyperscan`` or ``literals``."""
        return self._prefilter.name

    @property
    def signatures(self) -> list[Signature]:
        return [entry.signature for entry in self._entries]

    def get(self, signature_id: str) -> Signature:
        """The entry by id; ``xid_<code>`` (a decoded Xid match) names the Xid entry."""
        found = self._by_id.get(signature_id)
        if found is None and signature_id.startswith("xid_"):
            found = self._xid_entry
        if found is None:
            raise KeyError(signature_id)
        return found

    def match_line(
        self,
        line: str,
        *,
        line_no: int,
        source: str,
        source_node: str | None = None,
        kernel: bool = False,
        record: KernelRecord | None = None,
    ) -> SignatureMatch | None:
        """The first entry, in catalogue order, that matches ``line`` (no newline), or None.
        Only the first :data:`MAX_LINE` characters are looked at. ``kernel``: the line comes from
        a trusted kernel source (see the module's docstring); ``record`` carries what the
        previous line of the same log said (a piece of a record split at a newline)."""
        line = line[:MAX_LINE]
        if kernel:
            return self._match_kernel(line, line_no, source, source_node, record)
        prefix = _PREFIX.match(line)
        assert prefix is not None  # every part of the prefix is optional
        body = line[prefix.end() :]
        for entry in self._entries:
            found = entry.regex.search(body)
            if found:
                task_text, torch_text = prefix.group("task"), prefix.group("rank")
                if torch_text is None:
                    pg = _PG_RANK.search(body)
                    torch_text = pg.group(1) if pg else None
                return _build(
                    entry.signature,
                    found,
                    body,
                    line,
                    line_no,
                    source,
                    source_node,
                    task_text=task_text,
                    torch_text=torch_text,
                )
        return None

    def _match_kernel(
        self,
        line: str,
        line_no: int,
        source: str,
        source_node: str | None,
        record: KernelRecord | None,
    ) -> SignatureMatch | None:
        message = kernel_message(line)
        if message is None:
            return None
        text = without_comm(message.text)
        user = reports_user_process(text)
        if record is not None:
            if message.stamp is not None and message.stamp == record.stamp:
                user = user or record.user
            record.stamp, record.user = message.stamp, user
        for entry in self._kernel:
            if user and not entry.on_user_process:
                continue
            found = entry.regex.match(text)
            if found:
                return _build(entry.signature, found, text, line, line_no, source, source_node)
        return None

    def scan_bytes(
        self,
        data: bytes,
        *,
        source: str,
        first_line_no: int = 1,
        source_node: str | None = None,
        stats: ScanStats | None = None,
        kernel: bool = False,
        record: KernelRecord | None = None,
    ) -> list[SignatureMatch]:
        """Match every line of ``data`` (UTF-8, newline-separated; a last line without its
        newline counts); line numbers start at ``first_line_no``. Lines longer than
        :data:`MAX_LINE` are matched on their start and counted in ``stats``. ``kernel``: a
        trusted kernel source, read line by line (``record``: carried from the last scan)."""
        if kernel:

            def line_at(index: int, start: int, end: int) -> tuple[int, str]:
                text = data[start:end].decode("utf-8", errors="replace").removesuffix("\r")
                return first_line_no + index, text

            return self._scan_kernel(data, line_at, source, source_node, stats, record)
        out: list[SignatureMatch] = []
        for index, line in self._candidates(data, stats):
            found = self.match_line(
                line, line_no=first_line_no + index, source=source, source_node=source_node
            )
            if found is not None:
                out.append(found)
        return out

    def scan_lines(
        self,
        lines: Iterable[tuple[int, str]],
        *,
        source: str,
        source_node: str | None = None,
        stats: ScanStats | None = None,
        kernel: bool = False,
        record: KernelRecord | None = None,
    ) -> list[SignatureMatch]:
        """Match numbered lines, each without its newline (as :class:`LineBuffer` yields them);
        lines longer than :data:`MAX_LINE` are matched on their start and counted in ``stats``.
        ``kernel``: a trusted kernel source (``record``: carried from the last scan)."""
        numbered = list(lines)
        data = "\n".join(line for _, line in numbered).encode("utf-8", "surrogatepass")
        if kernel:
            return self._scan_kernel(
                data, lambda i, _s, _e: numbered[i], source, source_node, stats, record
            )
        out: list[SignatureMatch] = []
        for index, _ in self._candidates(data, stats):
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
        stats: ScanStats | None = None,
        kernel: bool = False,
        record: KernelRecord | None = None,
    ) -> list[SignatureMatch]:
        """Match every line of ``text``; line numbers start at ``first_line_no``."""
        data = text.encode("utf-8", "surrogatepass")
        return self.scan_bytes(
            data,
            source=source,
            first_line_no=first_line_no,
            source_node=source_node,
            stats=stats,
            kernel=kernel,
            record=record,
        )

    def _scan_kernel(
        self,
        data: bytes,
        line_at: Callable[[int, int, int], tuple[int, str]],
        source: str,
        source_node: str | None,
        stats: ScanStats | None,
        record: KernelRecord | None,
    ) -> list[SignatureMatch]:
        """A trusted kernel source (``data``; ``line_at``: a line's number and text from its
        index and byte span): only the lines the kernel patterns' prefilter names are matched
        (each pattern at the message start), so a clean log costs one pass; what a line
        carries from the lines before it (a piece of a record split at a newline) is read back
        from them (:class:`KernelLines`), and ``record`` carries it to the next read."""
        carried = record if record is not None else KernelRecord()
        if not data or self._kernel_prefilter is None:
            return []
        parsed = KernelLines(data, MAX_LINE)
        out: list[SignatureMatch] = []
        for index, start, end in self._spans(data, self._kernel_prefilter):
            no, line = line_at(index, start, end)
            if len(line) > MAX_LINE and stats is not None:
                stats.cut_lines += 1
            found = self.match_line(
                line, line_no=no, source=source, source_node=source_node, kernel=True,
                record=parsed.record_before(start, carried),
            )  # fmt: skip
            if found is not None:
                out.append(found)
        after = parsed.record_before(parsed.end(), carried)
        carried.stamp, carried.user = after.stamp, after.user
        return out

    def _spans(self, data: bytes, prefilter: Prefilter) -> Iterator[tuple[int, int, int]]:
        """(0-based line index, start, end) of each line ``prefilter`` names, in order, ``end``
        at its newline (or the end). Line numbers come from counting newlines between
        candidates only."""
        index = 0
        counted_to = 0
        line_end = -1  # the newline (or end) of the last line yielded
        for pos in sorted(prefilter.offsets(data)):
            if pos <= line_end:
                continue  # another hit on the same line
            # Searching back only to the last line's end keeps this linear however many hits
            # a long line has.
            start = data.rfind(b"\n", line_end + 1, pos) + 1 or line_end + 1
            end = data.find(b"\n", pos)
            line_end = end = len(data) if end == -1 else end
            index += data.count(b"\n", counted_to, start)
            counted_to = start
            yield index, start, end

    def _candidates(self, data: bytes, stats: ScanStats | None) -> Iterator[tuple[int, str]]:
        """(0-based line index, decoded line without its line end, cut at MAX_LINE bytes) for
        each line the prefilter names, in order."""
        for index, start, end in self._spans(data, self._prefilter):
            if end - start > MAX_LINE:
                end = start + MAX_LINE
                if stats is not None:
                    stats.cut_lines += 1
            yield index, data[start:end].decode("utf-8", errors="replace").removesuffix("\r")


@functools.cache
def _default_catalogue() -> Catalogue:
    text = resources.files("relaunch.detection").joinpath("signatures.json").read_text("utf-8")
    return Catalogue.from_json(text)


def _build(
    signature: Signature,
    found: re.Match[str],
    body: str,
    line: str,
    line_no: int,
    source: str,
    source_node: str | None,
    *,
    task_text: str | None = None,
    torch_text: str | None = None,
) -> SignatureMatch:
    groups = found.groupdict()
    rank_text = task_text or torch_text
    host = groups.get("host")
    if signature.culprit is Culprit.SOURCE_NODE:
        host = source_node
    xid = groups.get("xid")
    fields: dict[str, object] = {
        "signature": signature.id,
        "category": signature.category,
        "role": signature.role,
        "severity": signature.severity,
    }
    if signature.decoder == "xid" and xid is not None:
        code = int(xid)
        # The comm the driver quotes is the user's: it must not steer the decode.
        rest = without_comm(body[found.end() : found.end() + 512]) if reads_the_line(code) else ""
        fields.update(_xid_fields(code, rest))
    return SignatureMatch(
        **fields,
        source=source,
        line_no=line_no,
        text=line.rstrip("\r\n")[:MAX_TEXT],
        rank=int(rank_text) if rank_text is not None else None,
        task=int(task_text) if task_text is not None else None,
        torch_rank=int(torch_text) if torch_text is not None else None,
        host=host,
        xid=int(xid) if xid is not None else None,
        timestamp=line_timestamp(line),
    )


# What each outcome of the Xid table makes of a match: its role, and its category by what the
# code implicates (a restart the application's fault calls for is no hardware verdict).
_XID_ROLES = {
    Outcome.DRAIN: Role.ROOT,
    Outcome.RESTART: Role.ROOT,
    Outcome.FOLLOW_154: Role.ROOT,
    Outcome.CONTEXT: Role.CONTEXT,
    Outcome.TEARDOWN: Role.TEARDOWN,
}


@functools.lru_cache(maxsize=4096)
def _xid_fields(code: int, rest: str) -> dict[str, object]:
    """The Xid table's judgement as match fields; cached: most codes are judged by the code
    alone, and an Xid flood repeats one line (NVSentinel saw 800K Xid 95 lines, 29 texts)."""
    j = judge(code, rest)
    on_hardware = j.implicates in (Implicates.GPU, Implicates.NODE)
    if j.outcome is Outcome.DRAIN:
        category, severity = Category.GPU_HARDWARE, 5 if j.remedy is Remedy.REBOOT else 4
    elif j.outcome in (Outcome.RESTART, Outcome.FOLLOW_154):
        category, severity = (Category.GPU_HARDWARE if on_hardware else Category.UNKNOWN), 2
    elif j.outcome is Outcome.CONTEXT:
        category, severity = (Category.GPU_HARDWARE if on_hardware else Category.UNKNOWN), 1
    else:
        category, severity = Category.UNKNOWN, 1
    return {
        "signature": f"xid_{j.code}",
        "category": category,
        "role": _XID_ROLES[j.outcome],
        "severity": severity,
        "xid_action": j.action.value,
        "xid_outcome": j.outcome,
        "xid_detail": j.detail,
    }
