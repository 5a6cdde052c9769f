"""Outages never abandon a recovery: the session's real embedded PostgreSQL is stopped in the
middle of a recovery (10 minutes by default; RELAUNCH_TEST_PG_OUTAGE_S for quicker runs) and
started again. The recovery waits, then completes; no audit row is lost or doubled; the
notifications reach a real local webhook receiver once each."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.notify.channels import IDEMPOTENCY_HEADER
from relaunch.connectors.notify.notifier import Notifier
from relaunch.devstack import services
from relaunch.devstack.stack import Stack
from relaunch.models.notify import ChannelSettings, NotifySettings
from relaunch.models.recovery import (
    Approval,
    Detection,
    DetectionSource,
    EvidenceSummary,
    GatherInput,
    Mode,
    Policy,
    RecoveryInput,
    Stage,
)
from relaunch.models.scheduler import JobState
from relaunch.workflows import recovery_client
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.integration.conftest import MakeHarness
from tests.integration.helpers import wait_job
from tests.integration.serve import serve
from tests.integration.test_recovery import start_training

pytestmark = pytest.mark.xdist_group("outage")

OUTAGE_S = float(os.environ.get("RELAUNCH_TEST_PG_OUTAGE_S", "600"))


class Hook:
    """A webhook receiver that keeps every request: its body and its idempotency header."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, Any], str | None]] = []

    async def post(self, request: Request) -> Response:
        self.got.append((await request.json(), request.headers.get(IDEMPOTENCY_HEADER)))
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/hook", self.post, methods=["POST"])])

    def events(self, incident: str) -> list[str]:
        return [body["event"] for body, _ in self.got if body["incident_id"] == incident]


def _database_up(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("select 1")
        return True
    except psycopg.Error:
        return False


def _start_postgres(stack: Stack) -> None:
    # In a fresh interpreter: the wheel keeps one handle per data directory per process, and the
    # one in this process (the session stack's) still believes its server runs.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from relaunch.devstack.services import"
            " start_postgres; start_postgres(Path(sys.argv[1]))",
            str(stack.postgres_root),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    deadline = time.monotonic() + 60
    while not _database_up(stack.database_url):
        if time.monotonic() > deadline:
            raise AssertionError("PostgreSQL did not come back")
        time.sleep(0.5)


@pytest.fixture
def postgres_outage(stack: Stack) -> Iterator[Any]:
    """``outage()`` stops the session's PostgreSQL; it is started again when the test ends,
    passed or failed, so that the worker's later tests have their database."""
    if stack.config.database_url is not None:
        pytest.skip("an external database (RELAUNCH_DATABASE_URL) is not ours to stop")
    stopped: list[bool] = []

    def outage() -> None:
        services.stop_postgres(stack.postgres_root)
        assert not _database_up(stack.database_url)
        stopped.append(True)

    try:
        yield outage
    finally:
        if stopped and not _database_up(stack.database_url):
            _start_postgres(stack)


@pytest.fixture
async def notifier_store(stack: Stack) -> AsyncIterator[AuditStore]:
    store = await AuditStore.open(stack.database_url)
    yield store
    await store.close()


@pytest.mark.timeout(OUTAGE_S + 900)
async def test_a_recovery_waits_out_a_postgres_outage_and_notifies_once(
    make_harness: MakeHarness,
    stack: Stack,
    postgres_outage: Any,
    notifier_store: AuditStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A recovery that plans its own drain (its own recommendation is what is notified).
    h = make_harness(Policy(mode=Mode.MONITOR, verify_timeout_s=120, node_decisions=False))
    hook = Hook()
    with serve(hook.app(), "/") as base:
        monkeypatch.setenv("T_OUTAGE_HOOK", f"{base}/hook")
        settings = NotifySettings(
            channels=[ChannelSettings(type="webhook", name="ops", url_env="T_OUTAGE_HOOK")],
            poll_interval_s=0.5,
        )
        notifier = Notifier(h.config.name, settings, notifier_store, stack.database_url)
        stop = asyncio.Event()
        notifying = asyncio.create_task(notifier.run(stop))
        try:
            h.start("worker")
            h.start("watch")
            job_id, nodes, _ = await start_training(h)
            h.inject_xid(nodes[0])  # trusted evidence: the plan drains the node once approved
            incident = h.incident(job_id)
            await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=90)
            await h.until(
                _async(lambda: hook.events(incident) == ["recommendation"]),
                "the recommendation reached the hook",
                timeout=30,
            )
            before = await h.events(incident)

            # The database goes away while the recovery waits for its operator, who approves.
            postgres_outage()
            went_down = time.monotonic()
            await recovery_client.decide(h.client, incident, "approve", Approval(by="ana"))
            await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - went_down)))
            status = await recovery_client.status(h.client, incident)
            assert status.stage is Stage.AWAITING_APPROVAL  # waiting to record the approval
            assert not (await h.sched.get_node(nodes[0])).drain_flag
            _start_postgres(stack)
            came_back = time.monotonic()

            done = await h.wait_stage(incident, {Stage.DONE}, timeout=300)
            resumed_in = time.monotonic() - came_back
            await h.until(
                _async(lambda: hook.events(incident) == ["recommendation", "action"]),
                "the action reached the hook",
                timeout=60,
            )
            await asyncio.sleep(3 * settings.poll_interval_s)  # nothing more comes
        finally:
            stop.set()
            await notifying

    assert done.decided_by == "ana"
    assert (await h.sched.get_node(nodes[0])).drain_flag
    assert nodes[0] not in (await h.sched.get_job(job_id)).nodes

    fresh = await AuditStore.open(stack.database_url)
    try:
        after = await fresh.events(incident)
    finally:
        await fresh.close()
    # Nothing recorded before the outage was lost; nothing was recorded twice.
    assert [e.id for e in before] == [e.id for e in after][: len(before)]
    stages = [e.stage for e in after if e.kind == "stage"]
    assert stages == [
        "gathering",
        "awaiting_approval",
        "isolating",
        "acting",
        "verifying",
        "done",
    ], stages
    for kind in ("evidence", "verdict", "plan", "approval"):
        assert len([e for e in after if e.kind == kind]) == 1, kind
    steps = [e.data.get("step") for e in after if e.kind == "action"]
    assert steps.count("drain") == 1 and steps.count("restart") == 1, steps
    sent = [e.data["event"] for e in after if e.kind == "notification"]
    assert sorted(sent) == ["action", "recommendation"]
    # Every delivery names its notification: the header and the webhook body agree.
    keys = [key for body, key in hook.got if body["incident_id"] == incident]
    assert all(keys) and len(set(keys)) == 2
    assert [body["idempotency_key"] for body, _ in hook.got if body["incident_id"] == incident] == (
        keys
    )
    assert resumed_in < 120, f"the recovery took {resumed_in:.0f}s to finish after the outage"

    # The history of the waiting (retries on workflow timers) replays with today's code.
    history = await h.handle(incident).fetch_history()
    await Replayer(
        workflows=[RecoveryWorkflow], data_converter=pydantic_data_converter
    ).replay_workflow(history)


