"""From an incident bundle to findings: catalogue matches placed on nodes, in time, deduplicated.

Attribution reasons over findings, not raw lines. A finding is one matched line with the node it
points at (if the line names one through a source the failure reference allows: the node whose
kernel log it is, an NCCL ``host:pid:tid`` prefix, a torchrun ``host :`` field, an ``srun``
hostlist, or a rank label mapped through an explicit rank → node map) and the time it states.
Lines from a node's log that predate the job are kept aside as stale, not used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from relaunch.detection.lines import line_timestamp
from relaunch.detection.signatures import Catalogue, Culprit, Role, SignatureMatch
from relaunch.models import hostlist
from relaunch.models.bundle import Bundle, TelemetrySample
from relaunch.models.errors import InvalidNameError
from relaunch.models.recovery import Category

# How long before the job's first stated time a node's line may still explain it (a health
# event can precede the job failure by minutes; an Xid from last week cannot).
NODE_LOOKBACK = timedelta(minutes=10)

# torchrun's ChildFailedError block: the fields of one failure entry (PT-EL).
_TORCHRUN_ENTRY = re.compile(
    r"^\s*(?:\d+: )?\s*host\s*: (?P<host>\S+)\s*\n"
    r"\s*(?:\d+: )?\s*rank\s*: (?P<rank>\d+) \(local_rank: \d+\)\s*\n"
    r"\s*(?:\d+: )?\s*exitcode\s*: (?P<exit>-?\d+)",
    re.MULTILINE,
)


# NCCL's bootstrap line names the address each host uses: the key to "Got completion from peer
# <ip>", whose suspect is the peer, not the reporter (failure-signatures.md §1.2, §2.2).
_NCCL_ADDRESS = re.compile(
    r"(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] NCCL INFO "
    r"(?:Bootstrap : Using|NET/IB : Using .*OOB) \w+:(?P<ip>\d+\.\d+\.\d+\.\d+)<"
)
_PEER = re.compile(r"Got completion from peer (?P<ip>\d+\.\d+\.\d+\.\d+)<")
_REPORTER = re.compile(r"(?:^|[\s\]])(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ")
# A NIC event that is news only when NCCL's IB transport then fails on the same host (§2.11).
_NIC_EVENTS = frozenset({"mlx5_cable_event", "mlx5_link_down", "netdev_watchdog"})
# IB transport failures (not the non-fatal async events a flap that recovers also prints).
_IB_FAILURES = frozenset({"nccl_ib_fatal", "nccl_ib_completion_error", "nccl_ibv_modify_qp"})


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
    """Everything attribution needs from one bundle."""

    items: list[Finding] = field(default_factory=list)
    stale: list[Finding] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    torchrun_exits: dict[int, int] = field(default_factory=dict)
    job_lines: list[str] = field(default_factory=list)
    first_time: datetime | None = None

    def by_role(self, *roles: Role) -> list[Finding]:
        return [f for f in self.items if f.role in roles]


def normalise_host(host: str, nodes: Iterable[str]) -> list[str]:
    """The allocated nodes a printed host names: as is, as a Slurm hostlist, cut at the first
    dot (FQDNs, NCCL's short names), or with NCCL's ``%``/``/`` → ``-`` mangling undone."""
    allocated = list(nodes)
    if host in allocated:
        return [host]
    try:
        expanded = hostlist.expand(host)
    except InvalidNameError:
        expanded = []
    if len(expanded) > 1 or (expanded and expanded[0] != host):
        return [n for n in expanded if n in allocated]
    short = host.split(".")[0]
    if short in allocated:
        return [short]
    mangled = {n.split(".")[0].replace("%", "-").replace("/", "-"): n for n in allocated}
    return [mangled[short]] if short in mangled else []


def collect(bundle: Bundle, catalogue: Catalogue) -> Findings:
    """Match every source of the bundle and place each match on a node and in time."""
    job = bundle.job
    out = Findings(job_lines=bundle.job_log.splitlines())
    out.rank_hosts = _torchrun_ranks(bundle.job_log, job.nodes, out.torchrun_exits)
    job_matches = catalogue.scan(bundle.job_log, source="job_log")
    times = [t for t in (line_timestamp(line) for line in out.job_lines[:200]) if t]
    out.first_time = min(times) if times else None
    for m in job_matches:
        out.items.append(
            Finding(m, "logs/job.log", _job_line_node(m, bundle, catalogue, out), m.timestamp)
        )
    floor = out.first_time - NODE_LOOKBACK if out.first_time else None
    for node, text in bundle.node_logs.items():
        for m in catalogue.scan(text, source="node_log", source_node=node):
            finding = Finding(
                m, f"nodes/{node}.log", node if node in job.nodes else None, m.timestamp
            )
            stale = floor is not None and m.timestamp is not None and m.timestamp < floor
            (out.stale if stale else out.items).append(finding)
    for finding in telemetry_findings(bundle.telemetry, catalogue, job.nodes):
        stale = floor is not None and finding.time is not None and finding.time < floor
        (out.stale if stale else out.items).append(finding)
    out.items = _network_links(out.items, bundle.job_log, job.nodes)
    return out


def _network_links(items: list[Finding], job_log: str, nodes: list[str]) -> list[Finding]:
    """Place IB completion errors on the peer they name, and make a NIC event a root when
    NCCL's IB transport then failed on the same host (a flap that recovered stays context)."""
    addresses: dict[str, str] = {}
    for found in _NCCL_ADDRESS.finditer(job_log):
        named = normalise_host(found["host"], nodes)
        if len(named) == 1:
            addresses[found["ip"]] = named[0]
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


def _torchrun_ranks(text: str, nodes: list[str], exits: dict[int, int]) -> dict[int, str]:
    """rank → node from torchrun failure blocks (an explicit mapping the log supplies)."""
    out: dict[int, str] = {}
    for found in _TORCHRUN_ENTRY.finditer(text):
        named = normalise_host(found["host"], nodes)
        rank = int(found["rank"])
        exits[rank] = int(found["exit"])
        if len(named) == 1:
            out[rank] = named[0]
    return out


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
            m = catalogue.match_line(text, line_no=no, source="telemetry", source_node=sample.node)
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
