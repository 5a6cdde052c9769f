"""Contracts of the recovery loop: detections, verdicts, plans, approvals, workflow status.

Every workflow, activity, signal and query takes one of these in and gives one out, so that the
Temporal history (and the UI) shows named fields, and changes stay additive.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from relaunch.models.scheduler import spare_left
from relaunch.models.search_attributes import TERMINAL_STAGES as TERMINAL_STAGES
from relaunch.models.search_attributes import Stage as Stage

# The inputs of activities and of the `decide` update: a field the receiver does not know is an
# error (retried until a worker that knows it takes the task), never silently dropped.
STRICT = ConfigDict(extra="forbid")


class Category(StrEnum):
    GPU_HARDWARE = "gpu_hardware"
    NETWORK = "network"
    NODE_FAILURE = "node_failure"
    HANG = "hang"
    APPLICATION = "application"
    INFRASTRUCTURE = "infrastructure"
    PREEMPTION = "preemption"
    TIME_LIMIT = "time_limit"
    USER_CANCEL = "user_cancel"
    UNKNOWN = "unknown"


class Action(StrEnum):
    ISOLATE_AND_RESTART = "isolate_and_restart"
    # Restart without the suspect nodes (per-job exclusion); nothing is drained. The action where
    # only job-controlled evidence names a node (see Trust in docs/trust.md).
    EXCLUDE_AND_RESTART = "exclude_and_restart"
    RESTART = "restart"
    HOLD = "hold"
    NONE = "none"


class Mode(StrEnum):
    MONITOR = "monitor"
    AUTONOMOUS = "autonomous"


class AutoAction(StrEnum):
    """A step that changes the cluster which monitor mode may take without asking, when the
    policy's ``auto_actions`` names it (by default monitor mode asks first for every one)."""

    HOLD = "hold"  # hold a job's pending restart for a person (a recovery's `hold` plan)
    CHECKS = "checks"  # a lifecycle's reservation and health checks on a drained node
    REPAIR_TICKET = "repair_ticket"  # a lifecycle's repair ticket (the node stays drained)


class RestartMethod(StrEnum):
    REQUEUE = "requeue"
    RESUBMIT = "resubmit"
    # The job trains again on a spare node of its own allocation: the culprit leaves the
    # running job and the job's steps start again on the rest (docs/spares.md). Chosen per job
    # by its plan (`train_nodes=N` in its comment), never a policy's restart_method.
    SPARE = "spare"


class DetectionSource(StrEnum):
    SCHEDULER = "scheduler"
    JOB_LOG = "job_log"
    NODE_LOG = "node_log"
    PROGRESS = "progress"
    TELEMETRY = "telemetry"
    PROBE = "probe"  # the watcher's liveness probe of a node's slurmd (trusted: outside the job)
    # A node-health event pushed in (POST /intake/health) by a sender whose console token is
    # trusted with them; the same from any other intake sender points, never convicts.
    HEALTH_EVENT = "health_event"
    UNTRUSTED_HEALTH_EVENT = "health_event_untrusted"
    # An Alertmanager alert (POST /intake/alertmanager): its labels are whatever fed the alert
    # rule, so it points at a node, never names it as trusted evidence.
    ALERT = "alert"


class Detection(BaseModel):
    """One observation that a job attempt is interrupted or stalled."""

    cluster: str
    job_id: str
    attempt: int = Field(description="the job's restart count when the observation was made")
    source: DetectionSource
    kind: str = Field(description="e.g. job_state:NODE_FAIL, node_state:DOWN, signature:xid_79")
    signature: str | None = None
    text: str = ""
    nodes: list[str] = Field(default_factory=list)
    fault_time: datetime | None = None
    detected_at: datetime
    submitted_at: datetime | None = Field(
        default=None,
        description="the job's submit time: tells apart two jobs Slurm gave the same id",
    )

    @property
    def workflow_id(self) -> str:
        """The documented id of this job attempt's recovery (the one to join first; see
        ``recovery_client.start_or_join`` for the suffixed id of a reused job id)."""
        return recovery_workflow_id(self.cluster, self.job_id, self.attempt)


