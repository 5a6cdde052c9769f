"""Which rank held a synchronous job back: the straggler behind a hang.

When one rank stops, every other rank's next collective times out, and each prints the
collective it was waiting in (``WorkNCCL(SeqNum=<n>, …)``). The rank that stopped is the one
that never got there: it reports a lower sequence number, or nothing at all while the others
report. When ranks print their own step times, a rank far above the median is slow too.
Ranks are job-log labels (``srun -l``'s task, PyTorch's ``[rank<r>]``); the caller maps them to
nodes only through an explicit map.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

_LABEL = re.compile(r"^[ \t]*(?:P\d+ )?(?P<task>\d+): |^\[rank(?P<rank>\d+)\]:")
_PG_RANK = re.compile(r"\[(?:PG ID \d+ PG GUID \S+ )?Rank (?P<rank>\d+)\]|\[rank(?P<r2>\d+)\]:")
_SEQNUM = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+)")
_RANK_FIELD = re.compile(r"(?:^|\s)rank=(\d+)\b")
_STEP_TIME = re.compile(
    r"(?:\bstep_time|\biter_time)=(?P<s>\d+(?:\.\d+)?)s?\b"
    r"|elapsed time per iteration \(ms\): (?P<ms>\d+(?:\.\d+)?)"
)
SLOW_FACTOR = 2.0
# A line that can carry a collective timeout holds this: a literal search finds them anywhere
# in a log, where the other lines the rules read (labels, step times) come from its two ends.
STRAGGLER_LITERALS = (b"WorkNCCL(SeqNum=",)


@dataclass
class StragglerReport:
    """What the log says about lagging ranks."""

    timed_out: dict[int, int] = field(default_factory=dict)  # rank → highest SeqNum reported
    lagging: list[int] = field(default_factory=list)
    silent: list[int] = field(default_factory=list)
    slow: list[int] = field(default_factory=list)
    reason: str = ""

    @property
    def ranks(self) -> list[int]:
        """The stragglers, strongest evidence first: a lower SeqNum, then silence, then slow."""
        return self.lagging or self.silent or self.slow


def _rank(line: str) -> int | None:
    label = _LABEL.match(line)
    if label:
        return int(label["task"] or label["rank"])
    pg = _PG_RANK.search(line)
    if pg:
        return int(pg["rank"] or pg["r2"])
    field_ = _RANK_FIELD.search(line)
    return int(field_.group(1)) if field_ else None


def find_stragglers(lines: Iterable[str], known_ranks: Iterable[int] = ()) -> StragglerReport:
    """Stragglers from the job's log lines. ``known_ranks`` are ranks known to exist (the
    bundle's rank map); ranks seen printing anything count as known too."""
    report = StragglerReport()
    seen: set[int] = set(known_ranks)
    times: dict[int, list[float]] = {}
    for line in lines:
        rank = _rank(line)
        if rank is None:
            continue
        seen.add(rank)
        seq = _SEQNUM.search(line)
        if seq:
            report.timed_out[rank] = max(report.timed_out.get(rank, 0), int(seq.group(1)))
            continue
        step = _STEP_TIME.search(line)
        if step:
            value = float(step["s"]) if step["s"] else float(step["ms"]) / 1000
            times.setdefault(rank, []).append(value)
    if report.timed_out:
        low, high = min(report.timed_out.values()), max(report.timed_out.values())
        if low < high:
            report.lagging = sorted(r for r, s in report.timed_out.items() if s == low)
            report.reason = (
                f"rank(s) {_ranks(report.lagging)} stopped at SeqNum {low}; others reached {high}"
            )
        silent = sorted(seen - set(report.timed_out))
        # Silence means something only when most ranks did report.
        if silent and len(silent) <= max(1, len(seen) // 4):
            report.silent = silent
            if not report.reason:
                report.reason = (
                    f"{len(report.timed_out)} rank(s) timed out in SeqNum {high}; "
                    f"rank(s) {_ranks(silent)} never reported"
                )
    last = {r: ts[-3:] for r, ts in times.items() if ts}
    if len(last) >= 3:
        typical = statistics.median(statistics.median(ts) for ts in last.values())
        report.slow = sorted(
            r
            for r, ts in last.items()
            if typical > 0 and statistics.median(ts) > SLOW_FACTOR * typical
        )
        if report.slow and not report.reason:
            report.reason = (
                f"rank(s) {_ranks(report.slow)} step time above {SLOW_FACTOR:g}x "
                f"the median {typical:.2f}s"
            )
    return report


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:8]) + (" …" if len(ranks) > 8 else "")
