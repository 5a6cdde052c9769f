"""Node decisions on a Temporal dev server: the real RecoveryWorkflow and NodeDecisionWorkflow,
the real node and action activities over an in-memory cluster (tests/support/fake_scheduler.py)
and audit trail; only evidence and attribution are canned (every job's verdict convicts its
node on its kernel log). What an operator would notice: a node drained once however many jobs
it took down, the jobs requeued in batches, one approval for all of them, a refused guard
holding every job, and histories that replay."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.activities.node import NodeActivities
from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.detection.planning import node_decision_nodes
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import InvalidNameError
from relaunch.models.node_decision import (
    BatchJob,
    JobOutcome,
    JoinRequest,
    NodeDecisionInput,
    NodePlanInput,
    NodeReport,
    ReportedJob,
    RequeueBatchInput,
    node_decision_id,
    node_task_queue,
)
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    Approval,
    AttributeInput,
    AuditRecord,
    Category,
    DetectionSource,
    EvidenceSummary,
    GatherInput,
    JobSnapshot,
    Mode,
    PlanInput,
    Policy,
    RecordDetectionInput,
    RecordEventInput,
    RecoveryInput,
    RecoveryStatus,
    RestartMethod,
    Stage,
    Verdict,
    recovery_workflow_id,
)
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from relaunch.workers.worker import WORKFLOW_RUNNER
from relaunch.workflows import node_look, recovery_client
from relaunch.workflows.attributes import (
    SA_AWAITING,
    SA_CATEGORY,
    SA_CLUSTER,
    SA_JOB,
    SA_MODE,
    SA_NODES,
    SA_STAGE,
)
from relaunch.workflows.node_client import DECISION_TASK_TIMEOUT, NodeDecisionSignals
from relaunch.workflows.node_decision import NodeDecisionWorkflow
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.support.fake_scheduler import FakeScheduler
from tests.unit.test_activities import MemoryAudit

TEMPORAL = Path(sys.executable).parent / "temporal"
HISTORIES = Path(__file__).resolve().parents[1] / "histories"
NODES = [f"n{i}" for i in range(1, 21)]
pytestmark = pytest.mark.skipif(
    not TEMPORAL.is_file() and shutil.which("temporal") is None,
    reason="no Temporal CLI (dev server) on this machine",
)


class Audit(MemoryAudit):
    """MemoryAudit plus what node decisions use: batch rows and restart counts."""

    async def record_many(self, rows: list[tuple[AuditRecord, str | None]]) -> int:
        return sum([await self.record(r, dedupe_key=k) for r, k in rows])

    async def restarts_by_job(
        self, cluster: str, job_ids: list[str], since: datetime
    ) -> dict[str, tuple[int, int]]:
        return {j: (0, 0) for j in job_ids}

    async def ensure_incident(
        self, incident_id: str, cluster: str, job_id: str, attempt: int
    ) -> None:
        return None

    def of(self, incident: str, kind: str) -> list[StoredEvent]:
        return [r for r in self.rows if r.incident_id == incident and r.kind == kind]


@dataclass
class Rig:
    client: Client
    queue: str
    cluster: str
    sched: FakeScheduler
    audit: Audit
    origin: dict[str, list[str]] = field(default_factory=dict)  # each job's first nodes
    steps: list[Any] = field(default_factory=list)  # the activities the workers run


class Evidence:
    """The evidence steps, canned: each job's verdict convicts its first node on its kernel log
    (Xid 79); the audit rows go to the in-memory trail."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.nodes: dict[str, list[str]] = {}  # each incident's evidence: its attempt's nodes

    @activity.defn(name="record_detection")
    async def record_detection(self, inp: RecordDetectionInput) -> bool:
        return True

    @activity.defn(name="record_event")
    async def record_event(self, inp: RecordEventInput) -> bool:
        return await self.rig.audit.record(
            AuditRecord(
                incident_id=inp.incident_id,
                kind=inp.kind,
                at=datetime.now(UTC),
                actor=inp.actor,
                stage=inp.stage,
                nodes=inp.nodes,
                summary=inp.summary,
                data=inp.data,
            ),
            dedupe_key=f"{inp.incident_id}:{inp.dedupe}" if inp.dedupe else None,
        )

    async def gather_evidence(self, inp: GatherInput) -> EvidenceSummary:
        job = await self.rig.sched.get_job(inp.job_id)
        if job.restart_count > inp.attempt:  # requeued since: the attempt's, as the real one
            job = job.model_copy(
                update={"nodes": self.rig.origin[job.job_id], "restart_count": inp.attempt}
            )
        snap = JobSnapshot(
            job_id=job.job_id,
            state=job.state.value,
            partition=job.partition,
            nodes=job.nodes,
            restart_count=job.restart_count,
        )
        self.nodes[inp.incident_id] = job.nodes
        return EvidenceSummary(incident_id=inp.incident_id, bundle_path=inp.incident_id, job=snap)

    async def attribute(self, inp: AttributeInput) -> Verdict:
        node = self.nodes[inp.bundle_path][0]
        return Verdict(
            category=Category.GPU_HARDWARE,
            culprit_nodes=[node],
            confidence=0.95,
            action=Action.ISOLATE_AND_RESTART,
            summary=f"Xid 79 on {node}",
            corroboration={node: ["kernel_log"]},
            remedies={node: "reboot"},
        )

    @activity.defn(name="plan")
    async def plan(self, inp: PlanInput) -> ActionPlan:
        raise AssertionError("a recovery that joined a node decision plans nothing itself")