# The suffix of a recovery whose job id Slurm had given an earlier job: the job's submit time in
# UTC, to the second (`relaunch-dev-26-0-20261203T051200Z`). Letters in it keep it from ever
# reading as a job id or an attempt.
_SUBMIT_SUFFIX = "%Y%m%dT%H%M%SZ"
_SUFFIX = re.compile(r"-\d{8}T\d{6}Z")
_DOCUMENTED = re.compile(
    r"relaunch-(?P<cluster>.+)-(?P<job>[0-9]+(?:_[0-9]+)?)-(?P<attempt>[0-9]+)"
)


def recovery_workflow_id(
    cluster: str, job_id: str, attempt: int, submitted_at: datetime | None = None
) -> str:
    """The design's contract: one workflow per job attempt, ``relaunch-<cluster>-<job>-<attempt>``.
    With ``submitted_at``: the id of a later job that Slurm gave the same job id, which carries
    that job's submit time as a suffix."""
    base = f"relaunch-{cluster}-{job_id}-{attempt}"
    if submitted_at is None:
        return base
    return f"{base}-{submitted_at.astimezone(UTC).strftime(_SUBMIT_SUFFIX)}"


def same_attempt_ids(typed: str, candidates: list[str]) -> list[str]:
    """The ids among ``candidates`` that a person means by ``typed``: ``typed`` itself and the
    suffixed ids of later jobs with the same job id and attempt, in the order given."""
    return [
        c
        for c in candidates
        if c == typed or (c.startswith(typed) and _SUFFIX.fullmatch(c[len(typed) :]))
    ]


def parse_recovery_id(incident: str) -> tuple[str, str, int] | None:
    """(cluster, job id, attempt) of a documented recovery id without its suffix; None when
    ``incident`` is not one."""
    m = _DOCUMENTED.fullmatch(incident)
    return (m["cluster"], m["job"], int(m["attempt"])) if m else None


# The reason Relaunch writes on a node it drains: how Slurm itself says which drains are ours.
DRAIN_REASON_PREFIX = "relaunch incident "
# A node's lifecycle writes its own reasons ("relaunch: repair <ticket>", "relaunch: checks
# failed (...)"): what Relaunch drained starts with one of these.
LIFECYCLE_REASON_PREFIX = "relaunch: "
RELAUNCH_REASONS = (DRAIN_REASON_PREFIX, LIFECYCLE_REASON_PREFIX)


def drain_reason(incident_id: str) -> str:
    return f"{DRAIN_REASON_PREFIX}{incident_id}"


def drained_by(reason: str, incident_id: str) -> bool:
    """Whether a node's Slurm reason is this incident's own drain or fence (an earlier attempt
    of a step that died before it recorded what it did)."""
    own = drain_reason(incident_id)
    return reason == own or reason.startswith(own + " ")


def task_queue(cluster: str) -> str:
    return f"relaunch-{cluster}"


class XidEvidence(BaseModel):
    """What NVIDIA's Xid catalogue makes of an Xid line (docs/xid-catalogue.md)."""

    code: int
    words: str = Field(description="the catalogue's short description of the code")
    action: str = Field(description="the catalogue bucket followed, after decoding the line")
    outcome: str = Field(description="drain, restart, follow_154, context or teardown")
    remedy: str | None = Field(
        default=None, description="for a drain: gpu_reset, reboot or escalate (the ladder's rung)"
    )
    detail: str = Field(default="", description="how the action was reached")
    implicates: str = Field(default="gpu", description="gpu, node, application or none")


class EvidenceLine(BaseModel):
    """A line that contributed to a verdict (the `relaunch classify` evidence shape)."""

    source: str
    line_no: int
    text: str
    signature: str
    role: str = "root"
    node: str | None = Field(default=None, description="the node the line points at, if any")
    count: int = Field(default=1, description="copies of this line (same signature and node)")
    trusted: bool = Field(
        default=False,
        description="from a source the job cannot write (kernel log, telemetry, Slurm, probes)",
    )
    xid: XidEvidence | None = Field(
        default=None, description="for an Xid line: what the Xid catalogue says of it"
    )