def _async(check: Any) -> Any:
    async def run() -> bool:
        return bool(check())

    return run


@workflow.defn(name="ends_badly")
class EndsBadly:
    """Stands in for a recovery whose workflow failed (it never reached a terminal stage)."""

    @workflow.run
    async def run(self) -> None:
        raise ApplicationError("the database was away for good", non_retryable=True)


@workflow.defn(name="ends_well")
class EndsWell:
    """Stands in for a recovery that completed."""

    @workflow.run
    async def run(self) -> None:
        return None


def _detection(cluster: str, job_id: str, submitted_at: datetime) -> Detection:
    return Detection(
        cluster=cluster,
        job_id=job_id,
        attempt=0,
        source=DetectionSource.SCHEDULER,
        kind="job_state:NODE_FAIL",
        detected_at=datetime.now(UTC),
        submitted_at=submitted_at,
    )


async def test_a_reused_job_id_gets_its_own_recovery_and_a_failed_one_is_started_again(
    make_harness: MakeHarness,
) -> None:
    """No worker serves this cluster's queue: the recoveries started here only need to exist."""
    h = make_harness(Policy())
    client, cluster = h.client, h.config.name
    first = datetime.now(UTC) - timedelta(days=3)
    again = datetime.now(UTC) - timedelta(minutes=5)  # the cluster was reset: job ids from 1
    started: list[str] = []

    async def deliver(job_id: str, submitted_at: datetime) -> bool:
        det = _detection(cluster, job_id, submitted_at)
        return await recovery_client.start_or_join(client, h.config, det)

    try:
        assert await deliver("1", first)
        old = h.incident("1")
        started.append(old)
        assert await deliver("1", again)
        new = f"{old}-{again.astimezone(UTC):%Y%m%dT%H%M%SZ}"
        started.append(new)
        assert await deliver("1", again)  # joins
        desc = await client.get_workflow_handle(new).describe()
        assert desc.status is WorkflowExecutionStatus.RUNNING
        signals = [
            e
            for e in (await client.get_workflow_handle(new).fetch_history()).events
            if e.HasField("workflow_execution_signaled_event_attributes")
        ]
        assert len(signals) == 2  # the start's detection and the joining one
        # The earlier job's recovery is untouched, and its own later detections still join it.
        assert await deliver("1", first)
        # What a person types without the suffix still names the recovery it always named.
        assert await recovery_client.resolve(client, old) == old

        async with Worker(
            client,
            task_queue=f"{cluster}-stand-ins",
            workflows=[EndsBadly, EndsWell],
            # The stand-ins live in this test module, which the sandbox would import again.
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            for job_id, kind in (("2", "ends_badly"), ("3", "ends_well")):
                handle = await client.start_workflow(
                    kind, id=h.incident(job_id), task_queue=f"{cluster}-stand-ins"
                )
                started.append(h.incident(job_id))
                with contextlib.suppress(WorkflowFailureError):
                    await handle.result()
        # A recovery whose workflow failed is started again; one that completed never is.
        assert await deliver("2", first)
        desc = await client.get_workflow_handle(h.incident("2")).describe()
        assert desc.workflow_type == "RecoveryWorkflow"
        assert desc.status is WorkflowExecutionStatus.RUNNING
        assert not await deliver("3", first)
        # One a person terminated is not started again either.
        await client.get_workflow_handle(h.incident("2")).terminate("an operator stops it")
        assert not await deliver("2", first)
    finally:
        for wid in started:
            with contextlib.suppress(RPCError):
                await client.get_workflow_handle(wid).terminate("test over")


async def test_a_restart_with_no_audit_row_still_counts_toward_the_budget(
    make_harness: MakeHarness,
) -> None:
    """A requeue the trail never recorded (its row lost with the database, or Slurm's own):
    Slurm's restart count still spends the job's restart budget."""
    # The job's own plan reads the budget (a node decision's batch reads it the same way).
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, restart_budget=1, node_decisions=False))
    h.start("worker")
    job_id, _, _ = await start_training(h)
    await h.sched.requeue_job(job_id)
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=90)
    assert job.restart_count == 1
    h.start("watch")
    await asyncio.sleep(5)  # the watcher follows the node logs from where they end when it starts
    h.inject_xid(job.nodes[0])
    incident = h.incident(job_id, attempt=1)
    status = await h.wait_stage(incident, {Stage.HELD}, timeout=120)
    assert status.plan is not None and status.plan.action.value == "hold"
    guards = [g.summary for g in await h.events(incident, "guard")]
    assert any("restart_budget: REFUSED" in g and "1 of 1 restarts used" in g for g in guards)
    assert (await h.sched.get_job(job_id)).restart_count == 1  # not restarted again


