"""From an incident bundle to findings: catalogue matches placed on nodes, in time, deduplicated.

Attribution reasons over findings, not raw lines. A finding is one matched line with the node it
points at (if the line names one through a source the failure reference allows: the node whose
kernel log it is, an NCCL ``host:pid:tid`` prefix, a torchrun ``host :`` field, an ``srun``
hostlist, or a rank label mapped through an explicit rank → node map) and the time it states.
Lines from a node's log that predate the job are kept aside as stale, not used.

The job's log is job-controlled, so reading it is bounded whatever it holds: it is read in
chunks (from disk for a big bundle), every pass over it is the multi-pattern scan or a literal
search, a fixed number of matches is kept per signature, and a time a job line states counts
only when the job could have printed it then (:func:`plausible_time`).
"""

from __future__ import annotations

import io
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import BinaryIO

from relaunch.detection.health_events import health_matches, health_path
from relaunch.detection.hung_tasks import HungTask, hung_tasks
from relaunch.detection.kernel_records import Record, fallen_off_bus
from relaunch.detection.lines import line_timestamp
from relaunch.detection.signatures import (
    MAX_LINE,
    Catalogue,
    Culprit,
    Role,
    ScanStats,
    SignatureMatch,
)
from relaunch.detection.straggler import STRAGGLER_LITERALS
from relaunch.models import hostlist
from relaunch.models.bundle import Bundle, BundleJob, TelemetrySample
from relaunch.models.errors import InvalidNameError
from relaunch.models.recovery import Category

# How long before the job's first stated time a node's line may still explain it (a health
# event can precede the job failure by minutes; an Xid from last week cannot).
NODE_LOOKBACK = timedelta(minutes=10)
# A job line may state a time this far past the observation (or before the submission) and
# still count: clocks of nodes differ a little. Beyond it the time is the job's say-so only.
CLOCK_SKEW = timedelta(minutes=5)
# The job log is read in chunks of this size (cut at line ends): memory stays flat whatever
# the log's size, and each chunk goes through the multi-pattern scan in one call.
CHUNK = 4 << 20
# What the straggler rules read: the log's first lines, its last bytes, and every collective
# timeout line (the evidence of a hang is at the end; the ranks that printed at all, at the start).
STRAGGLER_HEAD_LINES = 2000
STRAGGLER_TAIL = 4 << 20
MAX_STRAGGLER_LINES = 100_000
# Matches kept per signature and source file: the rest only counted (a log of a million
# identical lines says nothing a thousand do not, and must not hold a million objects).
MAX_KEPT_PER_SIGNATURE = 2000
# Ranks and addresses a log may map (a job cannot have more ranks than this).
MAX_MAPPED = 65_536

# torchrun's ChildFailedError block: the fields of one failure entry (PT-EL).
_TORCHRUN_ENTRY = re.compile(
    # Possessive blanks: two optional runs of blanks side by side would backtrack quadratically.
    r"^[ \t]*+(?:\d+: )?[ \t]*+host[ \t]*+: (?P<host>\S+)[ \t\r]*+\n"
    r"[ \t]*+(?:\d+: )?[ \t]*+rank[ \t]*+: (?P<rank>\d+) \(local_rank: \d+\)[ \t\r]*+\n"
    r"[ \t]*+(?:\d+: )?[ \t]*+exitcode[ \t]*+: (?P<exit>-?\d+)",
    re.MULTILINE,
)


# NCCL's bootstrap line names the address each host uses: the key to "Got completion from peer
# <ip>", whose suspect is the peer, not the reporter (docs/failure-signatures.md §1.2, §2.2).
_NCCL_ADDRESS = re.compile(
    r"(?<![\w.-])(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] NCCL INFO "
    r"(?:Bootstrap : Using|NET/IB : Using .*OOB) \w+:(?P<ip>\d+\.\d+\.\d+\.\d+)<"
)
# The literals every bootstrap line holds: only lines holding one are matched.
_NCCL_ADDRESS_LITERALS = (b"NCCL INFO Bootstrap : Using", b"NCCL INFO NET/IB : Using")
_PEER = re.compile(r"Got completion from peer (?P<ip>\d+\.\d+\.\d+\.\d+)<")
_REPORTER = re.compile(r"(?:^|[\s\]])(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ")
# A NIC event that is news only when NCCL's IB transport then fails on the same host (§2.11).
_NIC_EVENTS = frozenset({"mlx5_cable_event", "mlx5_link_down", "netdev_watchdog"})
# IB transport failures (not the non-fatal async events a flap that recovers also prints).
_IB_FAILURES = frozenset(
    {"nccl_ib_fatal", "nccl_ib_async_fatal_old", "nccl_ib_completion_error", "nccl_ibv_modify_qp"}
)
HUNG_TASK_FILESYSTEM = "hung_task_filesystem"