class Verdict(BaseModel):
    category: Category
    culprit_nodes: list[str] = Field(default_factory=list)
    confidence: float = 0.0
    action: Action
    evidence: list[EvidenceLine] = Field(default_factory=list)
    summary: str = ""
    folded: dict[str, int] = Field(
        default_factory=dict, description="cascade and teardown lines by signature: not decisive"
    )
    repeat_offenders: list[str] = Field(
        default_factory=list, description="culprits named by their incident history, not this log"
    )
    corroboration: dict[str, list[str]] = Field(
        default_factory=dict,
        description="culprit → the trusted sources that confirm it; [] = job-controlled only",
    )
    remedies: dict[str, str] = Field(
        default_factory=dict,
        description="culprit → the remediation rung its Xids call for: gpu_reset, reboot, escalate",
    )
    still_running: bool = Field(
        default=False,
        description="the job still ran and its ranks advanced, and no trusted source named a "
        "fault: recorded, not acted on (docs/trust.md)",
    )


class Policy(BaseModel):
    """How a cluster is allowed to act. Overrides apply per partition, then per category.
    Every number has its bounds; unknown keys are ignored here, because a policy travels in
    workflow inputs and a history recorded before a field was dropped must still decode (a
    configuration file's ``policy`` section refuses them: ConfigPolicy)."""

    mode: Mode = Mode.MONITOR
    partition_modes: dict[str, Mode] = Field(default_factory=dict)
    category_modes: dict[Category, Mode] = Field(default_factory=dict)
    restart_method: RestartMethod = RestartMethod.REQUEUE
    restart_budget: int = Field(
        default=3, ge=0, le=1000, description="restarts of one job per budget window; 0: none"
    )
    budget_window_hours: float = Field(default=24.0, gt=0, le=8760)
    drain_share: float = Field(
        default=0.10, gt=0, le=1, description="the share of a partition drained per window"
    )
    drain_cap: int = Field(
        default=4, ge=0, le=100_000, description="nodes drained per window at most; 0: none"
    )
    drain_window_hours: float = Field(default=24.0, gt=0, le=8760)
    approval_timeout_s: float = Field(default=1800.0, gt=0, le=30 * 86400)
    repeat_offender_incidents: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="incidents implicating a node that make it a repeat offender",
    )
    repeat_offender_window_hours: float = Field(default=168.0, gt=0, le=8760)
    verify_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    launcher_grace_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="how long a running job whose own launcher (torchrun, ft_launcher) restarts "
        "it in the job is given to train again before the recovery acts (docs/spares.md); "
        "0: never waited for",
    )
    node_decisions: bool = Field(
        default=True,
        description="one decision per failed node: recoveries that convict a node on trusted "
        "evidence join its decision (one drain, one approval, restarts in batches) instead of "
        "each planning its own drain (relaunch/workflows/node_decision.py)",
    )
    suspect_users: int = Field(
        default=2,
        ge=2,
        le=1000,
        description="distinct users whose jobs must name a node (job output alone) in the "
        "suspicion window before it is sent to its lifecycle's checks (never drained on that)",
    )
    suspect_window_hours: float = Field(default=24.0, gt=0, le=8760)
    auto_actions: list[AutoAction] = Field(
        default_factory=list,
        max_length=len(AutoAction),
        description="steps monitor mode takes without asking (hold, checks, repair_ticket); "
        "empty (the default): monitor mode asks first for everything that changes the cluster",
    )
    canary_partition: str | None = Field(
        default=None,
        description="the default mode applies on this partition only; every other partition "
        "runs in monitor mode unless its own mode or its category's says otherwise (a staged "
        "rollout: `mode: autonomous` with a canary acts alone there while the rest ask)",
    )

    def mode_for(self, partition: str, category: Category) -> Mode:
        if category in self.category_modes:
            return self.category_modes[category]
        if partition in self.partition_modes:
            return self.partition_modes[partition]
        return self.default_mode_on(partition)

    def default_mode_on(self, partition: str) -> Mode:
        """The default mode where nothing more specific is set: the canary narrows it."""
        if self.canary_partition is not None and partition != self.canary_partition:
            return Mode.MONITOR
        return self.mode

    def acts_alone(self, partitions: list[str], category: Category) -> bool:
        """Whether a node decision over jobs of ``partitions`` acts without a person: only
        where every one of them is autonomous for ``category`` (none listed: the default)."""
        return all(self.mode_for(p, category) is Mode.AUTONOMOUS for p in partitions or [""])