async def run_scheduler(sched: FakeScheduler) -> None:
    """Slurm's part: a requeued (pending, not held) job starts again on a healthy node."""
    while True:
        await asyncio.sleep(0.2)
        for job in await sched.list_jobs():
            if job.state is JobState.PENDING and not job.held:
                sched.set_job(job.job_id, state=JobState.RUNNING, nodes=["n20"], reason="")


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(TEMPORAL) if TEMPORAL.is_file() else shutil.which("temporal"),
        search_attributes=[
            SA_CLUSTER,
            SA_JOB,
            SA_CATEGORY,
            SA_STAGE,
            SA_MODE,
            SA_NODES,
            SA_AWAITING,
        ],
    )
    cluster = f"nd{uuid.uuid4().hex[:6]}"
    sched = FakeScheduler(
        nodes=[Node(name=n, state=NodeState.IDLE, partitions=["gpu"]) for n in NODES]
    )
    audit = Audit()
    rig = Rig(env.client, f"relaunch-{cluster}", cluster, sched, audit)
    config = ClusterConfig(name=cluster, database_url="postgresql://unused", bundle_dir="/tmp")
    deps = Deps(config=config, scheduler=sched, audit=cast(AuditStore, audit), temporal=env.client)
    evidence = Evidence(rig)
    actions = ActionActivities(deps)
    node = NodeActivities(deps, evidence=cast(EvidenceActivities, evidence))
    slurm = asyncio.create_task(run_scheduler(sched))
    try:
        steps: list[Any] = [
            evidence.record_detection,
            evidence.record_event,
            evidence.plan,
            actions.isolate,
            actions.hold,
            node.investigate,
            node.plan_node,
            node.requeue_batch,
            node.look_again,
            actions.verify_check,
        ]
        rig.steps = steps
        workers = [
            Worker(
                env.client,
                task_queue=queue,
                workflows=[RecoveryWorkflow, NodeDecisionWorkflow],
                workflow_runner=WORKFLOW_RUNNER,  # as relaunch worker runs them
                activities=steps,
            )
            for queue in (rig.queue, node_task_queue(cluster))
        ]
        async with workers[0], workers[1]:
            yield rig
    finally:
        slurm.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slurm
        await env.shutdown()


def jobs_on(rig: Rig, node: str, count: int, first: int) -> list[str]:
    ids = [str(first + i) for i in range(count)]
    for job_id in ids:
        rig.origin[job_id] = [node]
        rig.sched.jobs[job_id] = Job(
            job_id=job_id,
            user="alice",
            partition="gpu",
            state=JobState.RUNNING,
            nodes=[node],
            node_count=1,
            requeue_allowed=True,
        )
    return ids


async def start(
    rig: Rig, job_ids: list[str], policy: Policy
) -> list[WorkflowHandle[RecoveryWorkflow, RecoveryStatus]]:
    return list(
        await asyncio.gather(
            *(
                rig.client.start_workflow(
                    RecoveryWorkflow.run,
                    RecoveryInput(cluster=rig.cluster, job_id=j, attempt=0, policy=policy),
                    id=recovery_workflow_id(rig.cluster, j, 0),
                    task_queue=rig.queue,
                )
                for j in job_ids
            )
        )
    )


async def until_all(
    handles: list[WorkflowHandle[RecoveryWorkflow, RecoveryStatus]],
    ok: Any,
    what: str,
    timeout: float = 60,
) -> list[RecoveryStatus]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        statuses = [await h.query(RecoveryWorkflow.status) for h in handles]
        if all(ok(s) for s in statuses):
            return statuses
        if loop.time() > deadline:
            raise AssertionError(f"never reached: {what} (e.g. {statuses[0]})")
        await asyncio.sleep(0.2)


def drains(rig: Rig, node: str) -> list[StoredEvent]:
    return [
        r
        for r in rig.audit.kinds("action")
        if r.data.get("step") == "drain" and r.data.get("target") == node and r.data["changed"]
    ]


