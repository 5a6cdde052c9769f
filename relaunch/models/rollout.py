"""Earning autonomy: the scorecard of monitor-mode recommendations against what happened next,
and the audited mode changes (promotions and demotions) that stage a rollout.

A *recommendation* is one plan Relaunch made (an ``plan`` audit row): a job's own recovery plan,
or a node decision's plan to drain a node and requeue its jobs. What operators did with it is
its *response*; what happened after an action is its *outcome*, judged from the audit trail
alone (docs/autonomy.md):

- a **drain** is right when the drained node's lifecycle found it faulty (its first diagnosis
  failed, or it went to repair) and wrong when that diagnosis passed (a healthy node drained);
- a **restart** is right when the restarted job was seen running again and ran
  ``restart_ok_after_s`` without failing the same way, and wrong when the same failure came
  back sooner (a job never seen running again stays pending);
- a **hold** is right when the job was then cancelled or failed the same way again within the
  window, and wrong when neither happened (the hold stopped a job that would have run).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from relaunch.models.recovery import Mode


class Response(StrEnum):
    """What the operators did with a recommendation."""

    AUTONOMOUS = "autonomous"  # nobody was asked: Relaunch acted alone
    NOT_ASKED = "not_asked"  # monitor mode, but nothing needed approval (no action, a hold)
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    ACTED_DIFFERENTLY = "acted_differently"  # drained a node or cancelled the job themselves
    PENDING = "pending"  # still waiting for a decision


DECIDED = (
    Response.APPROVED,
    Response.REJECTED,
    Response.EXPIRED,
    Response.ACTED_DIFFERENTLY,
)


class Outcome(StrEnum):
    RIGHT = "right"
    WRONG = "wrong"
    PENDING = "pending"  # acted on, not judged yet (the window runs, the checks run)
    NONE = "none"  # nothing was done, so there is nothing to judge


class ActionKind(StrEnum):
    DRAIN = "drain"
    RESTART = "restart"
    HOLD = "hold"
    NONE = "none"


class ScopeKind(StrEnum):
    CATEGORY = "category"
    PARTITION = "partition"


class RolloutSettings(BaseModel):
    """How the scorecard judges and when it suggests a promotion (``rollout`` in a cluster's
    configuration)."""

    model_config = ConfigDict(extra="forbid")

    restart_ok_after_s: float = Field(
        default=1800.0,
        gt=0,
        le=30 * 86400,
        description="a restarted job that runs this long without failing the same way again "
        "counts as a right restart (and a hold that no cancel or same failure followed "
        "within it as a needless one)",
    )
    window_days: float = Field(
        default=30.0, gt=0, le=3650, description="the scorecard looks this far back by default"
    )
    promote_min_decisions: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description="decisions operators made on a category's or partition's recommendations "
        "before Relaunch suggests promoting it",
    )
    promote_min_share: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="the share of those decisions that were approved and proved right",
    )


class Recommendation(BaseModel):
    """One plan Relaunch made, what operators did with it, and how it turned out."""

    incident_id: str
    at: datetime
    category: str
    partition: str
    action: ActionKind
    mode: Mode
    response: Response
    outcome: Outcome
    nodes: list[str] = Field(default_factory=list)
    jobs: list[str] = Field(default_factory=list)
    why: str = Field(default="", description="what the response and the outcome were read from")


class Judged(BaseModel):
    """One action carried out (a drain of one node, a restart or a hold of one job) and its
    outcome."""

    incident_id: str
    at: datetime
    action: ActionKind
    target: str = Field(description="the node drained, or the job restarted or held")
    category: str
    partition: str
    mode: Mode
    outcome: Outcome
    why: str = ""


class Tally(BaseModel):
    """Counts of one scope (a category, a partition, or all)."""

    recommended: int = 0
    autonomous: int = 0
    not_asked: int = 0
    approved: int = 0
    rejected: int = 0
    expired: int = 0
    acted_differently: int = 0
    pending: int = 0
    approved_right: int = 0
    approved_wrong: int = 0
    autonomous_wrong: int = 0

    @property
    def decided(self) -> int:
        return self.approved + self.rejected + self.expired + self.acted_differently

    @property
    def approved_right_share(self) -> float | None:
        return self.approved_right / self.decided if self.decided else None


class Precision(BaseModel):
    """Right and wrong actions of one kind (drains, restarts or holds), with counts."""

    right: int = 0
    wrong: int = 0
    pending: int = 0

    @property
    def judged(self) -> int:
        return self.right + self.wrong

    @property
    def precision(self) -> float | None:
        return self.right / self.judged if self.judged else None


class ScopeCard(BaseModel):
    kind: ScopeKind
    name: str
    mode: Mode = Field(description="the mode it runs in now (configuration and mode changes)")
    tally: Tally
    drains: Precision
    restarts: Precision
    holds: Precision


class Suggestion(BaseModel):
    """A promotion or demotion the scorecard suggests; a person makes it (`relaunch rollout`)."""

    change: str = Field(description="promote or demote")
    scope: ScopeKind
    name: str
    to: Mode
    why: str
    incidents: list[str] = Field(default_factory=list)


class Scorecard(BaseModel):
    cluster: str
    since: datetime
    generated_at: datetime
    settings: RolloutSettings
    total: Tally
    drains: Precision
    restarts: Precision
    holds: Precision
    categories: list[ScopeCard] = Field(default_factory=list)
    partitions: list[ScopeCard] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)
    recommendations: list[Recommendation] = Field(
        default_factory=list, description="the newest 1,000 (the counts cover all)"
    )
    judged: list[Judged] = Field(
        default_factory=list, description="the newest 1,000 actions judged (the counts cover all)"
    )


class ModeChange(BaseModel):
    """An audited promotion or demotion: from now on, ``scope``/``name`` runs in ``mode``
    (``None``: back to what the configuration says)."""

    cluster: str
    scope: ScopeKind
    name: str
    mode: Mode | None
    by: str
    reason: str = ""
    at: datetime


def rollout_incident(cluster: str) -> str:
    """The audit record a cluster's mode changes belong to (every audit row names one)."""
    return f"rollout-{cluster}"