class JobSnapshot(BaseModel):
    """What the workflow needs to know about the job (small; the full record is in evidence)."""

    job_id: str
    name: str = ""
    state: str = ""
    partition: str = ""
    nodes: list[str] = Field(default_factory=list)
    restart_count: int = 0
    stdout_path: str = ""
    last_checkpoint_step: int | None = None
    max_restarts: int | None = Field(
        default=None,
        description="the job's own budget, from `--comment relaunch=on,max_restarts=N`",
    )
    user: str = Field(
        default="",
        description="the job's user, as Slurm lists it: whose voice the plan counts among the "
        "users that named a suspect (carried here, so no step reads it back from the bundle)",
    )
    launcher: str = Field(
        default="",
        description="the in-job launcher the job's output shows (torchrun, ft_launcher), if any",
    )
    log_size: int = Field(
        default=0, description="the size of the job's output when the evidence read it"
    )
    train_nodes: int | None = Field(
        default=None,
        description="how many of its nodes the job trains on (`--comment "
        "relaunch=on,train_nodes=N`); the rest of its allocation are spares",
    )

    def spare_left(self, without: Collection[str]) -> bool:
        """Whether the job, running, still has enough nodes to train on once ``without``
        (nodes of its allocation) leave it: the spare-node restart instead of a requeue."""
        running = self.state.upper().startswith("RUNNING")
        return running and spare_left(self.nodes, self.train_nodes, without)


class GatherInput(BaseModel):
    model_config = STRICT

    incident_id: str
    cluster: str
    job_id: str
    attempt: int
    policy: Policy | None = Field(
        default=None, description="the recovery's policy (`investigate` joins node decisions by it)"
    )
    named_nodes: list[str] = Field(
        default_factory=list,
        description="the nodes that the recovery's detections by what the job's user cannot "
        "write (a node's kernel log, telemetry, the probes, Slurm) named: the attempt's even "
        "where Slurm has dropped them from the job's record (a node set DOWN as it ends the job)",
    )


# The sources of detections that name a job's nodes by what its user cannot write.
TRUSTED_DETECTION_SOURCES = frozenset(
    {
        DetectionSource.NODE_LOG,
        DetectionSource.PROBE,
        DetectionSource.TELEMETRY,
        DetectionSource.SCHEDULER,
        DetectionSource.HEALTH_EVENT,
    }
)


class EvidenceSummary(BaseModel):
    incident_id: str
    bundle_path: str
    job: JobSnapshot
    node_states: dict[str, str] = Field(default_factory=dict)
    unreachable_nodes: list[str] = Field(default_factory=list)


class AttributeInput(BaseModel):
    model_config = STRICT

    incident_id: str
    bundle_path: str


class GuardDecision(BaseModel):
    guard: str
    allowed: bool
    detail: str


class PlanInput(BaseModel):
    model_config = STRICT

    incident_id: str
    cluster: str
    verdict: Verdict
    evidence: EvidenceSummary
    policy: Policy


class ActionPlan(BaseModel):
    """What the recovery will do once allowed. Approval executes exactly this."""

    request_id: str
    action: Action
    mode: Mode
    drain_nodes: list[str] = Field(default_factory=list)
    fence_nodes: list[str] = Field(default_factory=list)
    exclude_nodes: list[str] = Field(default_factory=list)
    restart_method: RestartMethod = RestartMethod.REQUEUE
    job_id: str
    expected_restart_count: int
    guards: list[GuardDecision] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    suspect_nodes: list[str] = Field(
        default_factory=list,
        description="nodes named by job-controlled evidence only: excluded, marked, not drained",
    )
    check_nodes: list[str] = Field(
        default_factory=list,
        description="suspects the jobs of policy.suspect_users different users named in the "
        "suspicion window: sent to their lifecycle's checks, never drained on that alone",
    )
    needs_override: bool = Field(
        default=False,
        description="a guard refused this plan: only an operator's approval (audited as an "
        "override) lets it run; autonomous mode holds instead",
    )
    remedies: dict[str, str] = Field(
        default_factory=dict,
        description="drained node → the remediation rung its Xids call for (gpu_reset, reboot, "
        "escalate): where the node's repair starts",
    )
    guard_partition: str | None = Field(
        default=None,
        description="the partition the blast-radius guard counts at drain time; None: the "
        "job's (a node decision the watcher's report started has no job)",
    )
    category: Category | None = Field(
        default=None, description="the fault's category: what the drained nodes' lifecycles check"
    )
    job_cancelled: bool = Field(
        default=False,
        description="Slurm lists the job CANCELLED (its user's or an admin's scancel): the "
        "convicted nodes are drained, the job is not restarted",
    )

    @property
    def restarts(self) -> bool:
        return self.action in RESTARTING