@dataclass(frozen=True)
class Finding:
    """One matched line, where it came from and what it points at."""

    match: SignatureMatch
    path: str
    node: str | None
    time: datetime | None

    @property
    def signature(self) -> str:
        return self.match.signature

    @property
    def category(self) -> Category:
        return Category(self.match.category)

    @property
    def role(self) -> Role:
        return Role(self.match.role)


@dataclass
class Findings:
    """Everything attribution needs from one bundle.

    ``job_lines`` are the job-log lines the straggler rules read (its first lines, its end, and
    every collective-timeout line), not the whole log. ``first_time`` is the earliest time the
    job's first lines state, among those that are plausible (not in the future, not before the
    submission). ``dropped`` counts matches past the per-signature cap (counted, not kept);
    ``cut_lines`` the matched lines longer than the scan's line limit.
    """

    items: list[Finding] = field(default_factory=list)
    stale: list[Finding] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    torchrun_exits: dict[int, int] = field(default_factory=dict)
    job_lines: list[str] = field(default_factory=list)
    first_time: datetime | None = None
    dropped: Counter[str] = field(default_factory=Counter)
    cut_lines: int = 0
    ignored_times: int = 0

    def by_role(self, *roles: Role) -> list[Finding]:
        return [f for f in self.items if f.role in roles]


def normalise_host(host: str, nodes: Iterable[str]) -> list[str]:
    """The allocated nodes a printed host names: as is, as a Slurm hostlist, cut at the first
    dot (FQDNs, NCCL's short names), or with NCCL's ``%``/``/`` → ``-`` mangling undone.
    A hostlist naming far more hosts than the allocation names none (it is not expanded)."""
    allocated = list(nodes)
    if host in allocated:
        return [host]
    try:
        expanded = hostlist.expand(host, limit=max(2 * len(allocated), 64))
    except InvalidNameError:
        expanded = []
    if len(expanded) > 1 or (expanded and expanded[0] != host):
        members = set(allocated)
        return [n for n in expanded if n in members]
    short = host.split(".")[0]
    if short in allocated:
        return [short]
    mangled = {n.split(".")[0].replace("%", "-").replace("/", "-"): n for n in allocated}
    return [mangled[short]] if short in mangled else []


def plausible_time(stamp: datetime | None, job: BundleJob) -> datetime | None:
    """A job line's stated time, or None when the job could not have printed it then: later
    than the observation, or earlier than the submission (beyond :data:`CLOCK_SKEW`). Such a
    time is the job's say-so; it must not age out node lines nor order findings."""
    if stamp is None:
        return None
    if stamp > job.observed_at + CLOCK_SKEW:
        return None
    if job.submit_time is not None and stamp < job.submit_time - CLOCK_SKEW:
        return None
    return stamp


def collect(bundle: Bundle, catalogue: Catalogue) -> Findings:
    """Match every source of the bundle and place each match on a node and in time."""
    job = bundle.job
    out = Findings()
    job_matches, addresses = _scan_job_log(bundle, catalogue, out)
    for m in job_matches:
        node = _job_line_node(m, bundle, catalogue, out)
        out.items.append(Finding(m, "logs/job.log", node, plausible_time(m.timestamp, job)))
    floor = out.first_time - NODE_LOOKBACK if out.first_time else None
    for node, text in bundle.node_logs.items():
        stats = ScanStats()
        found = catalogue.scan(text, source="node_log", source_node=node, stats=stats, kernel=True)
        out.cut_lines += stats.cut_lines
        found += hung_task_matches(text, node)
        for m in _capped(found, out.dropped, Counter()):
            finding = Finding(
                m, f"nodes/{node}.log", node if node in job.nodes else None, m.timestamp
            )
            stale = floor is not None and m.timestamp is not None and m.timestamp < floor
            (out.stale if stale else out.items).append(finding)
    for finding in telemetry_findings(bundle.telemetry, catalogue, job.nodes):
        stale = floor is not None and finding.time is not None and finding.time < floor
        (out.stale if stale else out.items).append(finding)
    for no, report in enumerate(bundle.health, 1):
        named = normalise_host(report.node, job.nodes)
        for m in health_matches(report, no, catalogue):
            finding = Finding(
                m, health_path(report), named[0] if len(named) == 1 else None, m.timestamp
            )
            stale = floor is not None and finding.time is not None and finding.time < floor
            (out.stale if stale else out.items).append(finding)
    out.items = _network_links(out.items, addresses, job.nodes)
    return out


