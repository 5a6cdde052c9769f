"""NodeLifecycleWorkflow: from drained to healthy, or to a repair ticket.

Every node Relaunch drains gets one, ``relaunch-<cluster>-lifecycle-<node>-<n>`` (one at a time
per node: a drain while one runs joins it as another fault). It confirms the drain with a
fresh read, lets the node settle, fences it off in a maintenance reservation (no user job
starts there) and runs the health-check catalogue on it through Slurm. Checks that pass return
the node to service; checks that fail climb the remediation ladder, one rung at a time and each
at most once per fault (GPU reset, reboot), validating after each; at the top, or straight away
for a lemon (returned recently and failing again), the same fault too often, or a fault the Xid
catalogue sends to repair, the node goes to repair: a ticket to the configured webhook, the
node drained with the ticket as its reason, until someone says it is repaired (signal
`returned`), when it is validated again before it returns.

Nothing returns to service without a passing validation in the audit trail. In monitor mode a
person approves every rung that changes the node and every return (the update `decide`, or the
signals `approve` / `reject`, as for a recovery); a rejection or an expiry sends the node to
repair. Orchestration only: every side effect is an activity. See docs/lifecycle.md.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.lifecycle import LifecycleActivities
    from relaunch.models.lifecycle import (
        CHANGES_NODE,
        CheckRun,
        ChecksInput,
        HoldInput,
        LifecycleFault,
        LifecycleInput,
        LifecycleStatus,
        NodeStage,
        NodeStepInput,
        Pending,
        RepairReturn,
        Rung,
        RungInput,
        StartInput,
        StartResult,
    )
    from relaunch.models.recovery import (
        Approval,
        AutoAction,
        Decision,
        DecisionInput,
        Mode,
        Stage,
    )
    from relaunch.workflows.approval import PAST, Gate
    from relaunch.workflows.attributes import (
        SA_AWAITING,
        SA_CLUSTER,
        SA_MODE,
        SA_NODE_STAGE,
        SA_NODES,
    )
    from relaunch.workflows.calls import (
        NODE_CHANGE,
        NODE_LONG,
        NODE_LOOK,
        call,
    )
    from relaunch.workflows.lifecycle_repair import Escalate, Repair

# A suspect found out of service waits this long for the drain's own fault (the drain's
# `isolate` hands the node to its lifecycle right after it): then this is the drain's lifecycle.
DRAIN_FAULT_WAIT = timedelta(seconds=60)


@workflow.defn
class NodeLifecycleWorkflow(Repair):
    def __init__(self) -> None:
        self._id = ""
        self._input: LifecycleInput | None = None
        self._stage = NodeStage.SUSPECT
        self._faults: list[LifecycleFault] = []
        self._recorded = 0
        self._ladder: list[Rung] = []
        self._tried: list[Rung] = []
        self._runs: list[CheckRun] = []
        self._pending: Pending | None = None
        self._gate = Gate()
        self._decisions = 0
        self._repaired: RepairReturn | None = None
        self._ticket = ""
        self._outcome = ""
        self._visits = 0  # stages entered: each stage row's dedupe key
        self._drain_looked = False  # a suspect's: the drain that came meanwhile was looked at

    # ------------------------------------------------------------------ messages

    @workflow.signal
    def fault(self, fault: LifecycleFault) -> None:
        """A drain of the node (signal-with-start by whoever drained it): the first starts the
        lifecycle; a later one, while it runs, is recorded with it."""
        if all(f.incident_id != fault.incident_id for f in self._faults):
            self._faults.append(fault)

    @workflow.signal
    async def approve(self, approval: Approval) -> None:
        """Approve the pending step (the Temporal UI's way; the CLI and console use `decide`)."""
        self._signalled(Decision.APPROVE, approval)

    @workflow.signal
    async def reject(self, approval: Approval) -> None:
        self._signalled(Decision.REJECT, approval)

    @workflow.signal
    def returned(self, repair: RepairReturn) -> None:
        """The node is repaired (`relaunch nodes returned`, or the repair system's callback):
        validate it and return it to service."""
        if self._stage is NodeStage.ESCALATED and self._repaired is None:
            self._repaired = repair

    @workflow.update
    def decide(self, inp: DecisionInput) -> LifecycleStatus:
        self._gate.taken = (inp.decision, inp.approval)
        return self.status()

    @decide.validator
    def _decide_allowed(self, inp: DecisionInput) -> None:
        self._gate.validate(inp, self._not_awaiting())

    @workflow.query
    def status(self) -> LifecycleStatus:
        inp = self._input
        return LifecycleStatus(
            lifecycle_id=self._id,
            node=inp.node if inp else "",
            stage=self._stage,
            mode=inp.mode if inp else Mode.MONITOR,
            faults=self._faults,
            ladder=self._ladder,
            tried=self._tried,
            pending=self._pending,
            runs=self._runs[-5:],
            ticket=self._ticket,
            outcome=self._outcome,
        )

    def _not_awaiting(self) -> str | None:
        return self._gate.why_not(self._pending is not None, self._stage.value)

    def _signalled(self, decision: Decision, approval: Approval) -> None:
        self._gate.offer(decision, approval, self._not_awaiting())

    # ------------------------------------------------------------------ helpers

    def _step(self) -> NodeStepInput:
        inp = self._input
        assert inp is not None
        return NodeStepInput(
            lifecycle_id=self._id, cluster=inp.cluster, node=inp.node, settings=inp.settings
        )

    async def _stage_to(self, stage: NodeStage, summary: str, **data: object) -> None:
        """Enter ``stage``: the search attribute and one `node_stage` row. Returns and repairs
        also close or hold the incident in the recovery's terms (a `stage` row: the console's
        lists and the notifier read those)."""
        self._stage = stage
        workflow.upsert_search_attributes([SA_NODE_STAGE.value_set(stage.value)])
        self._visits += 1
        await self._record(
            "node_stage",
            summary,
            stage=stage.value,
            dedupe=f"node_stage:{self._visits}:{stage.value}",
            data=data,
        )
        mirror = {
            NodeStage.RETURNED: Stage.DONE,
            NodeStage.ESCALATED: Stage.HELD,
            NodeStage.CLOSED: Stage.NO_ACTION,
        }.get(stage)
        if mirror is not None:
            await self._record(
                "stage", summary, stage=mirror.value, dedupe=f"stage:{self._visits}:{mirror.value}"
            )

    async def _record_faults(self) -> None:
        """An audit row for each fault not recorded yet."""
        while self._recorded < len(self._faults):
            f = self._faults[self._recorded]
            self._recorded += 1
            await self._record(
                "lifecycle_fault",
                f"fault from {f.incident_id}: {f.category.value}"
                + (f" ({f.kind})" if f.kind else "")
                + (f", remedy {f.remedy}" if f.remedy else "")
                + (f": {f.summary}" if f.summary else ""),
                dedupe=f"fault:{f.incident_id}",
                data=f.model_dump(mode="json"),
            )

    async def _ask(self, step: str, summary: str) -> Approval:
        """In monitor mode, wait for a person's decision on ``step``; the approval, or
        Escalate on a rejection or when nobody decided in time."""
        inp = self._input
        assert inp is not None
        self._decisions += 1
        request = f"{self._id}/{self._decisions}:{step}"
        timeout = timedelta(seconds=inp.approval_timeout_s)
        deadline: datetime = workflow.now() + timeout
        self._pending = Pending(request_id=request, step=step, summary=summary, deadline=deadline)
        self._gate.taken = None
        workflow.upsert_search_attributes([SA_AWAITING.value_set(True)])
        await self._record(
            "stage",
            f"recommend {summary}",
            stage=Stage.AWAITING_APPROVAL.value,
            dedupe=f"awaiting:{request}",
            data={"request_id": request, "step": step},
        )
        try:
            await workflow.wait_condition(
                lambda: self._gate.taken is not None,
                timeout=timeout,
                timeout_summary=f"approval of {step}",
            )
        except TimeoutError:
            self._pending = None
            workflow.upsert_search_attributes([SA_AWAITING.value_set(False)])
            raise Escalate(f"no decision on {step} within {timeout.total_seconds():g}s") from None
        assert self._gate.taken is not None
        decision, by = self._gate.taken
        self._pending = None
        workflow.upsert_search_attributes([SA_AWAITING.value_set(False)])
        await self._record(
            "approval" if decision is Decision.APPROVE else "rejection",
            f"{step} {PAST[decision]} by {by.by}" + (f": {by.reason}" if by.reason else ""),
            actor=by.by,
            dedupe=f"decision:{request}",
            data={
                "decision": decision.value,
                "by": by.by,
                "reason": by.reason,
                "request_id": request,
                "step": step,
            },
        )
        if decision is Decision.REJECT:
            raise Escalate(f"{step} rejected by {by.by}")
        return by

    def _asks(self, action: AutoAction) -> bool:
        """Whether a person is asked before ``action``: in monitor mode, for the diagnosing
        checks (the reservation and the check jobs) and the repair ticket too, unless the
        policy's auto_actions names them."""
        inp = self._input
        assert inp is not None
        return inp.mode is Mode.MONITOR and action not in inp.auto_actions

    async def _checks(self, purpose: str, *, ask: bool = False) -> CheckRun:
        """Fence the node off in its reservation, run the checks, record them; with ``ask``,
        in monitor mode, after a person approved them (a rejection raises Escalate)."""
        inp = self._input
        assert inp is not None
        if ask and self._asks(AutoAction.CHECKS):
            await self._ask(
                "checks", f"reserve {inp.node} and run its checks ({purpose}): a Slurm step each"
            )
        state = await call(
            LifecycleActivities.reserve, self._step(), NODE_CHANGE, f"reserve {inp.node}"
        )
        fault = self._faults[0]
        run = await call(
            LifecycleActivities.run_checks,
            ChecksInput(
                **self._step().model_dump(),
                purpose=purpose,
                category=fault.category,
                since=fault.at,
            ),
            NODE_LONG,
            f"checks on {inp.node}: {purpose}",
        )
        self._runs.append(run)
        await self._record(
            "checks",
            f"{purpose}: {run.summary()}",
            # Unique across a continue-as-new too (the runs carried are the last few only).
            dedupe=f"checks:{self._visits}:{len(self._runs)}",
            data={**run.model_dump(mode="json"), "passed": run.passed, "state": state},
        )
        return run

    # ------------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: LifecycleInput) -> LifecycleStatus:
        self._input = inp
        self._id = workflow.info().workflow_id
        if inp.carry is not None:  # continued as new while the node waited for its repair
            c = inp.carry
            self._faults, self._recorded, self._ladder = c.faults, len(c.faults), c.ladder
            self._tried, self._runs, self._ticket = c.tried, c.runs, c.ticket
            self._visits, self._decisions = c.visits, c.decisions
            self._stage = NodeStage.ESCALATED
            await self._repair(c.why, waiting=True)
            return self.status()
        workflow.upsert_search_attributes(
            [
                SA_CLUSTER.value_set(inp.cluster),
                SA_NODES.value_set([inp.node]),
                SA_MODE.value_set(inp.mode.value),
            ]
        )
        await workflow.wait_condition(lambda: bool(self._faults))
        await self._record_faults()
        first = self._faults[0]
        await self._stage_to(
            NodeStage.SUSPECT,
            f"{inp.node}: checks for {first.incident_id}'s suspicion (not drained)"
            if first.suspect
            else f"{inp.node}: lifecycle for {first.incident_id}'s drain",
        )
        start = await self._look(first)
        if first.suspect:
            await self._suspect(start.drained, start.state)
            await self._record_faults()
            return self.status()
        if not start.drained:
            self._outcome = f"{inp.node} is not out of service ({start.state}): nothing to do"
            await self._stage_to(NodeStage.CLOSED, self._outcome)
            return self.status()
        await self._after_drain(start)
        await self._record_faults()
        return self.status()

    async def _look(self, fault: LifecycleFault) -> StartResult:
        """A fresh read of the node for ``fault``: whether it is out, its ladder, and whether
        it goes straight to repair."""
        inp = self._input
        assert inp is not None
        start = await call(
            LifecycleActivities.start,
            StartInput(**self._step().model_dump(), fault=fault),
            NODE_LOOK,
            f"look at {inp.node}",
        )
        self._ladder = start.ladder
        return start

    async def _after_drain(self, start: StartResult, how: str = "") -> None:
        """A drained node's lifecycle: let it settle, check it, climb the ladder, to its
        return or to repair."""
        inp = self._input
        assert inp is not None
        await self._stage_to(
            NodeStage.DRAINED,
            f"{inp.node} out of service ({start.state}){how}; checks in {inp.settings.settle_s:g}s",
            ladder=[r.value for r in start.ladder],
        )
        if inp.settings.settle_s > 0:
            await workflow.sleep(timedelta(seconds=inp.settings.settle_s), summary="settle")
        try:
            await self._diagnose_and_climb(start.escalate)
        except Escalate as why:
            await self._repair(str(why))

    async def _diagnose_and_climb(self, escalate: str) -> None:
        """Diagnose; return the node on passing checks, else climb the ladder. Raises
        Escalate when the node is for repair."""
        inp = self._input
        assert inp is not None
        await self._stage_to(NodeStage.DIAGNOSING, f"checking {inp.node}")
        try:
            run = await self._checks("diagnose", ask=True)
        except ActivityError as err:
            raise Escalate(f"the checks could not run: {err.cause or err}") from None
        if escalate:
            await self._hold()
            raise Escalate(escalate)
        if run.passed:
            await self._return("the checks passed: " + run.summary())
            return
        await self._not_conclusive(run)
        await self._hold()
        await self._climb(run)

    async def _climb(self, run: CheckRun) -> None:
        """Climb the ladder after failing checks (``run``), validating after each rung; return
        the node once it passes. Raises Escalate when the node is for repair."""
        inp = self._input
        assert inp is not None
        for rung in self._ladder:
            if rung is Rung.ESCALATE:
                break
            if rung in self._tried:
                continue
            if not await self._apply(rung, run):
                continue
            await self._stage_to(NodeStage.VALIDATING, f"validating {inp.node} after {rung.value}")
            try:
                run = await self._checks(f"validate after {rung.value}")
            except ActivityError as err:
                raise Escalate(f"the checks could not run: {err.cause or err}") from None
            if run.passed:
                await self._return(f"validated after {rung.value}: " + run.summary())
                return
            await self._not_conclusive(run)
            await self._hold()
        raise Escalate(
            "the ladder is spent: "
            + (", ".join(r.value for r in self._tried) or "no rung applied")
            + f"; last checks {run.summary()}"
        )

    async def _suspect(self, drained: bool, state: str) -> None:
        """A node that job output alone named, in the jobs of several users: never drained on
        that. Fenced and checked; checks that pass, or say nothing (a job never left it), give
        it back as it was; failing checks are Relaunch's own evidence: the node is held and
        climbs the ladder as after a drain. A drain that comes meanwhile (a real fault) makes
        this the drain's lifecycle."""
        inp = self._input
        assert inp is not None
        if drained:  # out of service already: a drain's lifecycle, or someone else's to decide
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._drain_fault() is not None,
                    timeout=DRAIN_FAULT_WAIT,
                    timeout_summary="a drain's fault",
                )
            if await self._as_drained():
                return
            self._outcome = f"{inp.node} is out of service already ({state}): left as it is"
            await self._stage_to(NodeStage.CLOSED, self._outcome)
            return
        await self._stage_to(NodeStage.DIAGNOSING, f"checking suspect {inp.node} (not drained)")
        try:
            run = await self._checks("diagnose", ask=True)
        except Escalate as why:  # the checks were rejected, or nobody decided in time
            await self._release(f"no checks: {why}")
            return
        except ActivityError as err:
            await self._release(f"the checks could not run: {err.cause or err}")
            return
        if run.passed or run.inconclusive:
            verdict = "passed" if run.passed else f"were inconclusive ({run.inconclusive})"
            await self._release(f"suspect cleared: the checks {verdict}: {run.summary()}")
            return
        await self._hold()
        try:
            await self._climb(run)
        except Escalate as why:
            await self._repair(str(why))

    async def _release(self, why: str) -> None:
        """End a suspect's reservation, leaving the node as it was (in service): no approval,
        since nothing changes back but the fence Relaunch put up, and no drain is cleared. A
        drain that came meanwhile makes this the drain's lifecycle instead."""
        inp = self._input
        assert inp is not None
        if await self._as_drained():
            return
        try:
            result = await call(
                LifecycleActivities.release, self._step(), NODE_CHANGE, f"release {inp.node}"
            )
            self._outcome = f"{why}; {result.detail}"
        except ActivityError as err:
            self._outcome = f"{why}; releasing {inp.node} failed: {err.cause or err}"
        await self._stage_to(NodeStage.CLOSED, self._outcome)
        await self._as_drained()  # one that came while the reservation ended

    def _drain_fault(self) -> LifecycleFault | None:
        """The first fault of a drain (not a suspicion), if one has come."""
        return next((f for f in self._faults if not f.suspect), None)

    async def _as_drained(self) -> bool:
        """Where a drain's fault has come to this suspect's lifecycle and the node is out of
        service by it, go on as that drain's lifecycle (its ladder, its repair rules), and say
        so (True). Looked at once: a node found back in service (its checks ran inside the
        reservation) ends as the suspect's does, its reservation ended."""
        inp, fault = self._input, self._drain_fault()
        assert inp is not None
        if fault is None or self._drain_looked:
            return False
        self._drain_looked = True
        await self._record_faults()
        start = await self._look(fault)
        if not start.drained:
            return False
        await self._after_drain(start, f", drained by {fault.incident_id} while a suspect")
        return True

    async def _not_conclusive(self, run: CheckRun) -> None:
        """A run that says nothing about the node (a user's job never left it, or a check failed
        beside a user's process) is never a reason for a rung: the node is held and goes to a
        person (repair) with the reason instead of up the ladder. Raises Escalate for such a
        run."""
        if run.inconclusive:
            await self._hold("checks inconclusive")
            raise Escalate(f"the checks were inconclusive: {run.inconclusive}")

    async def _apply(self, rung: Rung, run: CheckRun) -> bool:
        """Apply one rung (approved first in monitor mode); whether it was applied."""
        inp = self._input
        assert inp is not None
        why = f"{rung.value} {inp.node}: {run.summary()}"
        if rung in CHANGES_NODE and inp.mode is Mode.MONITOR:
            await self._stage_to(NodeStage.REMEDIATING, f"awaiting approval: {why}")
            await self._ask(rung.value, why)
        await self._stage_to(NodeStage.REMEDIATING, why)
        self._tried.append(rung)
        try:
            result = await call(
                LifecycleActivities.apply_rung,
                RungInput(
                    **self._step().model_dump(),
                    rung=rung,
                    reason=f"relaunch: {rung.value} {self._id}",
                ),
                NODE_LONG,
                f"{rung.value} {inp.node}",
            )
        except ActivityError as err:
            raise Escalate(f"{rung.value} failed: {err.cause or err}") from None
        await self._record(
            "rung",
            f"{rung.value}: {result.detail}",
            dedupe=f"rung:{rung.value}",
            data=result.model_dump(mode="json"),
        )
        return result.done

    async def _hold(self, why: str = "checks failed") -> None:
        """Drain the node again while it waits (the reservation stays): its checks failed, or
        a person must approve its return."""
        inp = self._input
        assert inp is not None
        try:
            await call(
                LifecycleActivities.hold,
                HoldInput(**self._step().model_dump(), why=why),
                NODE_CHANGE,
                f"drain {inp.node} again",
            )
        except ActivityError as err:
            raise Escalate(f"could not drain {inp.node} again: {err.cause or err}") from None

    async def _return(self, why: str) -> None:
        """Return the node to service (approved first in monitor mode)."""
        inp = self._input
        assert inp is not None
        if inp.mode is Mode.MONITOR:
            await self._hold("checks passed, return awaits approval")  # out meanwhile
            await self._ask("return", f"return {inp.node} to service: {why}")
        try:
            result = await call(
                LifecycleActivities.return_node, self._step(), NODE_CHANGE, f"return {inp.node}"
            )
        except ActivityError as err:
            raise Escalate(f"returning {inp.node} failed: {err.cause or err}") from None
        if not result.returned:
            raise Escalate(result.detail)
        self._outcome = f"{result.detail}; {why}"
        await self._stage_to(NodeStage.RETURNED, self._outcome)