RESTARTING = frozenset({Action.ISOLATE_AND_RESTART, Action.EXCLUDE_AND_RESTART, Action.RESTART})


class Approval(BaseModel):
    """Input of the `approve` and `reject` signals: ``{"by": "ana", "reason": "..."}``."""

    by: str
    reason: str = ""


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


class DecisionInput(BaseModel):
    """Input of the `decide` update: a person's decision on the plan awaiting approval."""

    model_config = STRICT

    decision: Decision
    approval: Approval


class RecordDetectionInput(BaseModel):
    """Input of the `record_detection` activity: one detection of this incident."""

    model_config = STRICT

    incident_id: str
    detection: Detection


class RecordEventInput(BaseModel):
    """Input of the `record_event` activity: one audit row of this incident."""

    model_config = STRICT

    incident_id: str
    cluster: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    kind: str
    summary: str
    stage: str | None = None
    actor: str = "relaunch"
    nodes: list[str] = Field(default_factory=list)
    data: dict[str, object] = Field(default_factory=dict)
    dedupe: str | None = None


class ActInput(BaseModel):
    model_config = STRICT

    incident_id: str
    cluster: str
    plan: ActionPlan


class StepOutcome(BaseModel):
    """What an isolate/act/verify step did; `changed` false means it found the work done."""

    ok: bool
    changed: bool = False
    detail: str = ""
    new_job_id: str | None = None


class VerifyInput(BaseModel):
    model_config = STRICT

    incident_id: str
    cluster: str
    job_id: str
    avoid_nodes: list[str]
    checkpoint_step: int | None = None
    timeout_s: float = 300.0


class LauncherLookInput(BaseModel):
    """A look at a running job for its launcher's own restart (`launcher_look`)."""

    model_config = STRICT

    incident_id: str
    cluster: str
    job_id: str
    restart_count: int = Field(description="the attempt the recovery is about")
    since_offset: int = Field(description="where the job's output stood at the evidence")
    launcher: str


class LauncherLook(BaseModel):
    """What one look found: the job trains again in the same attempt, or it ended (or was
    requeued), or neither yet."""

    trained_again: bool = False
    ended: bool = False
    launcher: str = Field(default="", description="the launcher its output shows, if any")
    detail: str = ""
    resumed_step: int | None = None
    latest_step: int | None = None


class VerifyCheck(BaseModel):
    """One look at a restarted job (`verify_check`): done, failed, or not yet."""

    done: bool = False
    failed: bool = False
    detail: str = ""


class RecoveryInput(BaseModel):
    cluster: str
    job_id: str
    attempt: int
    policy: Policy = Field(default_factory=Policy)
    incident_id: str | None = Field(
        default=None,
        description="the recovery's id when it is not relaunch-<cluster>-<job>-<attempt> "
        "(a job id Slurm reused: the id carries the job's submit time)",
    )


class RecoveryStatus(BaseModel):
    """Answer of the `status` query."""

    incident_id: str
    stage: Stage
    mode: Mode | None = None
    verdict: Verdict | None = None
    plan: ActionPlan | None = None
    awaiting_approval: bool = False
    approval_deadline: datetime | None = None
    decided_by: str | None = None
    detections: int = 0
    outcome: str = ""
    node_decisions: dict[str, str] = Field(
        default_factory=dict, description="the node decisions joined (node → decision id)"
    )
    node_decision: str | None = Field(
        default=None, description="the node decision that decides this job's restart"
    )
    covers: int | None = Field(
        default=None,
        description="while that decision awaits approval: how many jobs one approval covers",
    )


class AuditRecord(BaseModel):
    """One append-only audit row."""

    incident_id: str
    kind: str
    at: datetime
    actor: str = "relaunch"
    stage: str | None = None
    nodes: list[str] = Field(default_factory=list)
    summary: str = ""
    data: dict[str, object] = Field(default_factory=dict)
