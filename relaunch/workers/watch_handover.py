"""What the watcher hands over besides a job's first detection: reports of failed nodes to their
node decisions, and the later signs of an interruption, held and handed over together.

**Node reports.** When what the job's user cannot write says a node failed (the probes have no
answer from its slurmd, or its own kernel log has an Xid the catalogue drains a node for), the
node is reported to its node decision (relaunch/workflows/node_decision.py) at once, ahead of
the handover of the jobs' detections, once per node in ``REPORT_QUIET_S``: the decision drains
the node while the recoveries of its jobs are still starting. The report lists the node's
watched jobs that run on no other reported node: once the decision has fenced the node (its
slurmd silent to a fresh probe), it requeues them at once. Job output never leads to a report.
The first detections of those jobs are handed over once the watcher sees the node drained (or
``DECISION_LEAD_S`` after the report; at once when the report reached a decision that was
running already, maybe an earlier failure's about to close, or when a person must approve the
drain, as in monitor mode, which the recoveries show): when a rack fails, the decisions drain
and requeue while hundreds of recoveries would otherwise be starting on the same worker and
server, and each recovery, when it starts, joins a decision that has done its work.

**Later signs.** One interruption shows several signs a few seconds apart: a node's Xid line,
then its probes failing, then Slurm's job and node states, then the job's requeue. The first
sign starts the job attempt's recovery at once. The later signs of a recovery this watcher
handed over are held for ``hold_s`` from the first of them and handed over together, in one
`detections` signal, because a signal of its own for each would be a workflow task and an audit
row each: when a rack fails, 500 recoveries would get some 1,400 of them in the first minute, on
the same server and worker as the recoveries themselves. Held, every sign still reaches the
recovery's timeline, a few seconds later. Nothing decides on them there (the recovery reads
the job, its nodes and their logs itself), so nothing waits for them either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from relaunch.connectors.lease import LeaseLostError
from relaunch.detection.attribution import xid_remedy
from relaunch.detection.signatures import Role, SignatureMatch
from relaunch.detection.xids import Outcome
from relaunch.models.node_decision import NodeReport, ReportedJob
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, spare_left

logger = logging.getLogger("relaunch.workers.watcher")

# Sends a report to the node's decision; False when that decision was running already (it may
# be an earlier failure's, about to close: the jobs' recoveries do not wait for it).
NodeReportHandler = Callable[[NodeReport], Awaitable[bool | None]]
# A node is reported at most once in this long: the failure's later signs (more Xid lines, the
# probes of a node still down) would reach the same node decision, which stays open this long
# after its last join (workflows/node_decision.py, JOIN_WINDOW).
REPORT_QUIET_S = 600.0
# The jobs' handover waits at most this long for the node reports made with them to go out.
REPORT_LEAD_S = 2.0
# A log pass that found a node report in a kernel log lets it go out (its signal sent; the
# answer may come later) for at most this long before reading the jobs' logs.
REPORT_SEND_S = 0.05
# At most this many of a node's jobs go with its report (NodeReport.running); any more join.
REPORT_JOBS_MAX = 2000
# The first detections of a reported node's jobs wait at most this long after the report for
# the watcher to see the node drained (its decision's first action) before they are handed over.
DECISION_LEAD_S = 10.0

# Recoveries remembered as handed over; the oldest are forgotten beyond this (a later sign of
# one of those is then handed over at once, as a first one is: nothing is lost).
MAX_REMEMBERED = 50_000


@dataclass
class Held:
    since: float
    detections: list[Detection] = field(default_factory=list)


class FollowUps:
    """Which recoveries were handed over (by workflow id), and their later signs held."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._handed: dict[str, float] = {}
        self._held: dict[str, Held] = {}

    def handed(self, workflow_id: str, now: float) -> None:
        """A first sign of ``workflow_id`` was handed over at ``now``."""
        if self.hold_s <= 0:  # nothing is held: nothing to remember
            return
        self._handed[workflow_id] = now
        if len(self._handed) > MAX_REMEMBERED:  # dicts keep insertion order: oldest first
            for old in list(self._handed)[: len(self._handed) - MAX_REMEMBERED]:
                del self._handed[old]

    def hold(self, groups: dict[str, list[Detection]], now: float) -> list[Detection]:
        """Take the groups of recoveries already handed over out of ``groups`` and hold them;
        the detections held."""
        if self.hold_s <= 0:
            return []
        taken: list[Detection] = []
        for workflow_id in [w for w in groups if w in self._handed]:
            dets = groups.pop(workflow_id)
            self._held.setdefault(workflow_id, Held(now)).detections.extend(dets)
            taken.extend(dets)
        return taken

    def due(self, now: float, *, everything: bool = False) -> dict[str, list[Detection]]:
        """The held signs whose hold is over (all of them with ``everything``), in order;
        they stay held until :meth:`delivered`."""
        return {
            workflow_id: held.detections
            for workflow_id, held in self._held.items()
            if everything or now - held.since >= self.hold_s
        }

    def delivered(self, workflow_id: str) -> None:
        self._held.pop(workflow_id, None)

    def next_due_in(self, now: float) -> float | None:
        """Seconds until the next hold is over; None when nothing is held."""
        if not self._held:
            return None
        return max(0.0, min(h.since for h in self._held.values()) + self.hold_s - now)

    def __len__(self) -> int:
        return sum(len(h.detections) for h in self._held.values())