async def replays(client: Client, workflow_id: str, keep_as: str | None = None) -> None:
    """The history replays against today's workflows; kept for tests/unit/test_replay.py
    with RELAUNCH_RECORD_HISTORIES=1."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(
        workflows=[RecoveryWorkflow, NodeDecisionWorkflow],
        workflow_runner=WORKFLOW_RUNNER,
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(history)
    if keep_as and os.environ.get("RELAUNCH_RECORD_HISTORIES") == "1":
        (HISTORIES / f"{keep_as}.json").write_text(history.to_json())


async def test_a_rack_of_jobs_one_drain_per_node_and_requeues_in_batches(rig: Rig) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    on_n1, on_n2 = jobs_on(rig, "n1", 24, 100), jobs_on(rig, "n2", 6, 200)
    handles = await start(rig, on_n1 + on_n2, policy)
    done = await until_all(handles, lambda s: s.stage is Stage.DONE, "every recovery done")

    d1, d2 = node_decision_id(rig.cluster, "n1", 1), node_decision_id(rig.cluster, "n2", 1)
    assert {s.node_decision for s in done[:24]} == {d1}
    assert {s.node_decision for s in done[24:]} == {d2}
    # Each node drained once, by its decision, whatever number of jobs it took down.
    assert [r.incident_id for r in drains(rig, "n1")] == [d1]
    assert [r.incident_id for r in drains(rig, "n2")] == [d2]
    assert sorted(rig.sched.drains) == ["n1", "n2"]
    # Every job requeued exactly once, in a few bulk calls rather than one call a job.
    assert sorted(rig.sched.requeues) == sorted(on_n1 + on_n2)
    assert all(rig.sched.jobs[j].restart_count == 1 for j in on_n1 + on_n2)
    assert rig.sched.calls_to("requeue_job") == []
    assert 2 <= len(rig.sched.calls_to("requeue_jobs")) < 30
    # Each job's trail links the decision and holds its restart; the decision's, its batches.
    for s in done:
        restart = [r for r in rig.audit.of(s.incident_id, "action")]
        assert [(r.data["step"], r.data["node_decision"]) for r in restart] == [
            ("restart", s.node_decision)
        ]
        assert rig.audit.of(s.incident_id, "node_decision")
        assert rig.audit.of(s.incident_id, "verify")
    batches = rig.audit.of(d1, "requeue_batch")
    assert sum(len(cast(list[str], b.data["jobs"])) for b in batches) == 24
    # The decision stays open for late joiners, and says what it covers.
    node = await rig.client.get_workflow_handle(d1).query(NodeDecisionWorkflow.status)
    assert node.stage is Stage.ACTING and len(node.covers) == 24 and node.requeued == 24
    await replays(rig.client, handles[0].id, "node_decision_joined_autonomous")
    await replays(rig.client, d1, "node_decision_requeued")


async def test_monitor_one_approval_through_any_job_covers_every_job(rig: Rig) -> None:
    policy = Policy(mode=Mode.MONITOR, drain_cap=10, drain_share=1.0)
    ids = jobs_on(rig, "n3", 5, 300)
    handles = await start(rig, ids, policy)
    waiting = await until_all(handles, lambda s: s.awaiting_approval, "awaiting approval")
    decision = node_decision_id(rig.cluster, "n3", 1)
    assert {s.node_decision for s in waiting} == {decision}
    assert {s.stage for s in waiting} == {Stage.ISOLATING}
    assert not rig.sched.nodes["n3"].drain_flag and rig.sched.requeues == []
    # One notification-worthy stage row: the decision's, not one per job.
    awaiting_rows = [r for r in rig.audit.kinds("stage") if r.stage == "awaiting_approval"]
    assert [r.incident_id for r in awaiting_rows] == [decision]

    # Approving one job's recovery (as `relaunch approve` does) approves the node's decision.
    decided = await recovery_client.decide(rig.client, handles[2].id, "approve", Approval(by="ana"))
    assert decided.covers == 5 and decided.node_decision == decision
    done = await until_all(handles, lambda s: s.stage is Stage.DONE, "every recovery done")
    assert len(done) == 5 and rig.sched.nodes["n3"].drain_flag
    assert sorted(rig.sched.requeues) == sorted(ids)
    approvals = rig.audit.of(decision, "approval")
    assert [(a.actor, len(cast(list[str], a.data["covers"]))) for a in approvals] == [("ana", 5)]
    # A second approval, by the decision's own id, is refused: it was decided.
    with pytest.raises(Exception, match="already approved by ana"):
        await recovery_client.decide(rig.client, decision, "approve", Approval(by="bo"))
    await replays(rig.client, handles[0].id, "node_decision_joined_monitor")


async def test_a_refused_guard_holds_every_job_and_drains_nothing(rig: Rig) -> None:
    # 20 nodes, 10 % → 2 may be out; n4 and n5 already are (Relaunch drained them earlier).
    for n in ("n4", "n5"):
        rig.sched.set_node(n, flags=["DRAIN"], reason=f"relaunch incident earlier-{n}")
    policy = Policy(mode=Mode.AUTONOMOUS)
    ids = jobs_on(rig, "n6", 3, 400)
    handles = await start(rig, ids, policy)
    held = await until_all(handles, lambda s: s.stage is Stage.HELD, "every job held")
    assert all("guard refused draining n6" in s.outcome for s in held)
    assert not rig.sched.nodes["n6"].drain_flag and rig.sched.requeues == []
    # The jobs are still listed RUNNING (their node died under them): nothing to hold yet,
    # each left for a human with the reason in its trail.
    assert all("held for a human" in s.outcome for s in held)
    decision = node_decision_id(rig.cluster, "n6", 1)
    node = await rig.client.get_workflow_handle(decision).query(NodeDecisionWorkflow.status)
    assert node.stage is Stage.HELD  # and open for late joiners, who are held too
    await rig.client.get_workflow_handle(decision).terminate("test over")
    await replays(rig.client, decision, "node_decision_guard_held")


async def test_a_closed_decision_is_not_joined_the_next_failure_starts_the_next(
    rig: Rig,
) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    first = jobs_on(rig, "n7", 2, 500)
    handles = await start(rig, first, policy)
    await until_all(handles, lambda s: s.stage is Stage.DONE, "first failure recovered")
    decision = node_decision_id(rig.cluster, "n7", 1)
    await rig.client.get_workflow_handle(decision).terminate("the operator closed it")
    again = jobs_on(rig, "n7", 1, 600)
    rig.sched.set_node("n7", flags=[], reason="")  # resumed by the operator
    [handle] = await start(rig, again, policy)
    [status] = await until_all([handle], lambda s: s.stage is Stage.DONE, "second failure")
    assert status.node_decision == node_decision_id(rig.cluster, "n7", 2)
    assert len(drains(rig, "n7")) == 2


def _closed_port() -> int:
    """A local port nothing listens on: a probe there is refused, as a dead slurmd's is."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def answering(rig: Rig, node: str) -> AsyncIterator[None]:
    """Inside, ``node``'s slurmd answers probes (a local server accepts and closes)."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    rig.sched.set_node(node, address="127.0.0.1", port=server.sockets[0].getsockname()[1])
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


def _report(node: str, jobs: int) -> NodeReport:
    return NodeReport(
        node=node,
        text=f"{node} slurmd 127.0.0.1: refused ×3 (connect probe)",
        detected_at=datetime.now(UTC),
        partitions=["gpu"],
        jobs=jobs,
    )


async def _until_rows(rig: Rig, incident: str, kind: str, count: int = 1) -> list[StoredEvent]:
    for _ in range(300):
        rows = rig.audit.of(incident, kind)
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {kind} row in {incident}")


async def test_the_watchers_report_drains_the_node_before_any_job_joins(rig: Rig) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    rig.sched.set_node("n9", address="127.0.0.1", port=_closed_port())
    ids = jobs_on(rig, "n9", 4, 900)
    # The watcher's probes found n9's slurmd gone: it reports the node, as `relaunch watch` does.
    signals = NodeDecisionSignals(rig.client)
    decision, started = await signals.report(rig.cluster, "n9", policy, _report("n9", 4))
    assert decision == node_decision_id(rig.cluster, "n9", 1) and started
    # A workflow task a worker took and never answered is handed out again after 4 s, not 10.
    described = await rig.client.get_workflow_handle(decision).describe()
    config = described.raw_description.execution_config
    assert config.default_workflow_task_timeout.ToTimedelta() == DECISION_TASK_TIMEOUT
    # A second report reaches the running decision: the watcher is told it started nothing.
    again = await signals.report(rig.cluster, "n9", policy, _report("n9", 4))
    assert again == (decision, False)
    steps = {
        r.data["step"]: r.data["changed"] for r in await _until_rows(rig, decision, "action", 2)
    }
    assert steps == {"drain": True, "fence": True}  # its slurmd is gone: fenced as well
    assert rig.sched.nodes["n9"].drain_flag and rig.sched.requeues == []
    [plan] = rig.audit.of(decision, "plan")
    assert "convicted by Relaunch's own probes" in plan.summary

    # Then the jobs' recoveries come: they join a decision that has already drained.
    handles = await start(rig, ids, policy)
    done = await until_all(handles, lambda s: s.stage is Stage.DONE, "every recovery done")
    assert {s.node_decision for s in done} == {decision}
    assert sorted(rig.sched.requeues) == sorted(ids)
    assert [r.incident_id for r in drains(rig, "n9")] == [decision]  # drained once
    await replays(rig.client, decision, "node_decision_reported")


async def join_requeued_ahead(
    rig: Rig, ids: list[str], policy: Policy, decision: str
) -> tuple[list[WorkflowHandle[RecoveryWorkflow, RecoveryStatus]], list[StoredEvent]]:
    """Start the recoveries of jobs the decision requeued ahead: each joins it and is told its
    job was requeued (one restart row each, changed, marked ahead). Their handles and rows."""
    handles = await start(rig, ids, policy)
    done = await until_all(handles, lambda s: s.stage is Stage.DONE, "every recovery done")
    assert {s.node_decision for s in done} == {decision}
    restarts = []
    for handle in handles:
        [restart] = [r for r in rig.audit.of(handle.id, "action") if r.data["step"] == "restart"]
        assert restart.data["changed"] and restart.data["ahead"] is True
        restarts.append(restart)
    return handles, restarts


async def test_a_fenced_nodes_reported_jobs_are_requeued_before_their_recoveries_join(
    rig: Rig,
) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    rig.sched.set_node("n15", address="127.0.0.1", port=_closed_port())
    ids = jobs_on(rig, "n15", 5, 1700)
    # The watcher lists the node's jobs that run on no other reported node (watch_handover.py).
    running = [ReportedJob(job_id=j, partition="gpu", restart_count=0) for j in ids]
    report = _report("n15", 5).model_copy(update={"running": running})
    decision, _ = await NodeDecisionSignals(rig.client).report(rig.cluster, "n15", policy, report)
    [ahead] = await _until_rows(rig, decision, "requeue_batch")
    # Drained, fenced, and every job requeued, before any job's recovery has even started.
    assert ahead.data["ahead"] is True and "5 of 5 jobs requeued" in ahead.summary
    assert sorted(rig.sched.requeues) == sorted(ids)
    assert rig.sched.nodes["n15"].drain_flag and rig.audit.kinds("node_decision") == []
    requeued_at = ahead.at

    # The recoveries join: each is told its job was requeued, which they verify; nothing is
    # requeued twice, and each job's trail has its one restart, dated when it happened.
    handles, restarts = await join_requeued_ahead(rig, ids, policy, decision)
    assert sorted(rig.sched.requeues) == sorted(ids)
    for restart in restarts:
        assert "requeued ahead of the join" in restart.summary
        assert restart.at <= requeued_at
    status = await rig.client.get_workflow_handle(decision).query(NodeDecisionWorkflow.status)
    assert status.requeued == 5 and sorted(status.covers) == sorted(h.id for h in handles)
    await replays(rig.client, decision, "node_decision_requeued_ahead")


async def test_a_report_that_comes_with_the_first_join_still_requeues_its_jobs_ahead(
    rig: Rig,
) -> None:
    """The first job's join started the decision, but the watcher's report came before the
    plan (one workflow task sees both): the report's jobs are still requeued ahead."""
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    rig.sched.set_node("n17", address="127.0.0.1", port=_closed_port())
    ids = jobs_on(rig, "n17", 3, 1900)
    decision = node_decision_id(rig.cluster, "n17", 1)
    first = JoinRequest(
        recovery_id=recovery_workflow_id(rig.cluster, ids[0], 0),
        job_id=ids[0],
        partition="gpu",
        expected_restart_count=0,
        category=Category.GPU_HARDWARE,
        requeue_by="n17",
        unreachable=True,
        mode=Mode.AUTONOMOUS,
    )
    report = _report("n17", 3).model_copy(
        update={"running": [ReportedJob(job_id=j, restart_count=0) for j in ids]}
    )
    queue = f"held-{rig.cluster}"  # no worker yet: both signals wait for the first task
    handle = await rig.client.start_workflow(
        NodeDecisionWorkflow.run,
        NodeDecisionInput(cluster=rig.cluster, node="n17", n=1, policy=policy),
        id=decision,
        task_queue=queue,
        start_signal=NodeDecisionWorkflow.join.__name__,
        start_signal_args=[first],
    )
    await handle.signal(NodeDecisionWorkflow.report, report)
    worker = Worker(
        rig.client,
        task_queue=queue,
        workflows=[RecoveryWorkflow, NodeDecisionWorkflow],
        workflow_runner=WORKFLOW_RUNNER,
        activities=rig.steps,
    )
    async with worker:
        # Batch 0 is plan_node's; the first join's batch (its row only) may follow it.
        ahead = (await _until_rows(rig, decision, "requeue_batch"))[0]
        await handle.terminate("test over")
    assert ahead.data["ahead"] is True and sorted(rig.sched.requeues) == sorted(ids)
    [plan] = rig.audit.of(decision, "plan")
    assert f"convicted by trusted evidence in {first.recovery_id}" in plan.summary


