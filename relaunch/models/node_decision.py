"""Contracts of the node decision: one durable workflow per failed node and failure.

When a switch, a PDU or a rack goes, hundreds of jobs are interrupted at once and their
recoveries blame the same few nodes. The first recovery that convicts a node (trusted evidence:
the node's kernel log, telemetry, Slurm's state, Relaunch's probes) starts the node's decision,
``relaunch-<cluster>-node-<node>-<n>``; the others join it. The decision owns the node's drain
(planned once, under the blast-radius guard, approved once in monitor mode) and requeues the
jobs that joined it in batches; each job's own recovery waits for its outcome and verifies its
job. See docs/node-decisions.md.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from relaunch.models.recovery import (
    STRICT,
    Action,
    ActionPlan,
    Category,
    DetectionSource,
    EvidenceSummary,
    GuardDecision,
    Mode,
    Policy,
    Stage,
    StepOutcome,
    Verdict,
)
from relaunch.models.scheduler import ActionResult

_NODE_DECISION = re.compile(r"relaunch-(?P<cluster>.+)-node-(?P<node>.+)-(?P<n>[0-9]+)")


def node_decision_id(cluster: str, node: str, n: int) -> str:
    """The id of a node's ``n``-th decision: ``relaunch-<cluster>-node-<node>-<n>``."""
    return f"relaunch-{cluster}-node-{node}-{n}"


def node_task_queue(cluster: str) -> str:
    """The task queue of a cluster's node decisions and their activities: the workers poll it
    beside the cluster's own, so that a decision is never queued behind the hundreds of job
    recoveries whose failure it decides."""
    return f"relaunch-{cluster}-nodes"


def parse_node_decision_id(workflow_id: str) -> tuple[str, str, int] | None:
    """(cluster, node, n) of a node decision's id; None when ``workflow_id`` is not one."""
    m = _NODE_DECISION.fullmatch(workflow_id)
    return (m["cluster"], m["node"], int(m["n"])) if m else None


class JoinRequest(BaseModel):
    """A job recovery joining a node's decision (the `join` signal): what the decision needs to
    requeue the job on the recovery's behalf."""

    model_config = STRICT

    recovery_id: str = Field(description="the job recovery's workflow id (its incident id)")
    job_id: str
    partition: str = ""
    expected_restart_count: int = Field(description="the job's restart count at its evidence")
    max_restarts: int | None = None
    category: Category
    confidence: float = 0.0
    summary: str = ""
    exclude_nodes: list[str] = Field(
        default_factory=list, description="every node the job's verdict blames (excluded)"
    )
    requeue_by: str = Field(
        description="the node whose decision requeues the job: one per job, though a job that "
        "blames several nodes joins each of their decisions"
    )
    unreachable: bool = Field(
        default=False, description="the recovery's own probes found the node's slurmd silent"
    )
    remedy: str | None = Field(default=None, description="the Xid catalogue's rung, if any")
    mode: Mode = Field(description="the job's own mode (its partition's and category's)")


class ReportedJob(BaseModel):
    """A watched job running on a reported node, on that node alone of the nodes the watcher
    reported: the node's decision may requeue it ahead of its recovery's join (see
    ``NodeReport.running``)."""

    model_config = STRICT

    job_id: str
    partition: str = ""
    restart_count: int = Field(description="the job's restart count as the watcher saw it")
    max_restarts: int | None = None


class NodeReport(BaseModel):
    """The watcher's own finding that a node failed (the `report` signal), from what the job's
    user cannot write: its probes had no answer from the node's slurmd (source ``probe``), or
    the node's own kernel log has an Xid line the catalogue drains a node for (``node_log``).
    Trusted evidence, so the report may start the node's decision before any job's recovery has
    joined it. The decision probes the node again (plan_node): a node the probes called gone
    that answers by then is not convicted on the report (the verdicts of its jobs decide)."""

    model_config = STRICT

    node: str
    source: DetectionSource = DetectionSource.PROBE
    kind: str = Field(
        default="node_unreachable", description="node_unreachable, or signature:<id> (an Xid)"
    )
    category: Category = Category.NODE_FAILURE
    text: str = Field(description="what the probes saw, or the kernel log's line")
    remedy: str | None = Field(default=None, description="the Xid catalogue's rung, if any")
    failing_since: datetime | None = None
    detected_at: datetime
    partitions: list[str] = Field(
        default_factory=list, description="the partitions of the watched jobs running there"
    )
    jobs: int = Field(default=0, description="watched jobs running on the node")
    running: list[ReportedJob] = Field(
        default_factory=list,
        max_length=2000,
        description="the watched jobs running on the node whose other nodes the watcher did not "
        "report: once the decision has drained and fenced the node (its slurmd silent to a "
        "fresh probe, so Slurm ends every job there), it requeues them at once, ahead of their "
        "recoveries' joins (a job on two reported nodes waits for its join: no two decisions "
        "requeue one job)",
    )


