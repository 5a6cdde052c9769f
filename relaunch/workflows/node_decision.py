"""NodeDecisionWorkflow: one durable decision per failed node and failure.

The first job recovery that convicts a node on trusted evidence starts the node's decision
(``relaunch-<cluster>-node-<node>-<n>``, signal-with-start by the `join_node_decisions`
activity); every other recovery that blames the node joins it. The decision plans the node's
drain once (blast-radius guard), waits for one approval in monitor mode (it covers every job
that joined), drains (and fences) the node once, then requeues the jobs that joined in batches
(one `scontrol requeue` a batch) and tells each job's recovery its outcome (signal
`node_update`); each recovery then verifies its own job. It stays open for a while after the
last join, so that late detections of the same failure join it rather than start another.

The watcher does not wait for the jobs: when its own probes find a node's slurmd gone (trusted
evidence), it reports the node (signal `report`, signal-with-start), and the decision plans the
drain at once, on a fresh probe of the node, while the recoveries of the node's jobs are still
starting; they join a decision that has already drained. A node that answers the fresh probe is
not convicted on the report: the first job that joins convicts it, or nothing does.
Orchestration only: every decision and side effect is an activity.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.actions import ActionActivities
    from relaunch.activities.node import NodeActivities
    from relaunch.models.node_decision import (
        Ahead,
        BatchJob,
        JobOutcome,
        JoinRequest,
        NodeDecisionInput,
        NodeDecisionStatus,
        NodePlan,
        NodePlanInput,
        NodeReport,
        NodeUpdate,
        RequeueBatchInput,
    )
    from relaunch.models.recovery import (
        ActInput,
        Approval,
        Decision,
        DecisionInput,
        Mode,
        Stage,
    )
    from relaunch.workflows.approval import PAST, Gate
    from relaunch.workflows.attributes import (
        SA_CLUSTER,
        SA_MODE,
        SA_NODES,
        stage_attributes,
    )
    from relaunch.workflows.calls import (
        ACT,
        REQUEUE,
        NodeRows,
        call,
    )
    from relaunch.workflows.node_look import LookAgain

# A decision plans and, where no person need approve (autonomous mode, the guard allows),
# isolates the node in one activity (`plan_node`) that also records the planning stage: when a
# rack fails, each workflow task of the decision waits behind hundreds of the recoveries', and
# every job's first action is this drain. On a report that a fresh probe confirms, plan_node
# also requeues the report's jobs as soon as the node is isolated, ahead of their recoveries'
# joins: a rack's jobs are back in the queue seconds after the failure; the joins then only
# complete each job's trail.
#

# How long a decision stays open after its last join: later detections of the same failure
# (a job whose recovery was slow to start, a straggler's hang) join it instead of starting the
# node's next decision.
JOIN_WINDOW = timedelta(minutes=10)
# At most this many jobs in one `scontrol requeue` batch; the rest go in the next.
BATCH_MAX = 200
# Signals to the joined recoveries, sent at once in groups of this many.
SIGNAL_GROUP = 100


@workflow.defn
class NodeDecisionWorkflow(LookAgain, NodeRows):
    def __init__(self) -> None:
        self._id = ""
        self._input: NodeDecisionInput | None = None
        self._stage = Stage.PLANNING
        self._plan: NodePlan | None = None
        # Joined and not yet given an outcome; joined and not yet told anything.
        self._pending: list[JoinRequest] = []
        self._unannounced: list[JoinRequest] = []
        self._joined: dict[str, JoinRequest] = {}
        self._gate = Gate()
        self._deadline: datetime | None = None
        self._requeued = 0
        self._batches = 0
        self._outcome = ""
        # Once the decision is made: what every job that joins gets (None: requeue it).
        self._final: tuple[JobOutcome, str] | None = None
        self._report: NodeReport | None = None
        # Looking again: whether plan_node had the report, when the node was isolated, how
        # many looks were made, and whether looking is over.
        self._report_used = False
        self._isolated_at: datetime | None = None
        self._looks = 0
        self._looked = False
        # The jobs plan_node (or a look again) requeued ahead of their joins, by job id.
        self._ahead: dict[str, Ahead] = {}
        # Set when the node turned out to be back in service: why the decision closed.
        self._back = ""

    # ------------------------------------------------------------------ messages

    @workflow.signal
    def join(self, request: JoinRequest) -> None:
        """A job recovery that blames this node (signal-with-start by `join_node_decisions`)."""
        if request.recovery_id in self._joined:
            return  # a retried join: already counted
        self._joined[request.recovery_id] = request
        self._pending.append(request)
        self._unannounced.append(request)

    @workflow.signal
    def report(self, report: NodeReport) -> None:
        """The watcher's probes found the node gone (signal-with-start by the watcher): the
        decision may plan from it before any job's recovery joins. Later reports add nothing."""
        if self._report is None:
            self._report = report

    @workflow.signal
    def back_in_service(self, note: str) -> None:
        """The node's lifecycle returned it to service (relaunch/workflows/lifecycle.py): this
        failure is over, and the node's next one is the next decision's. Jobs that join from
        now on go on alone; the decision closes."""
        if not self._back:
            self._back = note[:500]

    @workflow.signal
    async def approve(self, approval: Approval) -> None:
        """Approve the node's plan (the Temporal UI's way; `relaunch approve` uses `decide`)."""
        self._signalled(Decision.APPROVE, approval)

    @workflow.signal
    async def reject(self, approval: Approval) -> None:
        """Reject the node's plan (see ``approve``)."""
        self._signalled(Decision.REJECT, approval)

    @workflow.update
    def decide(self, inp: DecisionInput) -> NodeDecisionStatus:
        """A person's decision on the node's plan, covering every job that joined."""
        self._gate.taken = (inp.decision, inp.approval)
        return self.status()

    @decide.validator
    def _decide_allowed(self, inp: DecisionInput) -> None:
        self._gate.validate(inp, self._not_awaiting())

    @workflow.query
    def status(self) -> NodeDecisionStatus:
        awaiting = self._stage is Stage.AWAITING_APPROVAL
        inp = self._input
        return NodeDecisionStatus(
            decision_id=self._id,
            node=inp.node if inp else "",
            stage=self._stage,
            mode=self._plan.mode if self._plan else None,
            plan=self._plan,
            awaiting_approval=awaiting,
            approval_deadline=self._deadline if awaiting else None,
            decided_by=self._gate.taken[1].by if self._gate.taken else None,
            covers=list(self._joined),
            requeued=self._requeued,
            outcome=self._outcome,
        )

    def _not_awaiting(self) -> str | None:
        return self._gate.why_not(self._stage is Stage.AWAITING_APPROVAL, self._stage.value)

    def _signalled(self, decision: Decision, approval: Approval) -> None:
        self._gate.offer(decision, approval, self._not_awaiting())

    # ------------------------------------------------------------------ helpers

    async def _stage_to(self, stage: Stage, summary: str, **data: object) -> None:
        self._stage = stage
        workflow.upsert_search_attributes(stage_attributes(stage))
        await self._record(
            "stage", summary, stage=stage.value, dedupe=f"stage:{stage.value}", data=data
        )

    async def _tell(self, requests: list[JoinRequest], update: NodeUpdate) -> None:
        """Send ``update`` to the recoveries of ``requests``."""
        await self._send([(r.recovery_id, update) for r in requests])

    async def _send(self, updates: list[tuple[str, NodeUpdate]]) -> None:
        """Send each recovery its update, a group at a time (the signals of a group go out
        together, in one workflow task)."""
        for start in range(0, len(updates), SIGNAL_GROUP):
            group = updates[start : start + SIGNAL_GROUP]
            await asyncio.gather(*(self._signal_one(rid, update) for rid, update in group))

    async def _signal_one(self, recovery_id: str, update: NodeUpdate) -> None:
        # Imported here: the recovery workflow's module imports this one (it forwards a
        # person's decision to a node decision).
        from relaunch.workflows.recovery import RecoveryWorkflow

        try:
            await workflow.get_external_workflow_handle_for(
                RecoveryWorkflow.run, recovery_id
            ).signal(RecoveryWorkflow.node_update, update)
        except Exception as exc:  # a recovery that ended (or was terminated) meanwhile
            workflow.logger.warning("could not tell %s: %s", recovery_id, exc)

    def _update(self, outcome: JobOutcome | None = None, detail: str = "") -> NodeUpdate:
        inp = self._input
        assert inp is not None
        return NodeUpdate(
            decision_id=self._id,
            node=inp.node,
            stage=self._stage,
            awaiting_approval=self._stage is Stage.AWAITING_APPROVAL,
            covers=len(self._joined),
            outcome=outcome,
            detail=detail,
        )

    def _take_pending(self) -> list[JoinRequest]:
        taken, self._pending = self._pending, []
        self._unannounced = []
        return taken

    # ------------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: NodeDecisionInput) -> NodeDecisionStatus:
        self._input = inp
        self._id = workflow.info().workflow_id
        workflow.upsert_search_attributes(
            [SA_CLUSTER.value_set(inp.cluster), SA_NODES.value_set([inp.node])]
        )
        await workflow.wait_condition(lambda: bool(self._pending) or self._report is not None)
        plan: NodePlan | None = None
        if not self._pending and self._report is not None:
            report = self._report
            plan = await self._plan_drain(
                f"node decision for {inp.node}: reported by the watcher ({report.text})",
                report=report,
            )
            if plan is not None and not plan.convicted:  # it answered the decision's own probe
                plan = None
                if not await self._joined_within_window():
                    await self._stage_to(Stage.NO_ACTION, f"{inp.node} not convicted: no action")
                    return self.status()
        if plan is None and self._final is None:
            first = self._pending[0]
            plan = await self._plan_drain(
                f"node decision for {inp.node}: convicted by {first.recovery_id} "
                f"({first.category.value})",
                first=first,
                # A report that came meanwhile lists the jobs to requeue ahead of their joins.
                report=self._report,
            )
        if plan is not None:
            self._plan = plan
            workflow.upsert_search_attributes([SA_MODE.value_set(plan.mode.value)])
            if plan.isolated is not None:  # planned and isolated in one step
                ok = plan.isolated.ok
                self._isolated_at = workflow.now()
                self._final = None if ok else (JobOutcome.HOLD, plan.isolated.detail)
            else:
                self._final = await self._decide(plan)
                if self._final is None:
                    self._final = await self._isolate(plan)
        if self._final is None:
            await self._stage_to(Stage.ACTING, f"requeueing the jobs of {inp.node} in batches")
        else:  # every job that joins, now or later, is told the same
            await self._stage_to(self._final_stage(), self._final[1])
        await self._serve_joins()
        return await self._finish()

    async def _plan_drain(
        self, summary: str, *, first: JoinRequest | None = None, report: NodeReport | None = None
    ) -> NodePlan | None:
        """Plan the drain from the first job that joined or from the watcher's report:
        `plan_node` records the planning stage and, where no person need approve, isolates the
        node too: one activity between the failure and the drain. None when that failed (every
        job's recovery then goes on alone, as when `isolate` fails)."""
        inp = self._input
        assert inp is not None
        plan_input = NodePlanInput(
            decision_id=self._id,
            cluster=inp.cluster,
            node=inp.node,
            first=first,
            report=report,
            policy=inp.policy,
            stage_summary=summary,
        )
        self._report_used = report is not None
        self._stage = Stage.PLANNING
        workflow.upsert_search_attributes(stage_attributes(Stage.PLANNING))
        try:
            plan = await call(
                NodeActivities.plan_node, plan_input, ACT, f"plan and isolate {inp.node}"
            )
        except ActivityError as err:
            self._final = (JobOutcome.FAILED, f"planning and isolating {inp.node} failed: {err}")
            return None
        self._ahead = {a.job_id: a for a in plan.ahead}
        return plan

    async def _decide(self, plan: NodePlan) -> tuple[JobOutcome, str] | None:
        """The guard and, in monitor mode, a person: None to go ahead, else every job's fate."""
        inp = self._input
        assert inp is not None
        refused = "; ".join(f"{g.guard}: {g.detail}" for g in plan.guards if not g.allowed)
        if plan.needs_override and plan.mode is Mode.AUTONOMOUS:
            return JobOutcome.HOLD, f"guard refused draining {inp.node} ({refused})"
        if plan.mode is not Mode.MONITOR:
            return None
        recommend = f"recommend draining {inp.node} and requeueing its jobs: " + "; ".join(
            plan.reasons
        )
        if plan.needs_override:
            recommend = f"guard refused ({refused}), approving overrides it: {recommend}"
        # Fixed with the stage, so that `status` never shows one without the other.
        self._deadline = workflow.now() + timedelta(seconds=inp.policy.approval_timeout_s)
        await self._stage_to(
            Stage.AWAITING_APPROVAL,
            recommend,
            request_id=f"{self._id}/plan",
            **({"override": True} if plan.needs_override else {}),
        )
        try:
            while self._gate.taken is None:
                # Jobs that join while the decision waits hear that it waits (and for whom).
                announce, self._unannounced = self._unannounced, []
                await self._tell(announce, self._update())
                remaining = self._deadline - workflow.now()
                await workflow.wait_condition(
                    lambda: self._gate.taken is not None or bool(self._unannounced),
                    timeout=max(remaining, timedelta(seconds=1)),
                    timeout_summary="approval expiry",
                )
        except TimeoutError:
            return JobOutcome.EXPIRED, (
                f"no decision on draining {inp.node} within "
                f"{inp.policy.approval_timeout_s:g}s: no action"
            )
        decision, by = self._gate.taken
        overrides = plan.needs_override and decision is Decision.APPROVE
        await self._record(
            "approval" if decision is Decision.APPROVE else "rejection",
            ("override approved" if overrides else PAST[decision])
            + f" by {by.by}"
            + (f": {by.reason}" if by.reason else "")
            + f" (covers {len(self._joined)} jobs)"
            + (f" (overrides {refused})" if overrides else ""),
            actor=by.by,
            dedupe="decision",
            data={
                "decision": decision.value,
                "by": by.by,
                "reason": by.reason,
                "request_id": f"{self._id}/plan",
                "covers": list(self._joined),
                **(
                    {"override": True, "guards": [g.guard for g in plan.guards if not g.allowed]}
                    if overrides
                    else {}
                ),
            },
        )
        if decision is Decision.REJECT:
            return JobOutcome.REJECTED, f"draining {inp.node} rejected by {by.by}"
        return None

    async def _isolate(self, plan: NodePlan) -> tuple[JobOutcome, str] | None:
        """Drain (and fence) the node once; a refusal at drain time holds every job."""
        inp = self._input
        assert inp is not None
        if not plan.drain and not plan.fence:
            return None
        await self._stage_to(Stage.ISOLATING, f"isolating {inp.node}")
        try:
            isolated = await call(
                ActionActivities.isolate,
                ActInput(incident_id=self._id, cluster=inp.cluster, plan=plan.isolation()),
                ACT,
                f"isolate {inp.node}",
            )
        except ActivityError as err:
            return JobOutcome.FAILED, f"isolating {inp.node} failed: {err}"
        if not isolated.ok:
            return JobOutcome.HOLD, isolated.detail
        return None

    async def _joined_within_window(self) -> bool:
        """Wait up to JOIN_WINDOW for a job to join (or a report that came late, to look at
        the node for); whether either did."""
        try:
            await workflow.wait_condition(
                lambda: bool(self._pending) or self._look_due_at() is not None or bool(self._back),
                timeout=JOIN_WINDOW,
                timeout_summary="join window",
            )
        except TimeoutError:
            return bool(self._pending) or self._look_due_at() is not None
        return not self._back

    async def _serve_joins(self) -> None:
        """Requeue (or tell the fate of) every job that joined, batch by batch, until no job
        has joined for JOIN_WINDOW; look at the node again when due."""
        inp = self._input
        assert inp is not None
        while True:
            if self._back:  # returned to service by its lifecycle: over
                await self._tell(self._take_pending(), self._update(JobOutcome.FAILED, self._back))
                return
            if not self._pending:
                if self._look_due_at() is None:
                    if not await self._joined_within_window():
                        return
                else:
                    await self._until_joined_or_look()
            if self._look_due():
                await self._look_again()
            if not self._pending:
                continue
            taken = self._take_pending()
            if self._final is not None:
                outcome, detail = self._final
                await self._tell(taken, self._update(outcome, detail))
                continue
            # A job requeued ahead of its join was requeued: its batch only writes its row.
            ahead = [r for r in taken if r.requeue_by == inp.node and self._ahead_of(r)]
            rest = [r for r in taken if not (r.requeue_by == inp.node and self._ahead_of(r))]
            mine = [r for r in rest if self._requeues(r)]
            others = [r for r in rest if not self._requeues(r)]
            if others:
                await self._tell(
                    others,
                    self._update(
                        JobOutcome.ISOLATED,
                        f"{inp.node} isolated by {self._id}; the job's own recovery goes on",
                    ),
                )
            batches = [ahead, *(mine[s : s + BATCH_MAX] for s in range(0, len(mine), BATCH_MAX))]
            for i, batch in enumerate(batches):
                if batch and not await self._requeue(batch):
                    # The node is back in service: this decision is over. The jobs of its new
                    # failure that joined meanwhile go on alone; later ones start the next.
                    rest = [r for b in batches[i + 1 :] for r in b] + self._take_pending()
                    await self._tell(rest, self._update(JobOutcome.FAILED, self._back))
                    return

    def _requeues(self, request: JoinRequest) -> bool:
        """Whether this decision requeues the job: it names this node to, and either a person
        approved the decision or the job's own policy is autonomous (a job in monitor mode is
        never restarted without someone's approval)."""
        inp = self._input
        assert inp is not None
        if request.requeue_by != inp.node:
            return False
        return self._gate.taken is not None or request.mode is Mode.AUTONOMOUS

    def _ahead_of(self, request: JoinRequest) -> Ahead | None:
        """The requeue plan_node did for this job ahead of its join, if it was of the attempt
        the job's recovery is about (the same restart count)."""
        ahead = self._ahead.get(request.job_id)
        if ahead is None or ahead.expected_restart_count != request.expected_restart_count:
            return None
        return ahead

    async def _requeue(self, batch: list[JoinRequest]) -> bool:
        """Requeue one batch and tell each job its outcome; False when the node turned out to
        be back in service (nothing requeued, each job told to go on alone)."""
        inp = self._input
        assert inp is not None
        self._batches += 1
        try:
            result = await call(
                NodeActivities.requeue_batch,
                RequeueBatchInput(
                    decision_id=self._id,
                    cluster=inp.cluster,
                    node=inp.node,
                    batch=self._batches,
                    jobs=[
                        BatchJob(
                            recovery_id=r.recovery_id,
                            job_id=r.job_id,
                            expected_restart_count=r.expected_restart_count,
                            max_restarts=r.max_restarts,
                            exclude_nodes=r.exclude_nodes,
                            ahead=self._ahead_of(r),
                        )
                        for r in batch
                    ],
                    policy=inp.policy,
                    out_of_service=True,
                ),
                REQUEUE,
                f"requeue {len(batch)} jobs (batch {self._batches})",
            )
        except ActivityError as err:
            # Each job's own recovery restarts it instead (idempotently: a requeue that did
            # happen is found done).
            await self._tell(
                batch, self._update(JobOutcome.FAILED, f"batch {self._batches} failed: {err}")
            )
            return True
        if result.back_in_service is not None:
            self._back = (
                f"{inp.node} is back in service ({result.back_in_service}) since {self._id} "
                "took it out: a new failure, which the job's own recovery decides"
            )
            await self._tell(batch, self._update(JobOutcome.FAILED, self._back))
            return False
        self._requeued += sum(1 for r in result.results if r.outcome is JobOutcome.REQUEUED)
        await self._send(
            [
                (
                    done.recovery_id,
                    self._update(done.outcome, done.detail).model_copy(
                        update={"changed": done.changed}
                    ),
                )
                for done in result.results
            ]
        )
        return True

    def _final_stage(self) -> Stage:
        assert self._final is not None
        return {
            JobOutcome.HOLD: Stage.HELD,
            JobOutcome.REJECTED: Stage.REJECTED,
            JobOutcome.EXPIRED: Stage.EXPIRED,
        }.get(self._final[0], Stage.FAILED)

    async def _finish(self) -> NodeDecisionStatus:
        inp = self._input
        assert inp is not None
        if self._final is None:
            stage = Stage.DONE
            self._outcome = (
                f"{inp.node} isolated; {self._requeued} of {len(self._joined)} jobs requeued "
                f"in {self._batches} batches" + (f"; closed: {self._back}" if self._back else "")
            )
        else:
            stage = self._final_stage()
            self._outcome = f"{self._final[1]} ({len(self._joined)} jobs)"
        await self._stage_to(stage, self._outcome)
        await workflow.wait_condition(workflow.all_handlers_finished)
        # Joined while the decision closed: their own recoveries go on without it.
        await self._tell(
            self._take_pending(),
            self._update(JobOutcome.FAILED, f"{self._id} closed before the job's turn"),
        )
        return self.status()