def hung_task_matches(text: str, node: str) -> list[SignatureMatch]:
    """What a node's kernel log says over several lines: the driver's "fallen off the bus"
    record printed whole (relaunch/detection/kernel_records.py), a GPU hardware root; hung-task
    reports whose stacks run through a network file system (relaunch/detection/hung_tasks.py),
    infrastructure roots on that node."""
    out = [
        _node_root(record, node, "nvrm_fallen_off_bus", Category.GPU_HARDWARE, 5)
        for record in fallen_off_bus(text)
    ]
    out += [
        _node_root(task, node, HUNG_TASK_FILESYSTEM, Category.INFRASTRUCTURE, 3)
        for task in hung_tasks(text)
        if task.filesystems
    ]
    return out


def _node_root(
    found: Record | HungTask, node: str, signature: str, category: Category, severity: int
) -> SignatureMatch:
    """A root on ``node`` from what its own kernel log printed over several lines."""
    return SignatureMatch(
        signature=signature,
        category=category,
        role=Role.ROOT,
        severity=severity,
        source="node_log",
        line_no=found.line_no,
        text=found.text,
        host=node,
        timestamp=found.time,
    )


def _capped(
    matches: Iterable[SignatureMatch], dropped: Counter[str], kept: Counter[str]
) -> Iterator[SignatureMatch]:
    for m in matches:
        if kept[m.signature] >= MAX_KEPT_PER_SIGNATURE:
            dropped[m.signature] += 1
            continue
        kept[m.signature] += 1
        yield m


def _scan_job_log(
    bundle: Bundle, catalogue: Catalogue, out: Findings
) -> tuple[list[SignatureMatch], dict[str, str]]:
    """One pass over the job log, chunk by chunk: catalogue matches (the multi-pattern scan),
    NCCL's address lines and torchrun's failure blocks (each found by a literal search first),
    the straggler rules' lines and the job's first stated time. Fills ``out`` with what is not
    returned: the rank maps, job_lines, first_time and the counters."""
    job = bundle.job
    matches: list[SignatureMatch] = []
    kept: Counter[str] = Counter()
    addresses: dict[str, str] = {}
    stats = ScanStats()
    picked: dict[int, str] = {}
    tail: deque[tuple[int, bytes]] = deque()
    tail_bytes = 0
    line_no = 1
    with _open_job_log(bundle) as fh:
        for chunk in _chunks(fh):
            found = catalogue.scan_bytes(
                chunk, source="job_log", first_line_no=line_no, stats=stats
            )
            matches.extend(_capped(found, out.dropped, kept))
            _addresses(chunk, job.nodes, addresses)
            _torchrun_ranks(chunk, job.nodes, out.rank_hosts, out.torchrun_exits)
            if line_no <= STRAGGLER_HEAD_LINES:
                head = _first_lines(chunk, STRAGGLER_HEAD_LINES - line_no + 1)
                picked.update((line_no + i, text) for i, text in enumerate(head))
                if line_no == 1:
                    out.first_time = _first_time(head[:200], job, out)
            for _, index, text in _lines_with(chunk, STRAGGLER_LITERALS):
                if len(picked) < MAX_STRAGGLER_LINES:
                    picked[line_no + index] = text
            tail.append((line_no, chunk))
            tail_bytes += len(chunk)
            while tail_bytes - len(tail[0][1]) >= STRAGGLER_TAIL:
                tail_bytes -= len(tail.popleft()[1])
            line_no += chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
    skip = max(0, tail_bytes - STRAGGLER_TAIL)
    for first, chunk in tail:
        # From the first line that starts at or after the skipped bytes.
        start = (chunk.find(b"\n", skip - 1) + 1 or len(chunk)) if skip else 0
        skip = 0
        no = first + chunk.count(b"\n", 0, start)
        for i, text in enumerate(_decode_lines(chunk[start:])):
            picked[no + i] = text
    out.job_lines = [picked[no] for no in sorted(picked)]
    out.cut_lines += stats.cut_lines
    return matches, addresses


