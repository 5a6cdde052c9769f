"""Contracts of the node lifecycle: from drained to healthy (or to a repair ticket).

A node that Relaunch drains gets one durable ``NodeLifecycleWorkflow`` per fault,
``relaunch-<cluster>-lifecycle-<node>-<n>`` (one at a time per node): it fences the node off in
a maintenance reservation, runs the health-check catalogue on it through Slurm, climbs the
remediation ladder (GPU reset, reboot) while the checks fail, and either returns the node to
service on a passing validation or hands it to repair (a ticket). See docs/lifecycle.md.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, HttpUrl, field_validator

from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import STRICT, AutoAction, Category, Mode
from relaunch.models.scheduler import JobState

_LIFECYCLE = re.compile(r"relaunch-(?P<cluster>.+)-lifecycle-(?P<node>.+)-(?P<n>[0-9]+)")
# Check ids, rung names: what reaches a reservation name, a job name, a URL path.
CHECK_ID = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# At most this much of a check's output is kept (the head and the tail).
OUTPUT_MAX = 4000


class NoLifecycleError(RelaunchError):
    """No lifecycle of the node runs (a repair reported for a node nobody sent to repair)."""


class NotAwaitingRepairError(RelaunchError):
    """The node's lifecycle runs but does not wait for a repair (it checks the node, say)."""


def lifecycle_id(cluster: str, node: str, n: int) -> str:
    """The id of a node's ``n``-th lifecycle: ``relaunch-<cluster>-lifecycle-<node>-<n>``."""
    return f"relaunch-{cluster}-lifecycle-{node}-{n}"


def parse_lifecycle_id(workflow_id: str) -> tuple[str, str, int] | None:
    """(cluster, node, n) of a lifecycle's id; None when ``workflow_id`` is not one."""
    m = _LIFECYCLE.fullmatch(workflow_id)
    return (m["cluster"], m["node"], int(m["n"])) if m else None


def reservation_name(node: str) -> str:
    """The maintenance reservation the lifecycle holds on ``node`` while it checks it."""
    return f"relaunch-maint-{node}"


class NodeStage(StrEnum):
    """Where a node is in its lifecycle; the value of the RelaunchNodeStage search attribute."""

    SUSPECT = "suspect"  # a fault reported, the drain not yet confirmed by a fresh read
    DRAINED = "drained"  # out of service, waiting to be looked at
    DIAGNOSING = "diagnosing"  # in its maintenance reservation, the checks running
    REMEDIATING = "remediating"  # a rung (GPU reset, reboot) being applied
    VALIDATING = "validating"  # the checks again, after a rung or a repair
    RETURNED = "returned"  # back in service after a passing validation
    ESCALATED = "escalated"  # handed to repair: drained with the ticket as the reason
    CLOSED = "closed"  # someone else put the node back (or it left Slurm): nothing to do


LIFECYCLE_TERMINAL = frozenset({NodeStage.RETURNED, NodeStage.CLOSED})


class Rung(StrEnum):
    """One rung of the remediation ladder, cheapest first."""

    RESUME_AFTER_CHECKS = "resume_after_checks"  # nothing to do to the node: the checks decide
    GPU_RESET = "gpu_reset"  # `nvidia-smi -r` on the node, which has no jobs
    REBOOT = "reboot"  # `scontrol reboot` (or the site's reboot command), then validate
    ESCALATE = "escalate"  # a repair ticket; the node stays drained until repaired


# The rungs that change the node: monitor mode asks a person before each.
CHANGES_NODE = frozenset({Rung.GPU_RESET, Rung.REBOOT})


class CheckKind(StrEnum):
    COMMAND = "command"  # run on the node through srun, in the maintenance reservation
    TELEMETRY = "telemetry"  # the node agent's latest NVML counters, read by the worker