async def test_a_report_that_comes_after_the_drain_requeues_the_jobs_not_yet_joined(
    rig: Rig,
) -> None:
    """A job's join started the decision and it isolated the node before the watcher's report
    came (a burst's first recoveries can beat a report the server was slow to take): the
    report's jobs that have not joined are requeued ahead then, not one by one as they join."""
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    rig.sched.set_node("n18", address="127.0.0.1", port=_closed_port())
    ids = jobs_on(rig, "n18", 4, 2000)
    [first] = await start(rig, ids[:1], policy)
    await until_all([first], lambda s: s.stage is Stage.DONE, "the first recovery done")
    decision = node_decision_id(rig.cluster, "n18", 1)
    assert rig.sched.nodes["n18"].drain_flag and rig.sched.requeues == [ids[0]]

    report = _report("n18", 4).model_copy(
        update={"running": [ReportedJob(job_id=j, restart_count=0) for j in ids]}
    )
    assert (await NodeDecisionSignals(rig.client).report(rig.cluster, "n18", policy, report))[
        0
    ] == decision
    late = [
        r for r in await _until_rows(rig, decision, "requeue_batch", 2) if r.data.get("second_look")
    ]
    assert [r.data["jobs"] for r in late] == [ids[1:]]  # the first job joined: its batch did it
    assert "3 of 3 jobs requeued" in late[0].summary
    assert sorted(rig.sched.requeues) == sorted(ids)

    # The others join later: each is told its job was requeued, and nothing is requeued twice.
    await join_requeued_ahead(rig, ids[1:], policy, decision)
    assert sorted(rig.sched.requeues) == sorted(ids)
    await replays(rig.client, decision, "node_decision_late_report")