def _open_job_log(bundle: Bundle) -> BinaryIO:
    if bundle.job_log_file is not None:
        return open(bundle.job_log_file, "rb")  # noqa: SIM115 (the caller's with closes it)
    return io.BytesIO(bundle.job_log.encode("utf-8", "surrogatepass"))


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    """The file in pieces of about :data:`CHUNK` bytes, each ending at a line end (the last
    may lack one). A line with no end in sight is kept to its first :data:`MAX_LINE` bytes
    and the rest of it skipped, so that no piece grows without bound."""
    rest = b""
    skipping = False
    while True:
        data = fh.read(CHUNK)
        if not data:
            if rest:
                yield rest
            return
        if skipping:
            end = data.find(b"\n")
            if end == -1:
                continue
            data, skipping = data[end + 1 :], False
        data = rest + data
        cut = data.rfind(b"\n") + 1
        if cut:
            yield data[:cut]
            rest = data[cut:]
        else:
            rest = data
        if len(rest) > CHUNK:
            yield rest[:MAX_LINE] + b"\n"
            rest, skipping = b"", True


def _decode_lines(data: bytes) -> list[str]:
    """The lines of ``data`` (a last one without its newline counts), each cut at MAX_LINE."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r")[:MAX_LINE] for line in lines]


def _first_lines(chunk: bytes, count: int) -> list[str]:
    end = -1
    for _ in range(count):
        end = chunk.find(b"\n", end + 1)
        if end == -1:
            end = len(chunk)
            break
    return _decode_lines(chunk[: end + 1])


def _lines_with(chunk: bytes, literals: Sequence[bytes]) -> Iterator[tuple[int, int, str]]:
    """(offset, 0-based index, text cut at MAX_LINE) of each line of ``chunk`` that holds one
    of ``literals``, once each, in order. One ``bytes.find`` pass per literal."""
    starts: set[int] = set()
    for word in literals:
        pos = chunk.find(word)
        while pos != -1:
            starts.add(chunk.rfind(b"\n", 0, pos) + 1)
            end = chunk.find(b"\n", pos)
            pos = chunk.find(word, end + 1) if end != -1 else -1
    index = counted_to = 0
    for start in sorted(starts):
        index += chunk.count(b"\n", counted_to, start)
        counted_to = start
        end = chunk.find(b"\n", start)
        end = len(chunk) if end == -1 else end
        line = chunk[start : min(end, start + MAX_LINE)]
        yield start, index, line.decode("utf-8", errors="replace").removesuffix("\r")


def _first_time(lines: list[str], job: BundleJob, out: Findings) -> datetime | None:
    """The earliest plausible time the job's first lines state (a time in the future or
    before the submission is ignored, and counted)."""
    times: list[datetime] = []
    for line in lines:
        stamp = line_timestamp(line)
        if stamp is None:
            continue
        valid = plausible_time(stamp, job)
        if valid is None:
            out.ignored_times += 1
        else:
            times.append(valid)
    return min(times) if times else None


def _addresses(chunk: bytes, nodes: list[str], addresses: dict[str, str]) -> None:
    """NCCL bootstrap lines: each address → the allocated node that announced it."""
    for _, _, line in _lines_with(chunk, _NCCL_ADDRESS_LITERALS):
        found = _NCCL_ADDRESS.search(line)
        if found is None or len(addresses) >= MAX_MAPPED:
            continue
        named = normalise_host(found["host"], nodes)
        if len(named) == 1:
            addresses[found["ip"]] = named[0]


def _network_links(
    items: list[Finding], addresses: dict[str, str], nodes: list[str]
) -> list[Finding]:
    """Place IB completion errors on the peer they name, and make a NIC event a root when
    NCCL's IB transport then failed on the same host (a flap that recovered stays context)."""
    ib_hosts: set[str] = set()
    out: list[Finding] = []
    for f in items:
        if f.signature in _IB_FAILURES:
            reporter = _REPORTER.search(f.match.text)
            ib_hosts.update(normalise_host(reporter["host"], nodes) if reporter else [])
        peer = _PEER.search(f.match.text) if f.signature == "nccl_ib_completion_error" else None
        if peer and peer["ip"] in addresses:
            f = Finding(f.match, f.path, addresses[peer["ip"]], f.time)
        out.append(f)
    return [
        Finding(f.match.model_copy(update={"role": Role.ROOT}), f.path, f.node, f.time)
        if f.signature in _NIC_EVENTS and f.node in ib_hosts
        else f
        for f in out
    ]