class HealthCheck(BaseModel):
    """One check of the catalogue (relaunch/detection/health_checks.json, or the site's own
    in ``LifecycleSettings.checks``)."""

    model_config = STRICT

    id: str = Field(description="short name: lowercase letters, digits, - and _")
    description: str = ""
    kind: CheckKind = CheckKind.COMMAND
    argv: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="the command run on the node (no shell unless argv names one); "
        "{node} is replaced with the node's name",
    )
    requires: list[str] = Field(
        default_factory=list,
        description="programs the check needs on the node: where one is missing the check is "
        "skipped, with the reason recorded (a GPU check on a node without a GPU driver)",
    )
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    pass_pattern: str | None = Field(
        default=None, description="the output must match this regular expression to pass"
    )
    fail_pattern: str | None = Field(
        default=None, description="the output must not match this regular expression"
    )
    counters: list[str] = Field(
        default_factory=list,
        description="telemetry checks: counters that must not have grown since the fault, "
        "e.g. ecc_dbe_volatile, row_remap_pending, row_remap_failure",
    )
    categories: list[Category] = Field(
        default_factory=list, description="run only for these fault categories (empty: all)"
    )

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not CHECK_ID.fullmatch(value):
            raise ValueError(f"check id {value!r}: lowercase letters, digits, - and _ only")
        return value

    @field_validator("pass_pattern", "fail_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class CheckResult(BaseModel):
    """What one check found on the node."""

    id: str
    passed: bool
    skipped: bool = False
    detail: str = Field(description="why it passed, failed or was skipped, in one line")
    exit_code: int | None = None
    output: str = Field(default="", description="the command's output, head and tail kept")
    seconds: float = 0.0
    users: list[int] = Field(
        default_factory=list,
        description="uids of users' processes (uid at least the settings' user_uid_min) on the "
        "node just before or after the check ran, from the step's own process census",
    )


class CheckRun(BaseModel):
    """One run of the catalogue on the node: diagnosis or a validation."""

    purpose: str = Field(description="diagnose, or validate after <rung>")
    results: list[CheckResult] = Field(default_factory=list)
    started_at: datetime
    finished_at: datetime
    inconclusive: str = Field(
        default="",
        description="why the run says nothing about the node (a user's job never left it, or a "
        "check failed while a user's process was there): never a reason for a rung",
    )

    @property
    def passed(self) -> bool:
        """Every check that ran passed, at least one ran, and the run is not inconclusive."""
        ran = [r for r in self.results if not r.skipped]
        return bool(ran) and all(r.passed for r in ran) and not self.inconclusive

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.skipped and not r.passed]

    def summary(self) -> str:
        ran = [r for r in self.results if not r.skipped]
        skipped = len(self.results) - len(ran)
        failed = self.failed
        head = "passed" if self.passed else "inconclusive" if self.inconclusive else "failed"
        text = f"{head}: {len(ran) - len(failed)} of {len(ran)} checks passed"
        if failed:
            text += " (" + "; ".join(f"{r.id}: {r.detail}" for r in failed)[:400] + ")"
        if skipped:
            text += f", {skipped} skipped"
        if self.inconclusive:
            text += f"; {self.inconclusive}"[:400]
        return text


class NodeJob(BaseModel):
    """A job on a node, in the fields Slurm writes (no name, comment or path a user chose)."""

    job_id: str
    uid: int | None = Field(description="the job's uid; None where Slurm's answer did not say")
    state: JobState
    reservation: str = ""


class LifecycleSettings(BaseModel):
    """How drained nodes are diagnosed, remediated and returned (``lifecycle`` in the cluster's
    configuration). See docs/lifecycle.md."""

    model_config = STRICT

    enabled: bool = Field(
        default=True, description="start a lifecycle for every node Relaunch drains"
    )
    mode: Mode | None = Field(
        default=None,
        description="monitor: a person approves each rung that changes the node and each return "
        "to service; unset: the policy's mode",
    )
    settle_s: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="wait this long after the drain before the first checks (the node's jobs "
        "end, the driver settles)",
    )
    checks: list[HealthCheck] = Field(
        default_factory=list, description="the site's own checks, run after the catalogue's"
    )
    skip_checks: list[str] = Field(
        default_factory=list, description="catalogue checks not to run, by id"
    )
    ladders: dict[str, list[Rung]] = Field(
        default_factory=lambda: {
            "gpu_reset": [Rung.GPU_RESET, Rung.REBOOT, Rung.ESCALATE],
            "reboot": [Rung.REBOOT, Rung.ESCALATE],
            "escalate": [Rung.ESCALATE],
            "default": [Rung.REBOOT, Rung.ESCALATE],
        },
        description="the rungs tried, in order, once the first checks fail: by the Xid "
        "catalogue's remedy (gpu_reset, reboot, escalate), else by fault category, else "
        "`default`; each rung at most once per fault",
    )
    escalate_after_return_hours: float = Field(
        default=168.0,
        gt=0,
        le=8760,
        description="a node whose lifecycle returned it this recently and that fails again "
        "goes straight to repair (the lemon rule); also the window of the same-fault rule",
    )
    same_fault_escalates: int = Field(
        default=2,
        ge=2,
        le=100,
        description="this many faults of one kind on the node in the window (e.g. Xid 79 "
        "twice in 7 days) go straight to repair",
    )
    reboot_command: list[str] = Field(
        default_factory=list,
        description="reboot with this command instead of `scontrol reboot` ({node} is the "
        "node); the dev stack's restarts the node's slurmd",
    )
    reboot_timeout_s: float = Field(default=900.0, gt=0, le=7200)
    repair_webhook: HttpUrl | None = Field(
        default=None, description="escalations POST a repair ticket (JSON) here"
    )
    repair_webhook_token_file: str | None = Field(
        default=None, description="a file whose content is sent as the webhook's bearer token"
    )
    check_workdir: str | None = Field(
        default=None,
        description="the job filesystem's folder under which the storage check makes its own "
        "private folder (unset: /tmp)",
    )
    drain_wait_s: float = Field(
        default=3600.0,
        ge=0,
        le=5400,
        description="how long the checks wait for the jobs still on a draining node to end; "
        "past it the run is inconclusive and the node goes to a person",
    )
    census: bool = Field(
        default=True,
        description="count the users' processes on the node around each check (a failure "
        "beside one is inconclusive); off only where nodes share one machine (the dev stack)",
    )
    user_uid_min: int = Field(
        default=1000,
        ge=1,
        le=2**31 - 1,
        description="processes of uids from this one up (nobody, 65534, aside) are a user's: "
        "a check that fails while one is on the node is inconclusive",
    )
    census_ignore_users: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="service accounts (not people) with uids in the users' range whose "
        "processes on a node are no user's, e.g. a database's; looked up by name",
    )