class NodeReports:
    """The watcher's reports of failed nodes (see the module docstring). ``running_on`` gives
    the watched jobs a node's failure hit: those running there and those that just ended
    there (their partitions set the decision's mode; the running ones may be requeued ahead)."""

    def __init__(
        self,
        handler: NodeReportHandler | None,
        running_on: Callable[[str], list[Job]],
        acts_alone: Callable[[NodeReport], bool] | None = None,
    ) -> None:
        self._handler = handler
        self._running_on = running_on
        # Whether the report's decision drains without a person (policy.acts_alone): only then
        # do its jobs' recoveries wait for the drain (in monitor mode it waits for them).
        self._acts_alone = acts_alone or (lambda report: True)
        # node → when it was last reported (monotonic): one report per node and failure.
        self._reported: dict[str, float] = {}
        # Xid lines of nodes' own kernel logs that drain a node, found since the last report.
        self._xids: dict[str, NodeReport] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # job id → (the reported node whose decision may requeue it, when reported; monotonic)
        self._deciding: dict[str, tuple[str, float]] = {}

    def kernel_log(self, node: str, matches: list[SignatureMatch]) -> None:
        """Keep the first line of the node's own kernel log in ``matches`` that the Xid
        catalogue drains a node for, to report the node with the next detections."""
        if self._handler is None or node in self._xids:
            return
        for match in matches:
            if match.role is Role.ROOT and match.xid_outcome is Outcome.DRAIN:
                self._xids[node] = NodeReport(
                    node=node,
                    source=DetectionSource.NODE_LOG,
                    kind=f"signature:{match.signature}",
                    category=match.category,
                    text=match.text[:500],
                    remedy=xid_remedy(match),
                    failing_since=match.timestamp,
                    detected_at=datetime.now(UTC),
                )
                return

    def defers(self, det: Detection, now: float) -> bool:
        """Whether to hand ``det`` over later: its job is one a node decision may requeue
        ahead of its join (listed in the node's report), the node not yet seen drained, and the
        report younger than DECISION_LEAD_S."""
        deciding = self._deciding.get(det.job_id)
        if deciding is None:
            return False
        if now - deciding[1] < DECISION_LEAD_S:
            return True
        del self._deciding[det.job_id]
        return False

    def _release(self, report: NodeReport) -> None:
        """The report's jobs are handed over at once: no new decision acts on it."""
        for job in report.running:
            self._deciding.pop(job.job_id, None)

    def nodes_seen(self, drained: set[str]) -> None:
        """The poll's listing: the jobs of the reported nodes it lists drained are handed over
        (their decisions have acted)."""
        if self._deciding and drained:
            for job_id, (node, _) in list(self._deciding.items()):
                if node in drained:
                    del self._deciding[job_id]

    def deferring(self, now: float) -> bool:
        """Whether some job's recovery may still wait to see its node drained (the waits over
        are forgotten: a job whose detection never came holds nothing)."""
        for job_id, (_, since) in list(self._deciding.items()):
            if now - since >= DECISION_LEAD_S:
                del self._deciding[job_id]
        return bool(self._deciding)

    @property
    def waiting(self) -> bool:
        """Whether a node's kernel log gave a report not yet made."""
        return bool(self._xids)

    def start(self, new: list[Detection]) -> None:
        """Report, in a task of its own, the nodes that ``new`` (and the kernel logs read with
        it) say failed: a report never waits behind hundreds of recoveries being started."""
        if self._handler is None:
            return
        task = asyncio.create_task(self.report(new))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self, timeout: float) -> None:
        """Let the reports under way finish (the watcher is stopping)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)

    async def report(self, detections: Iterable[Detection]) -> None:
        """Report each node that failed by what the job's user cannot write (trusted), once
        per node and failure: the probes call it unreachable, or its own kernel log has an Xid
        the catalogue drains a node for. A report that fails is said (and made again with the
        failure's next sign); the jobs' recoveries still join the decision."""
        handler = self._handler
        if handler is None:
            return
        found, self._xids = list(self._xids.values()), {}
        for det in detections:
            if det.source is DetectionSource.PROBE and det.kind == "node_unreachable":
                found.extend(
                    NodeReport(
                        node=node,
                        kind=det.kind,
                        text=det.text,
                        failing_since=det.fault_time,
                        detected_at=det.detected_at,
                    )
                    for node in det.nodes
                )
        reports: dict[str, NodeReport] = {}
        running_on: dict[str, list[Job]] = {}  # each reported node's watched jobs, read once
        now = time.monotonic()
        for report in found:
            last = self._reported.get(report.node)
            if report.node in reports or (last is not None and now - last < REPORT_QUIET_S):
                continue
            running = running_on[report.node] = self._running_on(report.node)
            reports[report.node] = report.model_copy(
                update={
                    "partitions": sorted({j.partition for j in running if j.partition}),
                    "jobs": len(running),
                }
            )
            self._reported[report.node] = now  # under way: a concurrent pass does not repeat it
        # The jobs each decision may requeue ahead of their joins: those on no other node
        # reported (now or lately), so that no two decisions requeue one job; never one that
        # trains again on a spare of its own (its recovery takes the node out of it instead).
        out = {n for n, at in self._reported.items() if now - at < REPORT_QUIET_S}
        for node, report in reports.items():
            alone = [
                j
                for j in running_on[node]
                if j.state is JobState.RUNNING
                and not (set(j.nodes) - {node}) & out
                and not spare_left(j.nodes, j.train_nodes, [node])
            ]
            report.running = [
                ReportedJob(
                    job_id=j.job_id,
                    partition=j.partition,
                    restart_count=j.restart_count,
                    max_restarts=j.max_restarts,
                )
                for j in alone[:REPORT_JOBS_MAX]
            ]
            # The jobs' recoveries wait for the decision's drain, from now: a report whose
            # round trip is slow (a loaded server) must not let 500 recoveries start first.
            # Not where a person must approve the drain: the recoveries show what awaits them.
            if self._acts_alone(report):
                for job in report.running:
                    self._deciding[job.job_id] = (node, now)

        async def one(report: NodeReport) -> None:
            try:
                started = await handler(report)
            except LeaseLostError:  # another watcher leads now: its report, not ours
                self._reported.pop(report.node, None)
                self._release(report)
                return
            except Exception:
                logger.exception("reporting node %s failed", report.node)
                self._reported.pop(report.node, None)
                self._release(report)  # no decision has it
                return
            if started is False:  # a decision running already: it may not act on it
                self._release(report)
            logger.info(
                "node report", extra={"node": report.node, "kind": report.kind, "jobs": report.jobs}
            )

        await asyncio.gather(*(one(r) for r in reports.values()))