class NodeDecisionInput(BaseModel):
    """Input of NodeDecisionWorkflow: the node, and the first recovery that convicted it."""

    model_config = STRICT

    cluster: str
    node: str
    n: int
    policy: Policy = Field(default_factory=Policy)


class JobOutcome(StrEnum):
    """What a node decision did for one job that joined it."""

    REQUEUED = "requeued"  # requeued by the decision's batch (or found requeued already)
    ISOLATED = "isolated"  # the node is out; another node's decision requeues the job
    HOLD = "hold"  # the job's own recovery holds it (budget spent, drain refused)
    CANCELLED = "cancelled"  # cancelled by someone after its recovery began: not restarted
    REJECTED = "rejected"
    EXPIRED = "expired"
    FAILED = "failed"


class NodeUpdate(BaseModel):
    """The `node_update` signal a node decision sends the job recoveries that joined it."""

    model_config = STRICT

    decision_id: str
    node: str
    stage: Stage
    awaiting_approval: bool = False
    covers: int = Field(default=0, description="job recoveries the decision covers so far")
    outcome: JobOutcome | None = Field(default=None, description="set once the job's turn came")
    detail: str = ""
    changed: bool = False


class NodePlan(BaseModel):
    """What a node decision will do once allowed."""

    decision_id: str
    node: str
    mode: Mode
    drain: bool = Field(description="false when the node is already out of service")
    fence: bool = False
    guards: list[GuardDecision] = Field(default_factory=list)
    needs_override: bool = False
    reasons: list[str] = Field(default_factory=list)
    remedy: str | None = None
    category: Category | None = Field(default=None, description="the fault's category")
    job_id: str = Field(description="the first job's: the guard counts its partition")
    partition: str | None = Field(
        default=None, description="the partition the guard counts when no job convicted the node"
    )
    convicted: bool = Field(
        default=True,
        description="false when a watcher's report was not confirmed by a fresh probe: the "
        "decision plans again from the first job that joins",
    )
    isolated: StepOutcome | None = Field(
        default=None,
        description="what `isolate` did, when plan_node isolated the node at once (no person "
        "need approve: autonomous mode, the guard allows)",
    )
    ahead: list[Ahead] = Field(
        default_factory=list,
        description="the jobs of the watcher's report requeued ahead of their joins, once the "
        "node was isolated on a report a fresh probe confirmed",
    )

    def isolation(self) -> ActionPlan:
        """This plan as the `isolate` activity takes it (guard re-check, drain, fence)."""
        return ActionPlan(
            request_id=f"{self.decision_id}/plan",
            action=Action.ISOLATE_AND_RESTART,
            mode=self.mode,
            drain_nodes=[self.node] if self.drain else [],
            fence_nodes=[self.node] if self.fence else [],
            job_id=self.job_id,
            expected_restart_count=0,
            guards=self.guards,
            reasons=self.reasons,
            needs_override=self.needs_override,
            remedies={self.node: self.remedy} if self.remedy else {},
            guard_partition=self.partition,
            category=self.category,
        )


class NodePlanInput(BaseModel):
    model_config = STRICT

    decision_id: str
    cluster: str
    node: str
    first: JoinRequest | None = Field(
        default=None, description="the first job recovery that joined (and convicted the node)"
    )
    report: NodeReport | None = Field(
        default=None,
        description="the watcher's report: what convicts the node when it came before any "
        "join; with ``first``, only the jobs to requeue ahead of their joins",
    )
    policy: Policy
    stage_summary: str = Field(
        description="the summary of the decision's planning stage, which plan_node records first"
    )