@pytest.mark.usefixtures("quick_looks")
async def test_a_late_report_of_a_node_that_answers_requeues_nothing_ahead(rig: Rig) -> None:
    """The same late report, but the node's slurmd answers a fresh probe by then: its jobs may
    still run, so each waits for its own recovery's join."""
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    ids = jobs_on(rig, "n19", 3, 2100)
    async with answering(rig, "n19"):
        [first] = await start(rig, ids[:1], policy)
        await until_all([first], lambda s: s.stage is Stage.DONE, "the first recovery done")
        report = _report("n19", 3).model_copy(
            update={"running": [ReportedJob(job_id=j, restart_count=0) for j in ids]}
        )
        decision, _ = await NodeDecisionSignals(rig.client).report(
            rig.cluster, "n19", policy, report
        )
        [row] = await _until_rows(rig, decision, "node_report")
    assert row.data["look_again"] is True and "still answers" in row.summary
    assert rig.sched.requeues == [ids[0]]
    assert not [r for r in rig.audit.of(decision, "requeue_batch") if r.data.get("ahead")]


def _xid_report(node: str, ids: list[str]) -> NodeReport:
    """The watcher's report of an Xid 79 in ``node``'s own kernel log, with its jobs."""
    return _report(node, len(ids)).model_copy(
        update={
            "source": DetectionSource.NODE_LOG,
            "kind": "signature:xid_79",
            "category": Category.GPU_HARDWARE,
            "text": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            "running": [ReportedJob(job_id=j, partition="gpu", restart_count=0) for j in ids],
        }
    )


