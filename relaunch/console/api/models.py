"""What `/api/v1` answers and takes: pydantic models, the same ones its OpenAPI document is
generated from (openapi.py), so the document cannot drift from the answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from relaunch.connectors.audit import IncidentRow, NodeReputation, StoredEvent
from relaunch.console.auth import ConsoleRole
from relaunch.console.lifecycles import LifecycleView, PendingView
from relaunch.console.queries import NodeDrain
from relaunch.console.routes_incident import MAX_REASON, StageSpan
from relaunch.models.recovery import Decision
from relaunch.models.rollout import ModeChange, Scorecard
from relaunch.models.scheduler import Node

MAX_REQUEST_ID = 300


class ApiError(BaseModel):
    """Every refusal and failure: what went wrong, and the parameter or field at fault."""

    error: str
    field: str | None = None


class Me(BaseModel):
    """Who the caller is: the token's name, role and cluster scope (None: every cluster).
    ``csrf_token`` is the header value a session cookie's state-changing calls need."""

    name: str
    role: ConsoleRole
    clusters: list[str] | None = None
    csrf_token: str | None = None


class IncidentPage(BaseModel):
    """A page of incidents, newest first; ``next_cursor`` fetches the next (None: the last)."""

    items: list[IncidentRow]
    next_cursor: str | None = None


class DecisionRecord(BaseModel):
    """A person's decision on one step of an incident, as the workflow recorded it."""

    row_id: int
    at: datetime
    decision: str
    by: str
    reason: str = ""
    request_id: str | None = None
    step: str | None = None


class Links(BaseModel):
    timeline: str
    verdict: str
    plan: str
    approve: str
    reject: str
    workflow: str


class IncidentDetail(BaseModel):
    """One incident: its latest stage, verdict, plan and mode, whether it awaits a decision
    and the ``request_id`` to decide it with. ``kind`` says what the id names: a job's
    recovery, a node decision (one decision for the jobs a failed node took down) or a node
    lifecycle (checks, remediation and return of a drained node)."""

    incident: IncidentRow
    kind: str = Field(description="recovery, node_decision or lifecycle")
    node: str | None = Field(default=None, description="the node of a node decision or lifecycle")
    stage: str | None = Field(
        default=None, description="the latest stage (a lifecycle's: its node stage)"
    )
    stages: list[StageSpan] = Field(default_factory=list)
    mode: str | None = None
    awaiting_approval: bool = False
    request_id: str | None = Field(
        default=None, description="the request a decision answers now (None: nothing waits)"
    )
    pending: PendingView | None = None
    decisions: list[DecisionRecord] = Field(default_factory=list)
    verdict: VerdictView | None = None
    plan: PlanView | None = None
    node_decisions: dict[str, str] = Field(
        default_factory=dict,
        description="a job recovery that joined node decisions: node → the node decision's id",
    )
    covers: list[str] = Field(
        default_factory=list, description="a node decision: the job recoveries it decides for"
    )
    served_here: bool = Field(
        description="whether this console serves the incident's cluster (and can decide it)"
    )
    links: Links


class EvidenceLineView(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = "root"
    source: str = ""
    text: str = ""
    signature: str = ""
    node: str | None = None
    decisive: bool = False


class ExcerptLine(BaseModel):
    text: str
    decisive: bool = False


class VerdictView(BaseModel):
    """The incident's latest verdict: category, culprits, confidence, the evidence lines
    (decisive ones flagged) and the log excerpt; ``data`` is the whole audit row's data."""

    row_id: int
    at: datetime
    summary: str = ""
    category: str = "unknown"
    culprit_nodes: list[str] = Field(default_factory=list)
    confidence: float = 0.0
    action: str | None = None
    evidence_lines: list[EvidenceLineView] = Field(default_factory=list)
    log_excerpt: list[ExcerptLine] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)


class PlanView(BaseModel):
    """The incident's latest plan: the action, the mode, the nodes to drain or exclude, the
    guards; ``data`` is the whole audit row's data."""

    row_id: int
    at: datetime
    summary: str = ""
    action: str = "none"
    mode: str = ""
    request_id: str | None = None
    drain_nodes: list[str] = Field(default_factory=list)
    fence_nodes: list[str] = Field(default_factory=list)
    exclude_nodes: list[str] = Field(default_factory=list)
    restart_method: str = ""
    reasons: list[str] = Field(default_factory=list)
    guards: list[dict[str, Any]] = Field(default_factory=list)
    needs_override: bool = False
    data: dict[str, Any] = Field(default_factory=dict)


class EventPage(BaseModel):
    """A page of audit rows (a timeline oldest first; the audit search newest first)."""

    items: list[StoredEvent]
    next_cursor: str | None = None


class NodeItem(BaseModel):
    """One node: Slurm's view (None when Slurm does not list it or does not answer), the
    latest drain/fence/resume recorded for it, its lifecycle and its reputation."""

    name: str
    cluster: str
    slurm: Node | None = None
    state: str | None = Field(default=None, description="Slurm state with its flags")
    drain_reason: str | None = None
    drained_by_relaunch: bool = False
    drain: NodeDrain | None = None
    lifecycle: LifecycleView | None = None
    lifecycle_stage: str | None = None
    reputation: NodeReputation | None = None


class NodeList(BaseModel):
    """The nodes of one cluster; ``slurm_error`` says why Slurm's columns are empty."""

    cluster: str
    window: str
    slurm_error: str | None = None
    items: list[NodeItem]


class Scorecards(BaseModel):
    """One scorecard per cluster asked for (docs/autonomy.md)."""

    items: list[Scorecard]


class ModeChanges(BaseModel):
    """The audited promotions and demotions of each cluster asked for, oldest first."""

    items: list[ModeChange]


class DecisionBody(BaseModel):
    """An approve or reject: why, and the request it answers (the incident's ``request_id``;
    without it, the request that waits now). The same ``Idempotency-Key`` header or the same
    ``request_id`` makes a retry safe."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=MAX_REASON)
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST_ID)


class DecisionAnswer(BaseModel):
    """The decision taken: the same answer for the call that took it and for every retry of
    it (a retry's answer has the header ``Idempotent-Replayed: true``)."""

    incident_id: str
    cluster: str
    request_id: str
    decision: Decision
    by: str
    reason: str = ""


IncidentDetail.model_rebuild()
