"""Activities of node decisions: join one, plan a node's drain, requeue its jobs in batches,
and the short checks a restarted job is verified by.

A node decision (relaunch/workflows/node_decision.py) decides once for every job a failed node
took down: the guard and the drain are the node's, the restarts go to Slurm a batch at a time.
Each job's own recovery joins the decision, waits for it, and verifies its job with short
checks between durable timers, holding no activity slot while the job comes back."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from temporalio import activity

from relaunch.activities.actions import ActionActivities, drain_check
from relaunch.activities.deps import Deps, beat, keeps_heartbeating, typed_errors
from relaunch.activities.evidence import EvidenceActivities, probe_now
from relaunch.detection.planning import node_decision_nodes
from relaunch.models.errors import JobNotFoundError, SchedulerError
from relaunch.models.node_decision import (
    Ahead,
    BatchJob,
    BatchResult,
    Investigation,
    JobOutcome,
    Joined,
    JoinInput,
    JoinRequest,
    LookAgainInput,
    LookAgainResult,
    NodePlan,
    NodePlanInput,
    ReportedJob,
    RequeueBatchInput,
    RequeueBatchResult,
    parse_node_decision_id,
)
from relaunch.models.recovery import (
    ActInput,
    AttributeInput,
    AuditRecord,
    DetectionSource,
    GatherInput,
    GuardDecision,
    Mode,
    Policy,
    RecordEventInput,
    Stage,
    drained_by,
)
from relaunch.models.scheduler import ActionResult, JobState, Node, NodeFlag, NodeState

if TYPE_CHECKING:  # imported where used: the workflow modules import the activities
    from relaunch.workflows.node_client import NodeDecisionSignals


@dataclass(frozen=True)
class Conviction:
    """What convicts a node for its decision's plan."""

    reason: str
    partition: str
    mode: Mode
    unreachable: bool
    remedy: str | None


_RESTARTS = re.compile(r"\brestarts=(\d+)")
# The note of a requeue found done once past what the recovery saw, with no row of it.
_BEFORE = (
    "requeued once since the recovery began (an earlier attempt of this step, or a node "
    "decision ahead of the join)"
)