@pytest.fixture
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decisions' second looks at a node 0.2–0.8 s after the drain (1–20 s in service)."""
    looks = tuple(timedelta(seconds=s) for s in (0.2, 0.4, 0.8))
    monkeypatch.setattr(node_look, "LOOKS", looks)


@pytest.mark.usefixtures("quick_looks")
async def test_a_reported_node_that_answers_gets_no_requeue_ahead(rig: Rig) -> None:
    """An Xid in the node's own kernel log drains it, but its slurmd answers, also to every
    second look: its jobs may still run, so none is requeued until its own recovery (a detected
    interruption) joins; the decision says why."""
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    ids = jobs_on(rig, "n16", 2, 1800)
    async with answering(rig, "n16"):
        decision, _ = await NodeDecisionSignals(rig.client).report(
            rig.cluster, "n16", policy, _xid_report("n16", ids)
        )
        [row] = await _until_rows(rig, decision, "node_report")
        assert row.data["look_again"] is True and "still answers" in row.summary
        assert rig.sched.nodes["n16"].drain_flag
        assert [r.data["step"] for r in rig.audit.of(decision, "action")] == ["drain"]
        assert rig.sched.requeues == [] and rig.audit.of(decision, "requeue_batch") == []


@pytest.mark.usefixtures("quick_looks")
async def test_a_drained_node_whose_slurmd_dies_later_is_fenced_and_its_jobs_requeued(
    rig: Rig,
) -> None:
    """The Xid line came before the node died: plan_node's probe had an answer, so the node was
    drained, not fenced. A second look finds its slurmd silent: the node is fenced and its
    reported jobs requeued ahead of their joins."""
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    ids = jobs_on(rig, "n14", 3, 1600)
    async with answering(rig, "n14"):
        decision, _ = await NodeDecisionSignals(rig.client).report(
            rig.cluster, "n14", policy, _xid_report("n14", ids)
        )
        [drain] = await _until_rows(rig, decision, "action")
        assert drain.data["step"] == "drain" and rig.sched.requeues == []
    [ahead] = await _until_rows(rig, decision, "requeue_batch")  # the port now refuses
    assert ahead.data["second_look"] is True and "3 of 3 jobs requeued" in ahead.summary
    steps = [r.data["step"] for r in rig.audit.of(decision, "action")]
    assert steps == ["drain", "fence"] and rig.sched.nodes["n14"].state is NodeState.DOWN
    assert sorted(rig.sched.requeues) == sorted(ids)
    await join_requeued_ahead(rig, ids, policy, decision)
    assert sorted(rig.sched.requeues) == sorted(ids)  # nothing requeued twice
    await replays(rig.client, decision, "node_decision_looked_again")


async def test_a_report_a_fresh_probe_does_not_confirm_convicts_nothing(rig: Rig) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    async with answering(rig, "n10"):
        decision, _ = await NodeDecisionSignals(rig.client).report(
            rig.cluster, "n10", policy, _report("n10", 1)
        )
        [row] = await _until_rows(rig, decision, "node_report")
    # slurmd answered the decision's own probe: the watcher's word alone drains nothing.
    assert row.data["convicted"] is False and "fresh probe had an answer" in row.summary
    assert not rig.sched.nodes["n10"].drain_flag and rig.audit.of(decision, "plan") == []
    # The first job whose verdict convicts the node (its kernel log) is what drains it.
    [handle] = await start(rig, jobs_on(rig, "n10", 1, 1000), policy)
    [status] = await until_all([handle], lambda s: s.stage is Stage.DONE, "the job recovered")
    assert status.node_decision == decision
    assert [r.incident_id for r in drains(rig, "n10")] == [decision]
    [plan] = rig.audit.of(decision, "plan")
    assert "convicted by trusted evidence in" in plan.summary


async def test_a_reported_xid_in_the_nodes_own_kernel_log_drains_a_node_that_still_answers(
    rig: Rig,
) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
    report = _report("n11", 2).model_copy(
        update={
            "source": DetectionSource.NODE_LOG,
            "kind": "signature:xid_79",
            "category": Category.GPU_HARDWARE,
            "text": line,
            "remedy": "reboot",
        }
    )
    async with answering(rig, "n11"):
        decision, _ = await NodeDecisionSignals(rig.client).report(
            rig.cluster, "n11", policy, report
        )
        [drain] = await _until_rows(rig, decision, "action")
    # Drained on its kernel log's word; its slurmd answers, so it is not fenced.
    assert drain.data["step"] == "drain" and rig.sched.nodes["n11"].drain_flag
    [plan] = rig.audit.of(decision, "plan")
    assert "convicted by its own kernel log" in plan.summary and "reboot" in plan.summary
    assert plan.data["fence_nodes"] == []


