"""RecoveryWorkflow: one durable workflow per interrupted job attempt.

investigate (gather evidence, attribute, join the node decisions of the nodes the verdict
convicts on trusted evidence) → either the job's outcome from its node decision, or the job's
own plan → (monitor mode: wait for approve / reject / expiry) → isolate → restart → verify (short
looks with a durable timer between them). A plan a guard refused runs only on an operator's
approval (an override); autonomous mode holds it, and a drain that `isolate` refuses holds the
job too. A job Slurm no longer knows ends in no_action; a cancelled job is not restarted.
A decision comes by the `decide` update, whose validator refuses it unless one is awaited, or by
the `approve` / `reject` signals (the Temporal UI's), which are audited when they come too late.
Orchestration only: every decision and side effect is an activity, so its result is in the
history and the audit trail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.actions import ActionActivities
    from relaunch.activities.evidence import EvidenceActivities
    from relaunch.activities.node import NodeActivities
    from relaunch.models.node_decision import JobOutcome, Joined, NodeUpdate
    from relaunch.models.recovery import (
        TRUSTED_DETECTION_SOURCES,
        ActInput,
        Action,
        ActionPlan,
        Approval,
        AutoAction,
        Decision,
        DecisionInput,
        Detection,
        EvidenceSummary,
        GatherInput,
        Mode,
        PlanInput,
        RecordDetectionInput,
        RecordEventInput,
        RecoveryInput,
        RecoveryStatus,
        Stage,
        StepOutcome,
        Verdict,
        recovery_workflow_id,
    )
    from relaunch.workflows.approval import PAST, Gate
    from relaunch.workflows.attributes import (
        SA_CATEGORY,
        SA_CLUSTER,
        SA_JOB,
        SA_MODE,
        SA_NODES,
        SA_STAGE,
        stage_attributes,
    )
    from relaunch.workflows.calls import (
        ACT,
        INVESTIGATE,
        INVESTIGATE_BEATING,
        RECORD,
        call,
        job_not_found,
    )
    from relaunch.workflows.launcher_watch import launcher_may_restart, watch_launcher
    from relaunch.workflows.node_decision import NodeDecisionWorkflow
    from relaunch.workflows.verify import verify_restart


# How long a recovery waits for its node decision's outcome beyond the approval timeout
# before it goes on alone (a decision terminated by hand, a stuck batch).
NODE_WAIT_SLACK = timedelta(minutes=15)


@workflow.defn
class RecoveryWorkflow:
    def __init__(self) -> None:
        self._incident = ""
        self._input: RecoveryInput | None = None
        self._stage = Stage.GATHERING
        self._mode: Mode | None = None
        self._verdict: Verdict | None = None
        self._plan: ActionPlan | None = None
        self._gate = Gate()
        self._deadline: datetime | None = None
        self._detections = 0
        self._named_nodes: set[str] = set()
        self._late_decisions = 0
        self._outcome = ""
        # The node decisions this recovery joined (node → id, and the one that requeues its
        # job), and the latest news from each decision (an outcome, once given, stays).
        self._joined = Joined()
        self._node_updates: dict[str, NodeUpdate] = {}

    # ------------------------------------------------------------------ messages

    @workflow.signal
    async def detection(self, det: Detection) -> None:
        """Another observation of this interruption (the watcher's start-or-join)."""
        self._name_nodes([det])
        await self._record_detection(det)

    @workflow.signal
    async def detections(self, dets: list[Detection]) -> None:
        """Later observations of this interruption, held by the watcher and handed over
        together (relaunch/workers/watch_handover.py)."""
        self._name_nodes(dets)
        for det in dets:
            await self._record_detection(det)

    def _name_nodes(self, dets: list[Detection]) -> None:
        """The nodes that detections by what the job's user cannot write name: the evidence
        reads them (taken before any await, so that a gather started meanwhile has them)."""
        for det in dets:
            if det.source in TRUSTED_DETECTION_SOURCES:
                self._named_nodes.update(det.nodes)

    async def _record_detection(self, det: Detection) -> None:
        self._detections += 1
        # Before the run starts (a signal-with-start's signal), this recovery's own id: a
        # recovery opened again after one that took no action is not det.workflow_id.
        incident = self._incident or workflow.info().workflow_id
        await call(
            EvidenceActivities.record_detection,
            RecordDetectionInput(incident_id=incident, detection=det),
            RECORD,
            f"detection: {det.kind}",
            local=True,
        )

    @workflow.signal
    def node_update(self, update: NodeUpdate) -> None:
        """News from a node decision this recovery joined: it awaits approval, or the job's
        outcome (only the decision that requeues the job decides it). Kept by decision: the
        news can come before the recovery has read which decisions it joined (the join is in
        `investigate`, and a signal is handled before the activity's result in one task)."""
        known = self._node_updates.get(update.decision_id)
        if known is not None and known.outcome is not None:
            return  # the job's outcome is given once
        self._node_updates[update.decision_id] = update

    @property
    def _node_outcome(self) -> NodeUpdate | None:
        """The job's outcome from the decision that requeues it, once given."""
        update = self._node_updates.get(self._joined.requeue_by)
        return update if update is not None and update.outcome is not None else None

    @property
    def _node_awaiting(self) -> NodeUpdate | None:
        """The news of the job's decision while it awaits a person's approval."""
        waiting = self._node_waits()
        return waiting if self._gate.taken is None else None

    def _node_waits(self) -> NodeUpdate | None:
        """The job's decision's last news, while it says it awaits approval (decided here or
        not)."""
        update = self._node_updates.get(self._joined.requeue_by)
        waits = update is not None and update.awaiting_approval and update.outcome is None
        return update if waits else None

    @workflow.signal
    async def approve(self, approval: Approval) -> None:
        """Approve the plan awaiting approval (the Temporal UI's and `temporal workflow
        signal`'s way; `relaunch approve` uses the `decide` update)."""
        await self._signalled(Decision.APPROVE, approval)

    @workflow.signal
    async def reject(self, approval: Approval) -> None:
        """Reject the plan awaiting approval (see ``approve``)."""
        await self._signalled(Decision.REJECT, approval)

    @workflow.update
    async def decide(self, inp: DecisionInput) -> RecoveryStatus:
        """A person's decision on the plan awaiting approval; the status with it taken. While
        the job's node decision awaits approval, the decision is that decision's: it covers
        every job that joined it."""
        self._gate.taken = (inp.decision, inp.approval)
        await self._forward(inp.decision, inp.approval)
        return self.status()

    async def _forward(self, decision: Decision, approval: Approval) -> None:
        """Pass a decision on to the node decision awaiting it, if that is what is awaited."""
        if self._node_waits() is not None and self._stage is Stage.ISOLATING:
            signal = {
                Decision.APPROVE: NodeDecisionWorkflow.approve,
                Decision.REJECT: NodeDecisionWorkflow.reject,
            }[decision]
            decision_id = self._joined.requeue_by
            await workflow.get_external_workflow_handle_for(
                NodeDecisionWorkflow.run, decision_id
            ).signal(signal, approval)

    @decide.validator
    def _decide_allowed(self, inp: DecisionInput) -> None:
        self._gate.validate(inp, self._not_awaiting())

    @workflow.query
    def status(self) -> RecoveryStatus:
        node = self._node_awaiting if self._stage is Stage.ISOLATING else None
        awaiting = self._stage is Stage.AWAITING_APPROVAL or node is not None
        news = self._node_updates.get(self._joined.requeue_by)
        return RecoveryStatus(
            incident_id=self._incident,
            stage=self._stage,
            mode=self._mode,
            verdict=self._verdict,
            plan=self._plan,
            awaiting_approval=awaiting,
            approval_deadline=self._deadline if awaiting else None,
            decided_by=self._gate.taken[1].by if self._gate.taken else None,
            detections=self._detections,
            outcome=self._outcome,
            node_decisions=self._joined.decisions,
            node_decision=self._joined.requeue_by or None,
            covers=news.covers if news is not None else None,
        )

    def _not_awaiting(self) -> str | None:
        """Why a decision cannot be taken now (None: the recovery, or the node decision it
        waits on, awaits one: see decide)."""
        node = self._stage is Stage.ISOLATING and self._node_awaiting is not None
        return self._gate.why_not(self._stage is Stage.AWAITING_APPROVAL or node, self._stage.value)

    async def _signalled(self, decision: Decision, approval: Approval) -> None:
        """An approve or reject signal: the decision when one is awaited; otherwise ignored,
        and put in the audit trail as a late decision."""
        why = self._not_awaiting()
        if self._gate.offer(decision, approval, why):
            await self._forward(decision, approval)
            return
        self._late_decisions += 1
        await self._record(
            "late_decision",
            f"{decision.value} by {approval.by} ignored: {why}"
            + (f" (reason: {approval.reason})" if approval.reason else ""),
            actor=approval.by,
            dedupe=f"late_decision:{self._late_decisions}",
            data={
                "decision": decision.value,
                "by": approval.by,
                "reason": approval.reason,
                "stage": self._stage.value,
                "decided_by": self._gate.taken[1].by if self._gate.taken else None,
            },
        )

    # ------------------------------------------------------------------ helpers

    def _enter(self, stage: Stage) -> None:
        """Enter a stage that has no audit row of its own (planning); its search attribute
        follows."""
        self._stage = stage
        workflow.upsert_search_attributes([SA_STAGE.value_set(stage.value)])

    async def _stage_to(self, stage: Stage, summary: str, **data: object) -> None:
        self._stage = stage
        workflow.upsert_search_attributes(stage_attributes(stage))
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
        inp = self._input
        await call(
            EvidenceActivities.record_event,
            RecordEventInput(
                incident_id=self._incident or workflow.info().workflow_id,
                cluster=inp.cluster if inp else None,
                job_id=inp.job_id if inp else None,
                attempt=inp.attempt if inp else None,
                kind=kind,
                summary=summary,
                stage=stage,
                actor=actor,
                nodes=nodes or [],
                data=data or {},
                dedupe=dedupe,
            ),
            RECORD,
            f"audit: {kind}",
            local=True,
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
        gather = GatherInput(
            incident_id=self._incident,
            cluster=inp.cluster,
            job_id=inp.job_id,
            attempt=inp.attempt,
            named_nodes=sorted(self._named_nodes),
        )
        try:
            # Evidence, verdict and the node decisions joined, in one activity.
            found = await call(
                NodeActivities.investigate,
                gather.model_copy(update={"policy": policy}),
                INVESTIGATE_BEATING,
                f"investigate job {inp.job_id}",
            )
        except (ActivityError, ApplicationError) as err:
            # Nothing is left to recover: say so in the trail rather than fail the workflow.
            if not job_not_found(err):
                raise
            return await self._finish(
                Stage.NO_ACTION, f"job {inp.job_id} no longer known to Slurm: no action"
            )
        evidence, verdict, joined = found.evidence, found.verdict, found.joined
        self._verdict = verdict
        workflow.upsert_search_attributes(
            [
                SA_CATEGORY.value_set(verdict.category.value),
                SA_NODES.value_set(verdict.culprit_nodes),
            ]
        )
        if launcher_may_restart(inp, verdict, evidence):
            restarted = await self._launchers_turn(inp, evidence)
            if restarted is not None:
                return restarted
        if joined.decisions:
            return await self._via_node_decisions(inp, verdict, evidence, joined)
        return await self._plan_and_act(inp, verdict, evidence)

    async def _launchers_turn(
        self, inp: RecoveryInput, evidence: EvidenceSummary
    ) -> RecoveryStatus | None:
        """Give the job's own launcher its chance to restart it in the job (launcher_watch.py):
        the finished recovery when it trains again, else None (the recovery plans as always)."""
        look, took = await watch_launcher(self._incident, inp, evidence)
        launcher = look.launcher or "the job's launcher"
        if look.trained_again:
            await self._record(
                "in_job_restart",
                f"in-job restart by {launcher}: {look.detail}, {took.total_seconds():.1f}s "
                "after the recovery began; not requeued",
                dedupe="in_job_restart",
                data={
                    "launcher": look.launcher,
                    "job_id": evidence.job.job_id,
                    "attempt": evidence.job.restart_count,
                    "resumed_step": look.resumed_step,
                    "latest_step": look.latest_step,
                    "seen_after_s": round(took.total_seconds(), 3),
                },
            )
            return await self._finish(
                Stage.NO_ACTION, f"in-job restart by {launcher}: {look.detail}: no action"
            )
        if look.launcher:
            await self._record(
                "in_job_restart",
                f"{launcher} did not have the job training again within "
                f"{took.total_seconds():.0f}s ({look.detail}): the recovery goes on",
                dedupe="in_job_restart",
                data={"launcher": look.launcher, "trained_again": False, "ended": look.ended},
            )
        return None

    async def _plan_and_act(
        self, inp: RecoveryInput, verdict: Verdict, evidence: EvidenceSummary
    ) -> RecoveryStatus:
        """Plan this job's own recovery and carry it out (approval, isolate, restart, verify)."""
        policy = inp.policy
        self._enter(Stage.PLANNING)
        plan = await call(
            EvidenceActivities.plan,
            PlanInput(
                incident_id=self._incident,
                cluster=inp.cluster,
                verdict=verdict,
                evidence=evidence,
                policy=policy,
            ),
            INVESTIGATE,
            "plan",
        )
        self._plan, self._mode = plan, plan.mode
        workflow.upsert_search_attributes([SA_MODE.value_set(plan.mode.value)])

        if plan.action is Action.NONE:
            return await self._finish(Stage.NO_ACTION, f"no action for {verdict.category.value}")

        act = ActInput(incident_id=self._incident, cluster=inp.cluster, plan=plan)
        override = plan.needs_override and plan.action is not Action.HOLD
        refused = "; ".join(f"{g.guard}: {g.detail}" for g in plan.guards if not g.allowed)
        if override and plan.mode is Mode.AUTONOMOUS:
            # Only a person may override a guard; the held stage notifies the operators.
            try:
                held = await self._act(ActionActivities.hold, act)
            except ActivityError as err:
                return await self._failed(err)
            return await self._finish(
                Stage.HELD, f"guard refused ({refused}): held for a human: {held.detail}"
            )

        # A hold changes the cluster too: monitor mode asks first unless the policy lets it
        # hold alone (auto_actions).
        asks = plan.action is not Action.HOLD or AutoAction.HOLD not in policy.auto_actions
        if plan.mode is Mode.MONITOR and asks:
            recommend = f"recommend {plan.action.value}: " + "; ".join(plan.reasons)
            if override:
                recommend = f"guard refused ({refused}), approving overrides it: {recommend}"
            # The absolute deadline, fixed with the stage so that `status` never shows one
            # without the other. The expiry timer starts once the stage is recorded, so it fires
            # at or just after this deadline, never before it.
            self._deadline = workflow.now() + timedelta(seconds=policy.approval_timeout_s)
            await self._stage_to(
                Stage.AWAITING_APPROVAL,
                recommend,
                request_id=plan.request_id,
                **({"override": True} if override else {}),
            )
            try:
                await workflow.wait_condition(
                    lambda: self._gate.taken is not None,
                    timeout=timedelta(seconds=policy.approval_timeout_s),
                    timeout_summary="approval expiry",
                )
            except TimeoutError:
                return await self._finish(
                    Stage.EXPIRED, f"no decision within {policy.approval_timeout_s:g}s: no action"
                )
            assert self._gate.taken is not None
            decision, by = self._gate.taken
            overrides = override and decision is Decision.APPROVE
            await self._record(
                "approval" if decision is Decision.APPROVE else "rejection",
                ("override approved" if overrides else PAST[decision])
                + f" by {by.by}"
                + (f": {by.reason}" if by.reason else "")
                + (f" (overrides {refused})" if overrides else ""),
                actor=by.by,
                dedupe="decision",
                data={
                    "decision": decision.value,
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
            if decision is Decision.REJECT:
                return await self._finish(Stage.REJECTED, f"rejected by {by.by}: no action")

        try:
            if plan.action is Action.HOLD:
                held = await self._act(ActionActivities.hold, act)
                return await self._finish(Stage.HELD, f"held for a human: {held.detail}")
            if plan.drain_nodes or plan.fence_nodes:
                await self._stage_to(Stage.ISOLATING, f"isolating {','.join(plan.drain_nodes)}")
                isolated = await self._act(ActionActivities.isolate, act)
                if not isolated.ok:
                    # Another recovery drained first and the cap is reached: restarting would
                    # leave the job to the scheduler with its culprit in service.
                    held = await self._act(ActionActivities.hold, act)
                    return await self._finish(
                        Stage.HELD, f"{isolated.detail}: held for a human: {held.detail}"
                    )
            if plan.suspect_nodes:
                await self._record(
                    "suspect",
                    f"suspect {','.join(plan.suspect_nodes)}: named by job-controlled evidence "
                    f"only; excluded from job {plan.job_id}, not drained",
                    nodes=plan.suspect_nodes,
                    dedupe="suspect",
                    data={"job_id": plan.job_id, "suspect_nodes": plan.suspect_nodes},
                )
            if plan.job_cancelled:
                return await self._finish(
                    Stage.DONE,
                    f"drained {','.join(plan.drain_nodes) or 'nothing new'}; job {plan.job_id} "
                    "was cancelled: not restarted",
                )
            await self._stage_to(Stage.ACTING, f"restarting by {plan.restart_method.value}")
            if plan.check_nodes:  # named by several users' jobs: checked, not drained
                await self._check_suspects(act)
            restarted = await self._act(ActionActivities.restart, act)
            await self._stage_to(Stage.VERIFYING, restarted.detail)
            return await self._verify(
                restarted.new_job_id or plan.job_id,
                plan.exclude_nodes,
                evidence.job.last_checkpoint_step,
            )
        except ActivityError as err:
            return await self._failed(err)

    # ------------------------------------------------------------------ node decisions

    async def _via_node_decisions(
        self, inp: RecoveryInput, verdict: Verdict, evidence: EvidenceSummary, joined: Joined
    ) -> RecoveryStatus:
        """See the job through the outcome of the node decision that requeues it (the recovery
        joined the decisions of the culprits its verdict convicts, in `investigate`). Where the
        decision leaves the job to this recovery (another node's to requeue, a job in monitor
        mode under an autonomous decision, a failed batch), the recovery plans and acts alone."""
        self._joined = joined
        also = [d for d in joined.decisions.values() if d != joined.requeue_by]
        await self._stage_to(
            Stage.ISOLATING,
            f"awaiting node decision {joined.requeue_by}"
            + (f" (also joined {', '.join(also)})" if also else ""),
            node_decisions=joined.decisions,
        )
        wait = timedelta(seconds=inp.policy.approval_timeout_s) + NODE_WAIT_SLACK
        try:
            await workflow.wait_condition(
                lambda: self._node_outcome is not None,
                timeout=wait,
                timeout_summary="node decision",
            )
        except TimeoutError:
            await self._record(
                "node_decision",
                f"no outcome from {joined.requeue_by} within {wait.total_seconds():.0f}s: "
                "the recovery goes on alone",
                dedupe="node_decision:timeout",
            )
            return await self._plan_and_act(inp, verdict, evidence)
        update = self._node_outcome
        assert update is not None
        outcome = update.outcome
        if outcome is JobOutcome.REQUEUED:
            await self._stage_to(Stage.VERIFYING, update.detail)
            return await self._verify(
                evidence.job.job_id,
                sorted(set(verdict.culprit_nodes) & set(evidence.job.nodes)),
                evidence.job.last_checkpoint_step,
            )
        if outcome is JobOutcome.HOLD:
            act = ActInput(
                incident_id=self._incident,
                cluster=inp.cluster,
                plan=ActionPlan(
                    request_id=f"{self._incident}/node",
                    action=Action.HOLD,
                    mode=Mode.AUTONOMOUS,
                    job_id=evidence.job.job_id,
                    expected_restart_count=evidence.job.restart_count,
                ),
            )
            try:
                held = await self._act(ActionActivities.hold, act)
            except ActivityError as err:
                return await self._failed(err)
            return await self._finish(
                Stage.HELD, f"{update.detail}: held for a human: {held.detail}"
            )
        if outcome is JobOutcome.REJECTED:
            return await self._finish(Stage.REJECTED, f"{update.detail}: no action")
        if outcome is JobOutcome.CANCELLED:
            return await self._finish(Stage.FAILED, f"failed in acting: {update.detail}")
        if outcome is JobOutcome.EXPIRED:
            return await self._finish(Stage.EXPIRED, update.detail)
        # ISOLATED (another node's decision, or a job in monitor mode under an autonomous
        # decision) or FAILED: the recovery plans and acts on its own, as without decisions.
        await self._record(
            "node_decision",
            f"{joined.requeue_by}: {outcome.value if outcome else '?'} — {update.detail}",
            dedupe=f"node_decision:{outcome.value if outcome else '?'}",
        )
        return await self._plan_and_act(inp, verdict, evidence)

    async def _verify(
        self, job_id: str, avoid: list[str], checkpoint: int | None
    ) -> RecoveryStatus:
        assert self._input is not None
        looked = await verify_restart(self._incident, self._input, job_id, avoid, checkpoint)
        return await self._finish(*looked)

    async def _check_suspects(self, act: ActInput) -> None:
        """Hand the plan's check nodes to their lifecycle's checks; the job's restart never
        waits on them: a failure is said in the trail and the recovery goes on."""
        try:
            await self._act(ActionActivities.check_suspects, act)
        except ActivityError as err:
            cause = err.cause.message if err.cause else str(err)  # type: ignore[attr-defined]
            await self._record(
                "lifecycle",
                f"could not send {','.join(act.plan.check_nodes)} to their checks: {cause}",
                nodes=act.plan.check_nodes,
                dedupe="check_suspects:failed",
            )

    async def _failed(self, err: ActivityError) -> RecoveryStatus:
        cause = err.cause.message if err.cause else str(err)  # type: ignore[attr-defined]
        return await self._finish(Stage.FAILED, f"failed in {self._stage.value}: {cause}")

    async def _act(
        self, step: Callable[[ActionActivities, ActInput], Awaitable[StepOutcome]], act: ActInput
    ) -> StepOutcome:
        """Run an action (isolate, restart, hold) with the ACT policy."""
        return await call(step, act, ACT, step.__name__)