class LookAgainInput(BaseModel):
    """A second look at a node the decision drained with the watcher's report in hand, where its
    jobs were not requeued ahead: the report came only after the drain (a job's join started the
    decision), or the node's slurmd still answered plan_node's probe (an Xid line is often
    written before the node dies). Once a fresh read finds the node still out of service and a
    fresh probe its slurmd silent, the node is fenced (if it is not down yet) and the report's
    jobs that have not joined are requeued ahead, as `plan_node` does."""

    model_config = STRICT

    decision_id: str
    cluster: str
    node: str
    report: NodeReport
    plan: NodePlan = Field(description="the decision's plan (the fence goes by its guard)")
    policy: Policy
    joined: list[str] = Field(
        default_factory=list,
        max_length=2000,  # of the report's jobs, as many as it lists
        description="the report's jobs whose recoveries joined already: their batches requeue them",
    )
    last: bool = Field(
        default=False, description="the decision's last look: say so when the node still answers"
    )


class LookAgainResult(BaseModel):
    model_config = STRICT

    looked: Literal["silent", "answers", "back"] = Field(
        description="silent: fenced and the jobs requeued ahead; answers: its slurmd answers, "
        "look again later; back: no longer out of service (or no longer listed), stop looking"
    )
    ahead: list[Ahead] = Field(default_factory=list)


class NodeActInput(BaseModel):
    model_config = STRICT

    decision_id: str
    cluster: str
    plan: NodePlan


class Ahead(BaseModel):
    """A job the decision requeued ahead of its recovery's join (plan_node, from the watcher's
    report): what Slurm did and when. The job's own restart row is written when its recovery
    joins, dated when the requeue happened."""

    model_config = STRICT

    job_id: str
    expected_restart_count: int
    result: ActionResult
    at: datetime


class BatchJob(BaseModel):
    """One job of a requeue batch."""

    model_config = STRICT

    recovery_id: str
    job_id: str
    expected_restart_count: int
    max_restarts: int | None = None
    exclude_nodes: list[str] = Field(default_factory=list)
    ahead: Ahead | None = Field(
        default=None,
        description="requeued ahead of the join: the batch only records it in the job's trail",
    )


class RequeueBatchInput(BaseModel):
    model_config = STRICT

    decision_id: str
    cluster: str
    node: str
    batch: int = Field(description="the batch's number in this decision (1, 2, ...)")
    jobs: list[BatchJob]
    policy: Policy
    out_of_service: bool = Field(
        default=False,
        description="the decision took the node out (or found it out): requeue only while it "
        "still is, since a node put back in service and failing again is a new failure",
    )


class BatchResult(BaseModel):
    """What the batch did for one job."""

    recovery_id: str
    job_id: str
    outcome: JobOutcome
    changed: bool = False
    detail: str = ""


class RequeueBatchResult(BaseModel):
    results: list[BatchResult]
    back_in_service: str | None = Field(
        default=None,
        description="the node's state when someone put it back in service after the decision "
        "took it out: nothing was requeued (the node's new failure is not this decision's)",
    )


class JoinInput(BaseModel):
    """Input of `join_node_decisions`: a job recovery's verdict, to join its culprits'
    decisions where the verdict convicts them (see ``planning.node_decision_nodes``)."""

    model_config = STRICT

    incident_id: str
    cluster: str
    verdict: Verdict
    evidence: EvidenceSummary
    policy: Policy


class Investigation(BaseModel):
    """What `investigate` found: the evidence, the verdict, and the node decisions joined."""

    evidence: EvidenceSummary
    verdict: Verdict
    joined: Joined


class Joined(BaseModel):
    """The node decisions a job recovery joined (node → decision id); none: plan alone."""

    decisions: dict[str, str] = Field(default_factory=dict)
    requeue_by: str = Field(default="", description="the decision that requeues the job")


class NodeDecisionStatus(BaseModel):
    """Answer of a node decision's `status` query."""

    decision_id: str
    node: str
    stage: Stage
    mode: Mode | None = None
    plan: NodePlan | None = None
    awaiting_approval: bool = False
    approval_deadline: datetime | None = None
    decided_by: str | None = None
    covers: list[str] = Field(default_factory=list, description="the job recoveries that joined")
    requeued: int = 0
    outcome: str = ""