async def test_a_drain_that_fails_in_plan_node_fails_the_decisions_jobs_not_the_decision(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    rig.sched.set_node("n12", address="127.0.0.1", port=_closed_port())

    async def refused(name: str, reason: str) -> None:
        raise InvalidNameError(f"node name {name!r} refused by the test")

    monkeypatch.setattr(rig.sched, "drain_node", refused)
    decision, _ = await NodeDecisionSignals(rig.client).report(
        rig.cluster, "n12", policy, _report("n12", 1)
    )
    handle = rig.client.get_workflow_handle(decision)
    for _ in range(300):
        status = await handle.query(NodeDecisionWorkflow.status)
        if status.stage is Stage.FAILED:
            break
        await asyncio.sleep(0.1)
    # The decision is still open (jobs that join are told to go on alone), and says why.
    assert status.stage is Stage.FAILED, status
    [row] = [r for r in rig.audit.of(decision, "stage") if r.stage == "failed"]
    assert "planning and isolating n12 failed" in row.summary
    assert not rig.sched.nodes["n12"].drain_flag
    await handle.terminate("test over")


async def test_a_node_put_back_in_service_fails_again_under_its_next_decision(rig: Rig) -> None:
    """The decision stays open for late joiners, but not past its node's return: a job of the
    node's new failure is not requeued onto it by the old decision, which closes; the next
    failure's jobs start the node's next decision, which drains it again."""
    policy = Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0)
    first = await start(rig, jobs_on(rig, "n14", 2, 1400), policy)
    await until_all(first, lambda s: s.stage is Stage.DONE, "the first failure recovered")
    decision = node_decision_id(rig.cluster, "n14", 1)
    rig.sched.set_node("n14", flags=[], reason="")  # repaired and resumed by an operator
    [late] = await start(rig, jobs_on(rig, "n14", 1, 1500), policy)
    handle = rig.client.get_workflow_handle_for(NodeDecisionWorkflow.run, decision)
    closed = await asyncio.wait_for(handle.result(), timeout=60)
    assert closed.stage is Stage.DONE and "back in service" in closed.outcome
    assert rig.sched.jobs["1500"].restart_count == 0  # not requeued onto the resumed node
    # The late recovery records what the decision told it once the signal reaches it: after
    # the decision has closed, on a loaded machine a moment later.
    for _ in range(300):
        told = [r for r in rig.audit.of(late.id, "node_decision") if "back in service" in r.summary]
        if told:
            break
        await asyncio.sleep(0.1)
    assert len(told) == 1 and decision in told[0].summary, told
    await late.terminate("its own plan is not this test's")
    # The node's next failure: its next decision drains it again.
    again = await start(rig, jobs_on(rig, "n14", 1, 1600), policy)
    [status] = await until_all(again, lambda s: s.stage is Stage.DONE, "the next failure")
    assert status.node_decision == node_decision_id(rig.cluster, "n14", 2)
    assert [r.incident_id for r in drains(rig, "n14")] == [decision, status.node_decision]


async def test_a_batch_retried_after_its_worker_died_counts_each_requeue_once() -> None:
    """The first attempt requeued job 701 and died before recording it; the retry finds it
    requeued once past what its recovery saw and records that restart (once); job 702, which
    it had not reached, it requeues now."""
    sched = FakeScheduler(nodes=[Node(name="n1", state=NodeState.IDLE, partitions=["gpu"])])
    audit = Audit()
    config = ClusterConfig(name="dev", database_url="postgresql://unused", bundle_dir="/tmp")
    deps = Deps(config=config, scheduler=sched, audit=cast(AuditStore, audit))
    node = NodeActivities(deps)
    for job_id, restarts, state in (("701", 1, JobState.PENDING), ("702", 0, JobState.RUNNING)):
        sched.jobs[job_id] = Job(
            job_id=job_id, state=state, nodes=["n1"], restart_count=restarts, requeue_allowed=True
        )
    batch = RequeueBatchInput(
        decision_id="relaunch-dev-node-n1-1",
        cluster="dev",
        node="n1",
        batch=1,
        jobs=[
            BatchJob(recovery_id=f"relaunch-dev-{j}-0", job_id=j, expected_restart_count=0)
            for j in ("701", "702")
        ],
        policy=Policy(),
    )
    for _ in range(2):  # the retry, and a retry of the retry
        result = await ActivityEnvironment().run(node.requeue_batch, batch)
        assert {r.job_id: r.outcome for r in result.results} == {
            "701": JobOutcome.REQUEUED,
            "702": JobOutcome.REQUEUED,
        }
    assert sched.requeues == ["702"]
    rows = [r for r in audit.kinds("action") if r.data["step"] == "restart"]
    assert sorted((r.incident_id, r.data["changed"]) for r in rows) == [
        ("relaunch-dev-701-0", True),
        ("relaunch-dev-702-0", True),
    ]
    assert "earlier attempt" in next(r.summary for r in rows if "701" in r.incident_id)


async def test_a_requeue_ahead_spares_cancelled_jobs_and_spent_budgets() -> None:
    """plan_node's requeue ahead of the joins: a job someone cancelled and a job whose own
    budget is spent are left to their recoveries' joins (which say why); the others are
    requeued once, and a retried plan_node requeues nothing twice."""
    sched = FakeScheduler(
        nodes=[Node(name="n3", state=NodeState.IDLE, address="127.0.0.1", port=_closed_port())]
    )
    for job_id, state in (("31", JobState.RUNNING), ("32", JobState.CANCELLED)):
        sched.jobs[job_id] = Job(job_id=job_id, state=state, nodes=["n3"], requeue_allowed=True)
    sched.jobs["33"] = Job(
        job_id="33",
        state=JobState.RUNNING,
        nodes=["n3"],
        requeue_allowed=True,
        comment="relaunch=on,max_restarts=0",
    )
    audit = Audit()
    config = ClusterConfig(name="dev", database_url="postgresql://unused", bundle_dir="/tmp")
    deps = Deps(config=config, scheduler=sched, audit=cast(AuditStore, audit))
    report = _report("n3", 3).model_copy(
        update={
            "running": [
                ReportedJob(job_id=j.job_id, restart_count=0, max_restarts=j.max_restarts)
                for j in sched.jobs.values()
            ]
        }
    )
    plan_input = NodePlanInput(
        decision_id="relaunch-dev-node-n3-1",
        cluster="dev",
        node="n3",
        report=report,
        policy=Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0),
        stage_summary="node decision for n3: reported by the watcher",
    )
    node = NodeActivities(deps)
    for _ in range(2):  # the step, and a retry of it (which finds n3 out by its own drain)
        plan = await ActivityEnvironment().run(node.plan_node, plan_input)
        assert plan.isolated is not None and plan.isolated.ok and plan.fence
        assert [a.job_id for a in plan.ahead] == ["31"]
    assert sched.requeues == ["31"] and sched.drains == ["n3"] and sched.fences == ["n3"]
    [row] = audit.of("relaunch-dev-node-n3-1", "requeue_batch")
    assert "1 of 3 jobs requeued" in row.summary and sorted(row.data["left"]) == ["32", "33"]