async def test_a_job_gone_from_slurm_ends_the_recovery_at_no_action(
    temporal_client: Client,
) -> None:
    """Seen after a cluster reset: the recovery's job is no longer known to Slurm when its
    evidence is gathered. The recovery says so at a terminal stage; the workflow completes."""
    queue = f"gone-{uuid.uuid4().hex[:8]}"
    recorded: list[str] = []

    @activity.defn(name="record_detection")
    async def record_detection(inp: dict[str, Any]) -> bool:
        return True

    @activity.defn(name="record_event")
    async def record_event(inp: dict[str, Any]) -> bool:
        recorded.append(f"{inp['kind']}:{inp.get('stage')}:{inp['summary']}")
        return True

    async def gather_evidence(inp: GatherInput) -> EvidenceSummary:
        raise ApplicationError(
            f"job {inp.job_id} not found", type="JobNotFoundError", non_retryable=True
        )

    @activity.defn(name="investigate")  # gathering the evidence is its first step
    async def investigate(inp: GatherInput) -> EvidenceSummary:
        return await gather_evidence(inp)

    det = _detection("gone", "9", datetime.now(UTC))
    async with Worker(
        temporal_client,
        task_queue=queue,
        workflows=[RecoveryWorkflow],
        activities=[record_detection, record_event, investigate],
    ):
        handle = await temporal_client.start_workflow(
            RecoveryWorkflow.run,
            RecoveryInput(cluster="gone", job_id="9", attempt=0),
            id=f"relaunch-gone-9-0-{queue}",
            task_queue=queue,
            start_signal=RecoveryWorkflow.detection.__name__,
            start_signal_args=[det],
        )
        status = await handle.result()
    assert status.stage is Stage.NO_ACTION
    assert status.outcome == "job 9 no longer known to Slurm: no action"
    assert recorded[-1] == f"stage:no_action:{status.outcome}"