class NodeActivities:
    def __init__(self, deps: Deps, evidence: EvidenceActivities | None = None) -> None:
        self.deps = deps
        # investigate's first two steps (tests hand in their own)
        self.evidence = evidence or EvidenceActivities(deps)
        # Each node's decision last joined in this process: the next join starts there.
        self._signals: NodeDecisionSignals | None = None

    # ------------------------------------------------------------------ investigate

    @activity.defn(name="investigate")
    @typed_errors
    @keeps_heartbeating
    async def investigate(self, inp: GatherInput) -> Investigation:
        """gather_evidence, attribute and join_node_decisions in one activity: a recovery's
        way to its node decision takes no workflow task of its own. When a rack fails, the
        workflow tasks of hundreds of recoveries queue up; the first recovery to convict a node
        reaches its decision (and the drain) without waiting behind them."""
        evidence = await self.evidence.gather_evidence(inp)
        verdict = await self.evidence.attribute(
            AttributeInput(incident_id=inp.incident_id, bundle_path=evidence.bundle_path)
        )
        joined = await self.join_node_decisions(
            JoinInput(
                incident_id=inp.incident_id,
                cluster=inp.cluster,
                verdict=verdict,
                evidence=evidence,
                policy=inp.policy or self.deps.config.policy,
            )
        )
        return Investigation(evidence=evidence, verdict=verdict, joined=joined)

    # ------------------------------------------------------------------ join

    @typed_errors
    async def join_node_decisions(self, inp: JoinInput) -> Joined:
        """Join (signal-with-start) the running decision of each node in ``inp.nodes``, starting
        the node's next decision where none runs, and record the link in the job's incident."""
        nodes = node_decision_nodes(inp.verdict, inp.evidence, inp.policy)
        if not nodes:
            return Joined()
        policy = await self.deps.policy(inp.policy)
        client = self.deps.temporal
        if client is None:
            raise SchedulerError("this worker has no Temporal client to join node decisions")
        job, verdict = inp.evidence.job, inp.verdict
        base = JoinRequest(
            recovery_id=inp.incident_id,
            job_id=job.job_id,
            partition=job.partition,
            expected_restart_count=job.restart_count,
            max_restarts=job.max_restarts,
            category=verdict.category,
            confidence=verdict.confidence,
            summary=verdict.summary[:500],
            exclude_nodes=sorted(set(verdict.culprit_nodes) & set(job.nodes)),
            requeue_by=nodes[0],
            mode=policy.mode_for(job.partition, verdict.category),
        )
        joined: dict[str, str] = {}
        for node in nodes:
            request = base.model_copy(
                update={
                    "unreachable": node in inp.evidence.unreachable_nodes,
                    "remedy": verdict.remedies.get(node),
                }
            )
            joined[node] = await self._join_one(inp.cluster, node, request, inp.policy)
        ids = ", ".join(f"{n}: {d}" for n, d in joined.items())
        await self.deps.audit_row(
            inp.incident_id,
            "node_decision",
            f"joined the node decision of {ids}; {joined[nodes[0]]} requeues job {job.job_id}",
            dedupe="node_decision",
            nodes=list(joined),
            data={"decisions": joined, "requeue_by": joined[nodes[0]]},
        )
        return Joined(decisions=joined, requeue_by=joined[nodes[0]])

    async def _join_one(self, cluster: str, node: str, request: JoinRequest, policy: Policy) -> str:
        client = self.deps.temporal
        assert client is not None
        if self._signals is None or self._signals.client is not client:
            from relaunch.workflows.node_client import NodeDecisionSignals

            self._signals = NodeDecisionSignals(client)
        return await self._signals.join(cluster, node, policy, request)

    # ------------------------------------------------------------------ plan

    @activity.defn(name="plan_node")
    @typed_errors
    @keeps_heartbeating
    async def plan_node(self, inp: NodePlanInput) -> NodePlan:
        """The node's drain under the blast-radius guard, on a fresh read of the nodes. From
        the first job that joined, or from the watcher's report when that came first: then the
        node is probed again, and one that answers is not convicted on the report. Records the
        decision's planning stage first; where no person need approve, isolates the node too,
        and once it is isolated on a report a fresh probe confirmed, requeues the report's jobs
        ahead of their joins."""
        policy = inp.policy
        await self._stage_row(inp, Stage.PLANNING, inp.stage_summary)
        since = datetime.now(UTC) - timedelta(hours=policy.drain_window_hours)
        # Read without the cluster's drain lock: the plan is what a person approves, and
        # `isolate` re-checks the guard under the lock on fresh state before it drains. The
        # decisions of a rack's nodes then wait for each other only while they drain.
        nodes, drained = await asyncio.gather(
            self.deps.scheduler.list_nodes(), self.deps.audit.drained_nodes(inp.cluster, since)
        )
        node = next((n for n in nodes if n.name == inp.node), None)
        conviction = await self._conviction(inp, node)
        if conviction is None:
            return NodePlan(
                decision_id=inp.decision_id,
                node=inp.node,
                mode=Mode.MONITOR,
                drain=False,
                job_id="",
                convicted=False,
            )
        check = drain_check(
            policy, nodes, drained, [inp.node], partition=conviction.partition, since=since
        )
        # Out of service already, unless by this decision's own drain: a retry after a worker
        # died between the drain and the lifecycle's start drains again (a no-op) and so
        # still hands the node to its lifecycle.
        out = node is not None and node.drain_flag and not drained_by(node.reason, inp.decision_id)
        reasons = [conviction.reason[:500]]
        guards: list[GuardDecision] = []
        needs_override = False
        if out and node is not None:
            reasons.append(f"{inp.node} is already out of service ({node.display_state})")
        else:
            guards.append(check.decision)
            if not check.decision.allowed:
                needs_override = True
                reasons.append(
                    "blast-radius guard refused the drain: it runs only on an operator's override"
                )
        if conviction.remedy:
            reasons.append(f"remedy by the Xid catalogue: {inp.node} {conviction.remedy}")
        plan = NodePlan(
            decision_id=inp.decision_id,
            node=inp.node,
            mode=conviction.mode,
            drain=not out,
            fence=conviction.unreachable and not out,
            guards=guards,
            needs_override=needs_override,
            reasons=reasons,
            remedy=conviction.remedy,
            category=inp.first.category
            if inp.first
            else inp.report.category
            if inp.report
            else None,
            job_id=inp.first.job_id if inp.first else "",
            partition=None if inp.first else conviction.partition,
        )
        first = {"first": inp.first.model_dump(mode="json")} if inp.first else {}
        report = {"report": inp.report.model_dump(mode="json")} if inp.report else {}
        await self.deps.audit_row(
            inp.decision_id,
            "plan",
            f"{'drain ' + inp.node if plan.drain else 'nothing to drain'} ({plan.mode.value}), "
            f"then requeue its jobs: {'; '.join(reasons)}",
            dedupe="plan",
            nodes=[inp.node],
            # The plan row's usual shape (action, drain_nodes, …: what the console and the
            # notifications read), with the node plan and what convicted the node.
            data={
                **plan.isolation().model_dump(mode="json"),
                "node_plan": plan.model_dump(mode="json"),
                **first,
                **report,
            },
        )
        await self.deps.audit_guards(inp.decision_id, guards)
        if plan.mode is Mode.AUTONOMOUS and not plan.needs_override:
            if plan.drain or plan.fence:
                await self._stage_row(inp, Stage.ISOLATING, f"isolating {inp.node}")
            act = ActInput(incident_id=inp.decision_id, cluster=inp.cluster, plan=plan.isolation())
            isolated = await ActionActivities(self.deps).isolate(act)
            plan = plan.model_copy(update={"isolated": isolated})
            told = inp.report
            if isolated.ok and conviction.unreachable and told:
                # Drained and fenced, its slurmd silent to a fresh probe: Slurm ends every
                # job there. Requeue the watched ones now, not as their recoveries join.
                ahead = await self._requeue_ahead(inp, told.running)
                plan = plan.model_copy(update={"ahead": ahead})
        return plan

    @activity.defn(name="look_again")
    @typed_errors
    @keeps_heartbeating
    async def look_again(self, inp: LookAgainInput) -> LookAgainResult:
        """A second look at a drained node whose reported jobs were not requeued ahead (see
        `LookAgainInput`): on a fresh read (still out of service) and a fresh probe (slurmd
        silent), fence it and requeue ahead the report's jobs that have not joined. A node
        someone returned, or whose slurmd answers, may still run its jobs: nothing is done."""
        await self.deps.unless_paused(inp.decision_id, "look_again")
        nodes = await self.deps.scheduler.list_nodes()
        node = next((n for n in nodes if n.name == inp.node), None)
        if node is None or not node.drain_flag:
            await self._not_ahead(
                inp,
                "Slurm does not list it"
                if node is None
                else f"it is back in service ({node.display_state})",
            )
            return LookAgainResult(looked="back")
        probed = await probe_now(self.deps.prober(), [node])
        if inp.node not in probed.silent:
            if inp.last:
                alive = probed.alive.get(inp.node)
                await self._not_ahead(inp, alive or "its slurmd still answers a fresh probe")
            return LookAgainResult(looked="answers")
        if node.state is not NodeState.DOWN:
            fence = inp.plan.model_copy(update={"drain": False, "fence": True, "guards": []})
            act = ActInput(incident_id=inp.decision_id, cluster=inp.cluster, plan=fence.isolation())
            fenced = await ActionActivities(self.deps).isolate(act)
            if not fenced.ok:  # the guard, re-checked: nothing more is done on this node
                return LookAgainResult(looked="back")
        joined = set(inp.joined)
        jobs = [j for j in inp.report.running if j.job_id not in joined]
        return LookAgainResult(
            looked="silent", ahead=await self._requeue_ahead(inp, jobs, second_look=True)
        )

    async def _not_ahead(self, inp: LookAgainInput, why: str) -> None:
        await self.deps.audit_row(
            inp.decision_id,
            "node_report",
            f"no requeue ahead of the joins on {inp.node}: {why}; its jobs are requeued as "
            "their recoveries join",
            dedupe="node_report:look_again",
            nodes=[inp.node],
            data={"report": inp.report.model_dump(mode="json"), "look_again": True},
        )

    async def _requeue_ahead(
        self,
        inp: NodePlanInput | LookAgainInput,
        jobs: list[ReportedJob],
        *,
        second_look: bool = False,
    ) -> list[Ahead]:
        """Requeue the report's jobs (each within its restart budget) with one batch, ahead of
        their recoveries' joins; one row in the decision's incident. Each job's own restart row
        is written when its recovery joins (`requeue_batch`), dated by the requeue."""
        policy = inp.policy
        if not jobs:
            return []
        started = time.monotonic()
        beat(f"requeue {len(jobs)} jobs ahead")
        budget_since = datetime.now(UTC) - timedelta(hours=policy.budget_window_hours)
        counts = await self.deps.audit.restarts_by_job(
            inp.cluster, [j.job_id for j in jobs], budget_since
        )
        cancelled = await self._cancelled([j.job_id for j in jobs])
        go: dict[str, int] = {}
        for job in jobs:
            ever, recent = counts[job.job_id]
            if job.job_id in cancelled:
                continue  # someone cancelled it: its recovery is told so when it joins
            if _budget_used(job.restart_count, ever, recent) < _budget(policy, job.max_restarts):
                go[job.job_id] = job.restart_count
            # else: its recovery joins, and the batch's budget check holds it, with a row
        done = await self.deps.scheduler.requeue_jobs(go) if go else {}
        at = datetime.now(UTC)
        ahead: list[Ahead] = []
        for job_id, result in done.items():
            if _requeued_before(result, go[job_id]):  # an earlier attempt of this step did it
                result = result.model_copy(
                    update={"changed": True, "note": "requeued by an earlier attempt of this step"}
                )
            if result.changed:
                ahead.append(
                    Ahead(job_id=job_id, expected_restart_count=go[job_id], result=result, at=at)
                )
        took = time.monotonic() - started
        outcomes = {
            job_id: ("requeued" if r.changed else r.note or "unchanged")
            for job_id, r in done.items()
        }
        left = [j.job_id for j in jobs if j.job_id not in go]
        await self.deps.audit_row(
            inp.decision_id,
            "requeue_batch",
            f"batch 0: {len(ahead)} of {len(jobs)} jobs requeued in {took:.1f} s, ahead of "
            f"their recoveries' joins ({inp.node} isolated, its slurmd silent to a fresh probe"
            + ("; found so on a second look" if second_look else "")
            + ")"
            + (f"; {len(left)} left to their joins (cancelled, or budget spent)" if left else ""),
            dedupe=f"{inp.decision_id}:requeue_batch:0",
            nodes=[inp.node],
            data={
                "batch": 0,
                "ahead": True,
                **({"second_look": True} if second_look else {}),
                "jobs": [j.job_id for j in jobs],
                "outcomes": outcomes,
                "left": left,
                "took_s": round(took, 3),
            },
        )
        return ahead

    async def _stage_row(self, inp: NodePlanInput, stage: Stage, summary: str) -> None:
        """The decision's stage row, as its workflow writes it (`_stage_to`)."""
        parsed = parse_node_decision_id(inp.decision_id)
        await self.evidence.record_event(
            RecordEventInput(
                incident_id=inp.decision_id,
                cluster=inp.cluster,
                job_id="",
                attempt=parsed[2] if parsed else 0,
                kind="stage",
                summary=summary,
                stage=stage.value,
                nodes=[inp.node],
                dedupe=f"stage:{stage.value}",
            )
        )

    async def _conviction(self, inp: NodePlanInput, node: Node | None) -> Conviction | None:
        """What convicts the node: the first job's verdict, or the watcher's report confirmed by
        a fresh probe (None, with a `node_report` row saying why, when the node answers)."""
        first, report = inp.first, inp.report
        policy = await self.deps.policy(inp.policy)
        if first is not None:
            return Conviction(
                reason=f"{first.category.value} on {inp.node}, convicted by trusted evidence in "
                f"{first.recovery_id} (job {first.job_id}): {first.summary}",
                partition=first.partition,
                mode=first.mode,
                unreachable=first.unreachable,
                remedy=first.remedy,
            )
        if report is None:
            raise ValueError("plan_node needs the first join or the watcher's report")
        probed = await probe_now(self.deps.prober(), [node] if node else [])
        unreachable = inp.node in probed.silent
        if node is None or (report.source is DetectionSource.PROBE and not unreachable):
            seen = "unreachable" if report.source is DetectionSource.PROBE else "failed"
            alive = probed.alive.get(inp.node)
            but = (
                "Slurm does not list it" if node is None else alive or "a fresh probe had an answer"
            )
            await self.deps.audit_row(
                inp.decision_id,
                "node_report",
                f"the watcher reported {inp.node} {seen} ({report.text}), but {but}"
                ": not convicted on the report; the verdicts of its jobs decide",
                dedupe="node_report",
                nodes=[inp.node],
                data={
                    "report": report.model_dump(mode="json"),
                    "convicted": False,
                    **({"probe_alive": alive} if alive else {}),
                },
            )
            return None
        if report.source is DetectionSource.PROBE:
            why = f"Relaunch's own probes: {report.text}; a fresh probe had no answer either"
        else:  # the node's own kernel log, read by the watcher: an Xid the catalogue drains for
            why = f"its own kernel log: {report.text}" + (
                "; its slurmd does not answer a fresh probe" if unreachable else ""
            )
        # Autonomous only where every partition of the node's watched jobs is.
        parts = report.partitions or [""]
        return Conviction(
            reason=f"{report.category.value} on {inp.node}, convicted by {why} "
            f"({report.jobs} watched jobs there)",
            partition=parts[0],
            mode=Mode.AUTONOMOUS
            if policy.acts_alone(report.partitions, report.category)
            else Mode.MONITOR,
            unreachable=unreachable,
            remedy=report.remedy,
        )

    # ------------------------------------------------------------------ requeue

    @activity.defn(name="requeue_batch")
    @typed_errors
    @keeps_heartbeating
    async def requeue_batch(self, inp: RequeueBatchInput) -> RequeueBatchResult:
        """Requeue a batch of the decision's jobs with one `scontrol requeue` (verified with
        one listing), each within its restart budget; one audit row in each job's incident."""
        await self.deps.unless_paused(inp.decision_id, "requeue_batch")
        started = time.monotonic()
        beat(f"batch {inp.batch}: {len(inp.jobs)} jobs")
        results: dict[str, BatchResult] = {}
        rows: list[tuple[AuditRecord, str | None]] = []
        for job in inp.jobs:
            if job.ahead is not None:  # requeued by plan_node: only its row is left to write
                results[job.recovery_id], row = self._ahead_row(inp, job, job.ahead)
                rows.append(row)
        rest = [j for j in inp.jobs if j.ahead is None]
        if rest:
            back = await self._back_in_service(inp)
            if back is not None:
                # Someone resumed the node since the decision took it out: these jobs' failure
                # is a new one, which this decision (and its approval) does not cover.
                await self.deps.audit.record_many(rows)
                return RequeueBatchResult(results=list(results.values()), back_in_service=back)
            await self._requeue_rest(inp, rest, results, rows)
        took = time.monotonic() - started
        ahead = len(inp.jobs) - len(rest)
        requeued = sum(1 for r in results.values() if r.changed) - ahead
        rows.append(
            (
                self._row(
                    inp.decision_id,
                    "requeue_batch",
                    f"batch {inp.batch}: {requeued} of {len(rest)} jobs requeued in {took:.1f} s"
                    + (f"; {ahead} joined that batch 0 requeued ahead" if ahead else ""),
                    {
                        "batch": inp.batch,
                        "jobs": [j.job_id for j in inp.jobs],
                        "requeued_ahead": [j.job_id for j in inp.jobs if j.ahead is not None],
                        "outcomes": {r.job_id: r.outcome.value for r in results.values()},
                        "took_s": round(took, 3),
                    },
                ),
                f"{inp.decision_id}:requeue_batch:{inp.batch}",
            )
        )
        await self.deps.audit.record_many(rows)
        return RequeueBatchResult(results=list(results.values()))

    def _ahead_row(
        self, inp: RequeueBatchInput, job: BatchJob, ahead: Ahead
    ) -> tuple[BatchResult, tuple[AuditRecord, str | None]]:
        """The result and the job's restart row for a job plan_node requeued ahead of its join:
        the row is dated when Slurm requeued it."""
        result = ahead.result
        detail = f"requeued ahead of the join by node decision {inp.decision_id} (batch 0)"
        row = self._row(
            job.recovery_id,
            "action",
            f"{result.action} {result.target}: done ({detail})",
            {
                "step": "restart",
                **result.model_dump(mode="json"),
                "node_decision": inp.decision_id,
                "batch": 0,
                "ahead": True,
            },
        ).model_copy(update={"at": ahead.at})
        key = f"{job.recovery_id}:action:restart:{result.action}:{result.target}"
        done = BatchResult(
            recovery_id=job.recovery_id,
            job_id=job.job_id,
            outcome=JobOutcome.REQUEUED,
            changed=True,
            detail=detail,
        )
        return done, (row, key)

    async def _back_in_service(self, inp: RequeueBatchInput) -> str | None:
        """The node's state when someone put it back in service after the decision took it out
        (``out_of_service``); None otherwise."""
        if not inp.out_of_service:
            return None
        nodes = await self.deps.scheduler.list_nodes()
        node = next((n for n in nodes if n.name == inp.node), None)
        # A node its lifecycle checks is out of service still: its maintenance reservation
        # keeps every job off it (see relaunch/workflows/lifecycle.py).
        in_maintenance = node is not None and NodeFlag.MAINTENANCE in node.flags
        if node is not None and not node.drain_flag and node.responding and not in_maintenance:
            return node.display_state
        return None

    async def _requeue_rest(
        self,
        inp: RequeueBatchInput,
        jobs: list[BatchJob],
        results: dict[str, BatchResult],
        rows: list[tuple[AuditRecord, str | None]],
    ) -> None:
        """Requeue ``jobs`` (none requeued ahead) with one `scontrol requeue`, each within its
        restart budget, adding each one's result and audit row."""
        policy = inp.policy
        since = datetime.now(UTC) - timedelta(hours=policy.budget_window_hours)
        counts = await self.deps.audit.restarts_by_job(inp.cluster, [j.job_id for j in jobs], since)
        go: dict[str, int] = {}
        cancelled = await self._cancelled([j.job_id for j in jobs])
        for job in jobs:
            if job.job_id in cancelled:
                # Someone cancelled the job after its recovery began (while the decision
                # awaited approval, say): a requeue would undo their decision.
                results[job.recovery_id] = BatchResult(
                    recovery_id=job.recovery_id,
                    job_id=job.job_id,
                    outcome=JobOutcome.CANCELLED,
                    detail=f"job {job.job_id} was cancelled after this recovery began; "
                    "it is not restarted",
                )
                continue
            ever, recent = counts[job.job_id]
            used = _budget_used(job.expected_restart_count, ever, recent)
            budget = _budget(policy, job.max_restarts)
            if used >= budget:
                detail = (
                    f"restart_budget: {used} of {budget} restarts used in "
                    f"{policy.budget_window_hours:g} h"
                )
                results[job.recovery_id] = BatchResult(
                    recovery_id=job.recovery_id,
                    job_id=job.job_id,
                    outcome=JobOutcome.HOLD,
                    detail=detail,
                )
                rows.append(
                    (
                        self._row(
                            job.recovery_id,
                            "guard",
                            f"restart_budget: REFUSED — {detail}",
                            {"guard": "restart_budget", "allowed": False, "detail": detail},
                        ),
                        f"{job.recovery_id}:guard:restart_budget",
                    )
                )
            else:
                go[job.job_id] = job.expected_restart_count
        done = await self.deps.scheduler.requeue_jobs(go) if go else {}
        for job in jobs:
            if job.job_id not in done:
                continue
            result = done[job.job_id]
            if _requeued_before(result, job.expected_restart_count):
                # Requeued once since the decision saw it, and no row says so: an earlier
                # attempt of this batch that died before recording it (a worker killed
                # mid-batch), or, for a job that blamed two nodes, the other node's decision
                # ahead of the join. The trail, and the restart budget that reads it, count it.
                result = result.model_copy(update={"changed": True, "note": _BEFORE})
            ok = result.changed or result.note in {"already requeued", "already pending"}
            results[job.recovery_id] = BatchResult(
                recovery_id=job.recovery_id,
                job_id=job.job_id,
                outcome=JobOutcome.REQUEUED if ok else JobOutcome.FAILED,
                changed=result.changed,
                detail=(result.note or "requeued")
                + f" by node decision {inp.decision_id} (batch {inp.batch})",
            )
            verb = "done" if result.changed else "unchanged"
            verb += f" ({result.note})" if result.note else ""
            rows.append(
                (
                    self._row(
                        job.recovery_id,
                        "action",
                        f"{result.action} {result.target}: {verb} "
                        f"(node decision {inp.decision_id}, batch {inp.batch})",
                        {
                            "step": "restart",
                            **result.model_dump(mode="json"),
                            "node_decision": inp.decision_id,
                            "batch": inp.batch,
                        },
                    ),
                    f"{job.recovery_id}:action:restart:{result.action}:{result.target}",
                )
            )

    async def _cancelled(self, job_ids: list[str]) -> set[str]:
        """The batch's jobs Slurm lists CANCELLED (one shared listing for all of them)."""
        sched = self.deps.scheduler

        async def state(job_id: str) -> JobState | None:
            try:
                return (await sched.get_job_brief(job_id)).state
            except JobNotFoundError:
                return None

        states = await asyncio.gather(*(state(j) for j in job_ids))
        return {j for j, s in zip(job_ids, states, strict=True) if s is JobState.CANCELLED}

    def _row(
        self, incident_id: str, kind: str, summary: str, data: dict[str, object]
    ) -> AuditRecord:
        return AuditRecord(
            incident_id=incident_id,
            kind=kind,
            at=datetime.now(UTC),
            summary=summary,
            data=data,
        )


def _budget_used(restart_count: int, ever: int, recent: int) -> int:
    """The restarts a job has used of its budget: Relaunch's in the budget's window (``recent``)
    and the ones Slurm counts that Relaunch did not do (``restart_count`` beyond ``ever``)."""
    return max(0, restart_count - ever) + recent


def _budget(policy: Policy, max_restarts: int | None) -> int:
    """The job's restart budget: the policy's, or less where the job asks for fewer."""
    return (
        policy.restart_budget if max_restarts is None else min(policy.restart_budget, max_restarts)
    )


def _requeued_before(result: ActionResult, expected: int) -> bool:
    """Whether the batch found the job requeued exactly once past what its recovery saw (the
    adapter's ``after`` text says ``restarts=N``)."""
    if result.changed or result.note != "already requeued":
        return False
    seen = _RESTARTS.search(result.after)
    return seen is not None and int(seen[1]) == expected + 1