class LifecycleFault(BaseModel):
    """What a drain, or a suspicion, tells the node's lifecycle (signal ``fault``,
    signal-with-start)."""

    model_config = STRICT

    incident_id: str = Field(
        description="the recovery or node decision that drained the node (or suspects it)"
    )
    category: Category
    remedy: str | None = Field(default=None, description="the Xid catalogue's rung, if any")
    kind: str = Field(default="", description="the fault's signature, e.g. xid-79")
    summary: str = ""
    at: datetime
    suspect: bool = Field(
        default=False,
        description="job output alone named the node, in the jobs of several users: it is "
        "checked without a drain, and only its failing checks take it out of service",
    )


class LifecycleCarry(BaseModel):
    """What a lifecycle waiting for its node's repair carries into its next run (it continues
    as new where its history grows long)."""

    model_config = STRICT

    faults: list[LifecycleFault]
    ladder: list[Rung]
    tried: list[Rung]
    runs: list[CheckRun]
    ticket: str
    visits: int
    decisions: int
    why: str


class LifecycleInput(BaseModel):
    model_config = STRICT

    cluster: str
    node: str
    n: int
    mode: Mode
    approval_timeout_s: float = 1800.0
    settings: LifecycleSettings = Field(default_factory=LifecycleSettings)
    carry: LifecycleCarry | None = None
    # The policy's steps monitor mode takes without asking (checks, repair_ticket).
    auto_actions: list[AutoAction] = Field(default_factory=list)


class RepairReturn(BaseModel):
    """Signal ``returned``: a person (or the repair system's callback) says the node is
    repaired; the lifecycle validates it before it returns to service."""

    model_config = STRICT

    by: str
    ticket: str = ""
    note: str = ""


class Pending(BaseModel):
    """A step waiting for a person: a rung that changes the node, or the return to service."""

    request_id: str
    step: str = Field(description="a rung (gpu_reset, reboot) or `return`")
    summary: str
    deadline: datetime | None = None


class LifecycleStatus(BaseModel):
    """Answer of the lifecycle's ``status`` query."""

    lifecycle_id: str
    node: str
    stage: NodeStage
    mode: Mode
    faults: list[LifecycleFault] = Field(default_factory=list)
    ladder: list[Rung] = Field(default_factory=list)
    tried: list[Rung] = Field(default_factory=list)
    pending: Pending | None = None
    runs: list[CheckRun] = Field(default_factory=list)
    ticket: str = ""
    outcome: str = ""


# ---------------------------------------------------------------- activity inputs


class NodeStepInput(BaseModel):
    """Input of the lifecycle's node activities."""

    model_config = STRICT

    lifecycle_id: str
    cluster: str
    node: str
    settings: LifecycleSettings


class HoldInput(NodeStepInput):
    why: str = Field(
        default="checks failed", description="the drain reason's words (after `relaunch: `)"
    )


class StartInput(NodeStepInput):
    fault: LifecycleFault


class StartResult(BaseModel):
    """What the first look at the node found."""

    drained: bool = Field(description="a fresh read finds the node drained or down")
    state: str = ""
    reason: str = ""
    ladder: list[Rung]
    escalate: str = Field(
        default="", description="why the node goes straight to repair, if it does"
    )


class ChecksInput(NodeStepInput):
    purpose: str
    category: Category
    since: datetime = Field(description="telemetry checks: counters must not grow after this")


class RungInput(NodeStepInput):
    rung: Rung
    reason: str


class RungResult(BaseModel):
    rung: Rung
    done: bool = Field(description="applied (False: not available here, e.g. no nvidia-smi)")
    detail: str


class EscalateInput(NodeStepInput):
    faults: list[LifecycleFault]
    runs: list[CheckRun]
    tried: list[Rung]
    why: str


class EscalateResult(BaseModel):
    ticket: str
    posted: bool
    detail: str


class ReturnResult(BaseModel):
    returned: bool
    detail: str