def _job_line_node(
    m: SignatureMatch, bundle: Bundle, catalogue: Catalogue, found: Findings
) -> str | None:
    """The node a job-log line points at, by the culprit source its entry declares."""
    job = bundle.job
    how = catalogue.get(m.signature).culprit
    if how is Culprit.LINE_HOST and m.host:
        named = normalise_host(m.host, job.nodes)
        return named[0] if len(named) == 1 else None
    if how is not Culprit.RANK_PREFIX:
        return None
    # torchrun's blocks map PyTorch's global ranks; the rank map and the node order map srun
    # task labels. The two numberings differ when one task drives several GPUs (§3.14).
    if m.torch_rank is not None and m.torch_rank in found.rank_hosts:
        return found.rank_hosts[m.torch_rank]
    label = m.task if m.task is not None else m.torch_rank
    return job.rank_node(label) if label is not None else None


def line_hosts(m: SignatureMatch, nodes: Iterable[str]) -> list[str]:
    """Every allocated node a line's ``host`` group names (an srun hostlist may name several)."""
    return normalise_host(m.host, nodes) if m.host else []


def _torchrun_ranks(
    chunk: bytes, nodes: list[str], out: dict[int, str], exits: dict[int, int]
) -> None:
    """rank → node from torchrun failure blocks (an explicit mapping the log supplies). Only
    the few lines before each ``exitcode`` field are matched, never the whole text."""
    for offset, _, _ in _lines_with(chunk, (b"exitcode",)):
        start = offset
        for _ in range(3):  # the block's host and rank lines, and a blank one
            start = chunk.rfind(b"\n", 0, max(start - 1, 0)) + 1 if start else 0
        end = chunk.find(b"\n", offset)
        window = chunk[start : len(chunk) if end == -1 else end]
        text = window[-3 * MAX_LINE :].decode("utf-8", errors="replace")
        for found in _TORCHRUN_ENTRY.finditer(text):
            rank = int(found["rank"][:9])
            if rank not in exits and len(exits) >= MAX_MAPPED:
                continue
            exits[rank] = int(found["exit"][:9])
            named = normalise_host(found["host"], nodes)
            if len(named) == 1:
                out[rank] = named[0]


# Counters whose rise means an uncorrectable memory fault on that GPU.
_HARDWARE_COUNTERS = ("ecc_dbe_volatile", "remapped_rows_uncorrectable", "retired_pages_dbe")


def telemetry_findings(
    samples: Sequence[TelemetrySample], catalogue: Catalogue, nodes: Sequence[str]
) -> list[Finding]:
    """GPU telemetry as findings. A kernel line a sample carries, or its Xid, goes through the
    catalogue like any kernel line (so an Xid 63 stays informational). A counter of
    uncorrectable memory errors counts when it rose between two samples of the same GPU, or,
    for a GPU sampled once, when it is not zero; a row-remapping failure counts as it is."""
    out: list[Finding] = []
    last: dict[tuple[str, int | None], TelemetrySample] = {}
    for no, sample in enumerate(samples, 1):
        node = sample.node if sample.node in nodes else None
        where = f"gpu {sample.gpu}" if sample.gpu is not None else "gpu ?"
        text = sample.message
        if text is None and sample.xid is not None:
            text = f"NVRM: Xid (telemetry {sample.node} {where}): {sample.xid}, telemetry"
        if text:
            m = catalogue.match_line(
                text, line_no=no, source="telemetry", source_node=sample.node, kernel=True
            )
            if m is not None:
                stamped = m.model_copy(update={"timestamp": sample.time or m.timestamp})
                out.append(Finding(stamped, "telemetry.jsonl", node, stamped.timestamp))
        before = last.get((sample.node, sample.gpu))
        last[(sample.node, sample.gpu)] = sample
        risen = [
            f"{name}={getattr(sample, name)}"
            for name in _HARDWARE_COUNTERS
            if (getattr(sample, name) or 0) > (getattr(before, name) or 0 if before else 0)
        ]
        if sample.remapped_rows_failure:
            risen.append("remapped_rows_failure=true")
        if risen:
            m = SignatureMatch(
                signature="telemetry_memory_error",
                category=Category.GPU_HARDWARE,
                role=Role.ROOT,
                severity=5,
                source="telemetry",
                line_no=no,
                text=f"{sample.node} {where}: {', '.join(risen)}",
                host=sample.node,
                timestamp=sample.time,
            )
            out.append(Finding(m, "telemetry.jsonl", node, sample.time))
    return out