async def test_a_plan_retried_after_its_worker_died_still_hands_the_node_to_its_lifecycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker died between the drain and the lifecycle's start: the retry finds the node
    out of service by this decision's own drain, drains again (a no-op) and starts the
    lifecycle, instead of taking the node for someone else's and leaving it drained for good.
    A node someone else drained is still not this decision's to isolate."""
    handed: list[list[str]] = []

    async def start_lifecycles(
        self: ActionActivities, inp: ActInput, nodes: list[str], *, suspect: bool = False
    ) -> None:
        assert not suspect
        if not handed:
            handed.append([])
            raise RuntimeError("the worker died here")
        handed.append(nodes)

    monkeypatch.setattr(ActionActivities, "_start_lifecycles", start_lifecycles)
    sched = FakeScheduler(
        nodes=[Node(name="n4", state=NodeState.IDLE, address="127.0.0.1", port=_closed_port())]
    )
    audit = Audit()
    config = ClusterConfig(name="dev", database_url="postgresql://unused", bundle_dir="/tmp")
    node = NodeActivities(Deps(config=config, scheduler=sched, audit=cast(AuditStore, audit)))
    plan_input = NodePlanInput(
        decision_id="relaunch-dev-node-n4-1",
        cluster="dev",
        node="n4",
        report=_report("n4", 0),
        policy=Policy(mode=Mode.AUTONOMOUS, drain_cap=10, drain_share=1.0),
        stage_summary="node decision for n4: reported by the watcher",
    )
    with pytest.raises(RuntimeError):
        await ActivityEnvironment().run(node.plan_node, plan_input)
    plan = await ActivityEnvironment().run(node.plan_node, plan_input)
    assert plan.drain and plan.isolated is not None and plan.isolated.ok
    assert handed == [[], ["n4", "n4"]] and sched.drains == sched.fences == ["n4"]
    # Drained by another decision (or a person): out already, nothing for this one to isolate.
    other = plan_input.model_copy(update={"decision_id": "relaunch-dev-node-n4-2"})
    plan = await ActivityEnvironment().run(node.plan_node, other)
    assert not plan.drain and len(handed) == 2


def _verdict(category: Category, corroboration: dict[str, list[str]]) -> Verdict:
    return Verdict(
        category=category,
        culprit_nodes=sorted(corroboration),
        action=Action.ISOLATE_AND_RESTART,
        corroboration=corroboration,
    )


def _evidence(nodes: list[str]) -> EvidenceSummary:
    return EvidenceSummary(
        incident_id="i", bundle_path="b", job=JobSnapshot(job_id="1", nodes=nodes)
    )


@pytest.mark.parametrize(
    ("category", "corroboration", "policy", "joined"),
    [
        # A node-level failure every culprit of which a trusted source confirms: join.
        (Category.GPU_HARDWARE, {"n1": ["kernel_log"]}, Policy(), ["n1"]),
        (Category.NODE_FAILURE, {"n1": ["probe"], "n2": ["slurm"]}, Policy(), ["n1", "n2"]),
        # Named by the job's output alone (any culprit): never a node decision, never a drain.
        (Category.GPU_HARDWARE, {"n1": []}, Policy(), []),
        (Category.NETWORK, {"n1": ["kernel_log"], "n2": []}, Policy(), []),
        # An application error blames no node, whatever its culprits' corroboration says.
        (Category.APPLICATION, {"n1": ["kernel_log"]}, Policy(), []),
        (Category.INFRASTRUCTURE, {"n1": ["kernel_log"]}, Policy(), []),
        # Off by policy, or restarts by resubmission (a batch requeues): planned job by job.
        (Category.GPU_HARDWARE, {"n1": ["kernel_log"]}, Policy(node_decisions=False), []),
        (
            Category.GPU_HARDWARE,
            {"n1": ["kernel_log"]},
            Policy(restart_method=RestartMethod.RESUBMIT),
            [],
        ),
        # A culprit the job did not run on.
        (Category.GPU_HARDWARE, {"n9": ["kernel_log"]}, Policy(), []),
    ],
)
def test_only_trusted_convictions_join_node_decisions(
    category: Category, corroboration: dict[str, list[str]], policy: Policy, joined: list[str]
) -> None:
    verdict = _verdict(category, corroboration)
    assert node_decision_nodes(verdict, _evidence(["n1", "n2", "n3"]), policy) == joined
