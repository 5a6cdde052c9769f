"""RecoveryWorkflow: one durable workflow per interrupted job attempt.

gather evidence → attribute → plan → (monitor mode: wait for approve / reject / expiry) →
isolate → restart → verify. A plan a guard refused runs only on an operator's approval (an
override); autonomous mode holds it, and a drain that `isolate` refuses holds the job too.
Orchestration only: every decision and side effect is an activity, so its result is in the
history and the audit trail.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.models.recovery import (
        ActInput,
        Action,
        ActionPlan,
        Approval,
        AttributeInput,
        Detection,
        EvidenceSummary,
        GatherInput,
        Mode,
        PlanInput,
        RecoveryInput,
        RecoveryStatus,
        Stage,
        StepOutcome,
        Verdict,
        VerifyInput,
        recovery_workflow_id,
    )

SA_CLUSTER = SearchAttributeKey.for_keyword("RelaunchCluster")
SA_JOB = SearchAttributeKey.for_keyword("RelaunchJobId")
SA_CATEGORY = SearchAttributeKey.for_keyword("RelaunchCategory")
SA_STAGE = SearchAttributeKey.for_keyword("RelaunchStage")
SA_MODE = SearchAttributeKey.for_keyword("RelaunchMode")
SA_NODES = SearchAttributeKey.for_keyword_list("RelaunchNodes")
SA_AWAITING = SearchAttributeKey.for_bool("RelaunchAwaitingApproval")

T = TypeVar("T")


@dataclass(frozen=True)
class CallPolicy:
    """A named timeout and retry policy for a family of activities."""

    timeout: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None
    # Retries stop when this much time has passed since the first attempt (None: only the
    # retry policy's attempts limit them).
    give_up_after: timedelta | None = None
    # Run locally: backoffs longer than this wait on a workflow timer, not in the worker.
    local_retry_threshold: timedelta | None = None


# How long the steps that write or read the audit trail (and read Slurm) keep retrying through
# an outage of PostgreSQL or the Slurm controller: a recovery waits out a failover or a
# maintenance window, and goes on where it stopped, instead of failing for good. Each attempt's
# error is in the worker's log; only errors typed non-retryable end the step at once.
OUTAGE_TOLERANCE = timedelta(hours=24)
# Capped backoff: 1 s doubling to once every 30 s, so a recovery resumes within half a minute
# of the database's return, and hundreds of waiting recoveries cost the database little.
OUTAGE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # unlimited: OUTAGE_TOLERANCE bounds them
)
# These steps run as local activities (LOCAL_QUICK_STEPS). A local activity retries inside its
# workflow task, which the worker keeps alive with a workflow-task heartbeat every few seconds;
# from a backoff of 16 s on, each retry waits on a workflow timer instead: a 30-minute outage
# adds about 60 timers to the history rather than hundreds of heartbeat tasks.
LOCAL_RETRY_THRESHOLD = timedelta(seconds=10)

RECORD = CallPolicy(
    timedelta(seconds=15),
    OUTAGE_RETRY,
    give_up_after=OUTAGE_TOLERANCE,
    local_retry_threshold=LOCAL_RETRY_THRESHOLD,
)
OBSERVE = CallPolicy(
    timedelta(seconds=90),
    OUTAGE_RETRY,
    give_up_after=OUTAGE_TOLERANCE,
    local_retry_threshold=LOCAL_RETRY_THRESHOLD,
)
ACT = CallPolicy(
    timedelta(seconds=120),
    RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_interval=timedelta(seconds=20),
        maximum_attempts=5,
        non_retryable_error_types=["InvalidNameError", "InvalidStateError", "JobNotFoundError"],
    ),
    # A worker that dies mid-action is noticed in seconds, and the action retried elsewhere.
    heartbeat=timedelta(seconds=15),
)


# Recoveries started after this patch run their quick steps (audit records, evidence,
# attribution, planning) as local activities: in the worker, inside the workflow task, without a
# round trip through the server's task queues for each. When a switch takes out a rack, hundreds
# of recoveries start at once and the server's queue dispatch is what paces them. Actions stay
# ordinary activities (heartbeats, retries on another worker). Older histories replay unpatched.
LOCAL_QUICK_STEPS = "local-quick-steps"

# Recoveries started after this patch act on a guard's refusal: a plan a guard refused
# (needs_override) is put to a human as an override in monitor mode and held in autonomous mode;
# a drain that `isolate` refuses on fresh state (recoveries racing for the blast radius) holds
# the job instead of restarting it; the suspects of an exclude_and_restart are recorded. Older
# histories, whose plans never carry these, replay unpatched.
GUARD_REFUSALS = "guard-refusals"

# Recoveries started after this patch end with a recorded no_action stage when the job has
# left Slurm before its evidence is gathered (cancelled and aged out, a cluster reset), instead
# of failing the workflow. Older histories that failed there replay unpatched.
JOB_LEFT_SLURM = "job-left-slurm"


async def call(
    name: str,
    arg: object,
    result_type: type[T],
    policy: CallPolicy,
    summary: str,
    *,
    local: bool = False,
) -> T:
    """Run an activity by name with its policy; its result typed by ``result_type``."""
    if local:
        result = await workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=policy.timeout,
            schedule_to_close_timeout=policy.give_up_after,
            retry_policy=policy.retry,
            local_retry_threshold=policy.local_retry_threshold,
            summary=summary,
        )
    else:
        result = await workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=policy.timeout,
            schedule_to_close_timeout=policy.give_up_after,
            heartbeat_timeout=policy.heartbeat,
            retry_policy=policy.retry,
            summary=summary,
        )
    return cast(T, result)


def _job_not_found(err: ActivityError | ApplicationError) -> bool:
    """Whether the step failed because the scheduler no longer knows the job (an activity's
    error comes wrapped in an ActivityError; a local activity's, as it was raised)."""
    cause = err.cause if isinstance(err, ActivityError) else err
    return isinstance(cause, ApplicationError) and cause.type == "JobNotFoundError"


@workflow.defn
class RecoveryWorkflow:
    def __init__(self) -> None:
        self._incident = ""
        self._input: RecoveryInput | None = None
        self._stage = Stage.GATHERING
        self._mode: Mode | None = None
        self._verdict: Verdict | None = None
        self._plan: ActionPlan | None = None
        self._decision: tuple[str, Approval] | None = None
        self._deadline_s: float | None = None
        self._detections = 0
        self._outcome = ""
        self._local: bool | None = None
        self._guards_patched: bool | None = None

    @property
    def _quick_local(self) -> bool:
        """Whether this recovery runs its quick steps locally (see LOCAL_QUICK_STEPS)."""
        if self._local is None:
            self._local = workflow.patched(LOCAL_QUICK_STEPS)
        return self._local

    @property
    def _acts_on_refusals(self) -> bool:
        """Whether this recovery acts on guard refusals (see GUARD_REFUSALS)."""
        if self._guards_patched is None:
            self._guards_patched = workflow.patched(GUARD_REFUSALS)
        return self._guards_patched

    # ------------------------------------------------------------------ messages

    @workflow.signal
    async def detection(self, det: Detection) -> None:
        """Another observation of this interruption (the watcher's start-or-join)."""
        self._detections += 1
        incident = self._incident or det.workflow_id
        await call(
            "record_detection",
            {"incident_id": incident, "detection": det},
            bool,
            RECORD,
            f"detection: {det.kind}",
            local=self._quick_local,
        )

    @workflow.signal
    def approve(self, approval: Approval) -> None:
        self._decide("approve", approval)

    @workflow.signal
    def reject(self, approval: Approval) -> None:
        self._decide("reject", approval)

    def _decide(self, decision: str, approval: Approval) -> None:
        if self._stage is not Stage.AWAITING_APPROVAL or self._decision is not None:
            workflow.logger.warning(
                "ignored %s by %s in stage %s", decision, approval.by, self._stage.value
            )
            return
        self._decision = (decision, approval)

    @workflow.query
    def status(self) -> RecoveryStatus:
        return RecoveryStatus(
            incident_id=self._incident,
            stage=self._stage,
            mode=self._mode,
            verdict=self._verdict,
            plan=self._plan,
            awaiting_approval=self._stage is Stage.AWAITING_APPROVAL,
            approval_deadline=(
                workflow.now() + timedelta(seconds=self._deadline_s)
                if self._deadline_s is not None and self._stage is Stage.AWAITING_APPROVAL
                else None
            ),
            decided_by=self._decision[1].by if self._decision else None,
            detections=self._detections,
            outcome=self._outcome,
        )

    # ------------------------------------------------------------------ helpers

    async def _stage_to(self, stage: Stage, summary: str, **data: object) -> None:
        self._stage = stage
        workflow.upsert_search_attributes(
            [
                SA_STAGE.value_set(stage.value),
                SA_AWAITING.value_set(stage is Stage.AWAITING_APPROVAL),
            ]
        )
        await self._record(
            "stage", summary, stage=stage.value, dedupe=f"stage:{stage.value}", data=data
        )

    async def _record(
        self,
        kind: str,
        summary: str,
        *,
        stage: str | None = None,
        actor: str = "relaunch",
        nodes: list[str] | None = None,
        dedupe: str | None = None,
        data: dict[str, object] | None = None,
    ) -> None:
        await call(
            "record_event",
            {
                "incident_id": self._incident,
                "cluster": self._input.cluster if self._input else None,
                "job_id": self._input.job_id if self._input else None,
                "attempt": self._input.attempt if self._input else None,
                "kind": kind,
                "summary": summary,
                "stage": stage,
                "actor": actor,
                "nodes": nodes or [],
                "data": data or {},
                "dedupe": dedupe,
            },
            bool,
            RECORD,
            f"audit: {kind}",
            local=self._quick_local,
        )

    async def _finish(self, stage: Stage, outcome: str) -> RecoveryStatus:
        self._outcome = outcome
        await self._stage_to(stage, outcome)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    # ------------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: RecoveryInput) -> RecoveryStatus:
        self._incident = inp.incident_id or recovery_workflow_id(
            inp.cluster, inp.job_id, inp.attempt
        )
        self._input = inp
        policy = inp.policy
        workflow.upsert_search_attributes(
            [SA_CLUSTER.value_set(inp.cluster), SA_JOB.value_set(inp.job_id)]
        )
        await self._stage_to(Stage.GATHERING, "gathering evidence")
        try:
            evidence = await call(
                "gather_evidence",
                GatherInput(
                    incident_id=self._incident,
                    cluster=inp.cluster,
                    job_id=inp.job_id,
                    attempt=inp.attempt,
                ),
                EvidenceSummary,
                OBSERVE,
                f"gather evidence for job {inp.job_id}",
                local=self._quick_local,
            )
        except (ActivityError, ApplicationError) as err:
            # Nothing is left to recover: say so in the trail rather than fail the workflow.
            if not (_job_not_found(err) and workflow.patched(JOB_LEFT_SLURM)):
                raise
            return await self._finish(
                Stage.NO_ACTION, f"job {inp.job_id} no longer known to Slurm: no action"
            )
        self._stage = Stage.ATTRIBUTING
        verdict = await call(
            "attribute",
            AttributeInput(incident_id=self._incident, bundle_path=evidence.bundle_path),
            Verdict,
            OBSERVE,
            "attribute",
            local=self._quick_local,
        )
        self._verdict = verdict
        workflow.upsert_search_attributes(
            [
                SA_CATEGORY.value_set(verdict.category.value),
                SA_NODES.value_set(verdict.culprit_nodes),
            ]
        )
        self._stage = Stage.PLANNING
        plan = await call(
            "plan",
            PlanInput(
                incident_id=self._incident,
                cluster=inp.cluster,
                verdict=verdict,
                evidence=evidence,
                policy=policy,
            ),
            ActionPlan,
            OBSERVE,
            "plan",
            local=self._quick_local,
        )
        self._plan, self._mode = plan, plan.mode
        workflow.upsert_search_attributes([SA_MODE.value_set(plan.mode.value)])

        if plan.action is Action.NONE:
            return await self._finish(Stage.NO_ACTION, f"no action for {verdict.category.value}")

        act = ActInput(incident_id=self._incident, cluster=inp.cluster, plan=plan)
        override = plan.needs_override and plan.action is not Action.HOLD
        override = override and self._acts_on_refusals
        refused = "; ".join(f"{g.guard}: {g.detail}" for g in plan.guards if not g.allowed)
        if override and plan.mode is Mode.AUTONOMOUS:
            # Only a person may override a guard; the held stage notifies the operators.
            try:
                held = await self._act("hold", act)
            except ActivityError as err:
                return await self._failed(err)
            return await self._finish(
                Stage.HELD, f"guard refused ({refused}): held for a human: {held.detail}"
            )

        # Holding does nothing irreversible (the job is left for a human), so it needs no approval.
        if plan.mode is Mode.MONITOR and plan.action is not Action.HOLD:
            self._deadline_s = policy.approval_timeout_s
            recommend = f"recommend {plan.action.value}: " + "; ".join(plan.reasons)
            if override:
                recommend = f"guard refused ({refused}), approving overrides it: {recommend}"
            await self._stage_to(
                Stage.AWAITING_APPROVAL,
                recommend,
                request_id=plan.request_id,
                **({"override": True} if override else {}),
            )
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None,
                    timeout=timedelta(seconds=policy.approval_timeout_s),
                    timeout_summary="approval expiry",
                )
            except TimeoutError:
                return await self._finish(
                    Stage.EXPIRED, f"no decision within {policy.approval_timeout_s:g}s: no action"
                )
            assert self._decision is not None
            decision, by = self._decision
            overrides = override and decision == "approve"
            verb = {"approve": "approved", "reject": "rejected"}[decision]
            await self._record(
                "approval" if decision == "approve" else "rejection",
                ("override approved" if overrides else verb)
                + f" by {by.by}"
                + (f": {by.reason}" if by.reason else "")
                + (f" (overrides {refused})" if overrides else ""),
                actor=by.by,
                dedupe="decision",
                data={
                    "decision": decision,
                    "by": by.by,
                    "reason": by.reason,
                    "request_id": plan.request_id,
                    **(
                        {
                            "override": True,
                            "guards": [g.guard for g in plan.guards if not g.allowed],
                        }
                        if overrides
                        else {}
                    ),
                },
            )
            if decision == "reject":
                return await self._finish(Stage.REJECTED, f"rejected by {by.by}: no action")

        try:
            if plan.action is Action.HOLD:
                held = await self._act("hold", act)
                return await self._finish(Stage.HELD, f"held for a human: {held.detail}")
            if plan.drain_nodes or plan.fence_nodes:
                await self._stage_to(Stage.ISOLATING, f"isolating {','.join(plan.drain_nodes)}")
                isolated = await self._act("isolate", act)
                if not isolated.ok and self._acts_on_refusals:
                    # Another recovery drained first and the cap is reached: restarting would
                    # leave the job to the scheduler with its culprit in service.
                    held = await self._act("hold", act)
                    return await self._finish(
                        Stage.HELD, f"{isolated.detail}: held for a human: {held.detail}"
                    )
            if plan.suspect_nodes and self._acts_on_refusals:
                await self._record(
                    "suspect",
                    f"suspect {','.join(plan.suspect_nodes)}: named by job-controlled evidence "
                    f"only; excluded from job {plan.job_id}, not drained",
                    nodes=plan.suspect_nodes,
                    dedupe="suspect",
                    data={"job_id": plan.job_id, "suspect_nodes": plan.suspect_nodes},
                )
            await self._stage_to(Stage.ACTING, f"restarting by {plan.restart_method.value}")
            restarted = await self._act("restart", act)
            await self._stage_to(Stage.VERIFYING, restarted.detail)
            verified = await call(
                "verify",
                VerifyInput(
                    incident_id=self._incident,
                    cluster=inp.cluster,
                    job_id=restarted.new_job_id or plan.job_id,
                    avoid_nodes=plan.exclude_nodes,
                    checkpoint_step=evidence.job.last_checkpoint_step,
                    timeout_s=policy.verify_timeout_s,
                ),
                StepOutcome,
                CallPolicy(
                    timedelta(seconds=policy.verify_timeout_s + 30),
                    RetryPolicy(maximum_attempts=3),
                    heartbeat=timedelta(seconds=10),
                ),
                "verify the job runs on healthy nodes",
            )
        except ActivityError as err:
            return await self._failed(err)
        return await self._finish(Stage.DONE, verified.detail)

    async def _failed(self, err: ActivityError) -> RecoveryStatus:
        cause = err.cause.message if err.cause else str(err)  # type: ignore[attr-defined]
        return await self._finish(Stage.FAILED, f"failed in {self._stage.value}: {cause}")

    async def _act(self, name: str, act: ActInput) -> StepOutcome:
        return await call(name, act, StepOutcome, ACT, name)
