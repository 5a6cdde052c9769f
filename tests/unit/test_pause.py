"""The kill switch (`relaunch pause`): every activity that changes a cluster refuses while it is
paused, before it touches Slurm, and says so once in the incident's trail; a recovery whose
step was refused waits and carries it out after the unpause, approved once; the CLI refuses a
pause without who and why before it connects to anything."""

from __future__ import annotations

import asyncio
import shutil
import typing
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from relaunch.activities.deps import Deps
from relaunch.cli import cli
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.pause import BadPauseError, pause_state, set_paused
from relaunch.models.config import ClusterConfig
from relaunch.models.pause import PAUSED_ERROR, control_incident
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    Approval,
    Mode,
    Policy,
    RecoveryInput,
    Stage,
    StepOutcome,
    recovery_workflow_id,
)
from relaunch.models.scheduler import JobState
from relaunch.workers.worker import activities_for
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
from tests.unit.test_activities import MemoryAudit, cluster, running_job
from tests.unit.test_api_v1 import Env, env, pg_url  # noqa: F401 - fixtures
from tests.unit.test_workflow_approval import TEMPORAL, Fakes

CLUSTER = "dev"
INCIDENT = "relaunch-dev-42-0"

# Every activity the worker registers is one or the other: a new activity must say which.
CHANGES_THE_CLUSTER = {
    "isolate",
    "check_suspects",
    "restart",
    "hold",
    "requeue_batch",
    "look_again",
    "lifecycle_reserve",
    "lifecycle_hold",
    "lifecycle_checks",
    "lifecycle_rung",
    "lifecycle_escalate",
    "lifecycle_return",
    "lifecycle_release",
}
# plan_node drains only through `isolate` (gated there); the rest read, record or signal.
LEAVES_IT_ALONE = {
    "record_detection",
    "record_event",
    "plan",
    "verify_check",
    "launcher_look",  # a look at a running job (its state, its output): never a change
    "investigate",
    "plan_node",
    "lifecycle_start",
}


class ControlAudit(MemoryAudit):
    """The in-memory trail, with the control record a pause is written to."""

    async def ensure_incident(self, incident_id: str, cluster: str, job_id: str, n: int) -> None:
        pass


class Untouchable:
    """A scheduler no paused activity may touch."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a paused activity touched the scheduler: {name}")


def deps_for(audit: ControlAudit, scheduler: object) -> Deps:
    config = ClusterConfig(name=CLUSTER, database_url="postgresql://unused", bundle_dir="/tmp")
    return Deps(config=config, scheduler=cast(Any, scheduler), audit=cast(AuditStore, audit))


def activity_name(fn: Callable[..., Any]) -> str:
    defn = getattr(fn, "__temporal_activity_definition")
    return str(defn.name)


def some_input(fn: Callable[..., Any]) -> BaseModel:
    """An input for ``fn`` as far as its first line reads it (built without validation)."""
    kind = typing.get_type_hints(fn)["inp"]
    plan = ActionPlan(
        request_id="r1", action=Action.HOLD, mode=Mode.AUTONOMOUS, job_id="42",
        expected_restart_count=0, drain_nodes=["n1"],
    )  # fmt: skip
    known = {
        "incident_id": INCIDENT, "decision_id": INCIDENT, "lifecycle_id": INCIDENT,
        "cluster": CLUSTER, "node": "n1", "plan": plan,
    }  # fmt: skip
    return cast(
        BaseModel,
        kind.model_construct(**{k: v for k, v in known.items() if k in kind.model_fields}),
    )


def test_every_registered_activity_is_classified() -> None:
    names = {activity_name(fn) for fn in activities_for(deps_for(ControlAudit(), Untouchable()))}
    assert names == CHANGES_THE_CLUSTER | LEAVES_IT_ALONE


async def test_every_activity_that_changes_the_cluster_refuses_while_paused() -> None:
    audit = ControlAudit()
    await set_paused(cast(AuditStore, audit), CLUSTER, True, by="ops", reason="switch work")
    gated = [
        fn
        for fn in activities_for(deps_for(audit, Untouchable()))
        if activity_name(fn) in CHANGES_THE_CLUSTER
    ]
    assert len(gated) == len(CHANGES_THE_CLUSTER)
    for fn in gated:
        with pytest.raises(ApplicationError) as raised:
            await ActivityEnvironment().run(fn, some_input(fn))
        assert raised.value.type == PAUSED_ERROR, activity_name(fn)
        assert not raised.value.non_retryable  # Temporal retries it first, then the workflow
        assert "cluster dev is paused by ops: switch work" in str(raised.value)
    waits = [r.data["step"] for r in audit.kinds("paused")]
    assert sorted(waits) == sorted(CHANGES_THE_CLUSTER)
    # Said once per pause and step, however often the step is retried.
    with pytest.raises(ApplicationError):
        await ActivityEnvironment().run(gated[0], some_input(gated[0]))
    assert len(audit.kinds("paused")) == len(CHANGES_THE_CLUSTER)


async def test_after_the_unpause_the_activity_acts() -> None:
    audit = ControlAudit()
    store = cast(AuditStore, audit)
    sched = cluster(running_job(state=JobState.PENDING))
    await set_paused(store, CLUSTER, True, by="ops", reason="switch work")
    hold = next(fn for fn in activities_for(deps_for(audit, sched)) if activity_name(fn) == "hold")
    with pytest.raises(ApplicationError):
        await ActivityEnvironment().run(hold, some_input(hold))
    await set_paused(store, CLUSTER, False, by="ops")
    state = await pause_state(store, CLUSTER)
    assert not state.paused and state.by == "ops"
    outcome = await ActivityEnvironment().run(hold, some_input(hold))
    assert isinstance(outcome, StepOutcome) and outcome.changed
    kinds = [(r.kind, r.actor) for r in audit.rows if r.incident_id == control_incident(CLUSTER)]
    assert kinds == [("pause", "ops"), ("unpause", "ops")]


async def test_a_pause_needs_a_valid_name_and_a_reason() -> None:
    store = cast(AuditStore, ControlAudit())
    with pytest.raises(BadPauseError, match="needs a reason"):
        await set_paused(store, CLUSTER, True, by="ops", reason="  ")
    with pytest.raises(BadPauseError, match="invalid name"):
        await set_paused(store, CLUSTER, True, by="ops;rm", reason="x")
    assert not (await pause_state(store, CLUSTER)).paused


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["pause"], "a pause needs --by NAME and --reason TEXT"),
        (["pause", "--by", "ops"], "a pause needs --reason TEXT"),
        (["pause", "--reason", "maintenance"], "a pause needs --by NAME"),
        (["unpause"], "an unpause needs --by NAME"),
    ],
)
def test_the_cli_refuses_a_pause_without_who_and_why(args: list[str], says: str) -> None:
    # A configuration that cannot be reached: the refusal comes before any connection.
    result = CliRunner().invoke(cli, [*args, "--config", "/nonexistent.json"])
    assert result.exit_code == 2
    assert says in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- the workflow waits


@dataclass
class PausedFakes(Fakes):
    """The recovery's fake activities, with a restart that refuses as a paused cluster's does
    while ``paused`` (at once, not retried by Temporal: the workflow's own wait is tested)."""

    paused: bool = True
    refused: int = 0
    restarted: int = 0

    @activity.defn(name="restart")
    async def restart(self, inp: ActInput) -> StepOutcome:
        if self.paused:
            self.refused += 1
            raise ApplicationError(
                "cluster dev is paused by ops: switch work", type=PAUSED_ERROR, non_retryable=True
            )
        self.restarted += 1
        return StepOutcome(ok=True, changed=True, detail="requeued")


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    if not TEMPORAL.is_file() and shutil.which("temporal") is None:
        pytest.skip("no Temporal CLI (dev server) on this machine")
    environment = await WorkflowEnvironment.start_local(
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
    try:
        yield environment.client
    finally:
        await environment.shutdown()


async def test_an_approved_restart_waits_for_the_unpause_and_then_happens(client: Client) -> None:
    fakes = PausedFakes()
    queue = f"pause-{uuid.uuid4().hex[:6]}"
    steps = [
        fakes.record_detection, fakes.record_event, fakes.plan, fakes.isolate, fakes.restart,
        fakes.hold, fakes.verify_check, fakes.investigate,
    ]  # fmt: skip
    job_id = str(uuid.uuid4().int % 10**9)
    async with Worker(client, task_queue=queue, workflows=[RecoveryWorkflow], activities=steps):
        handle = await client.start_workflow(
            RecoveryWorkflow.run,
            RecoveryInput(
                cluster=CLUSTER, job_id=job_id, attempt=0, policy=Policy(approval_timeout_s=60)
            ),
            id=recovery_workflow_id(CLUSTER, job_id, 0),
            task_queue=queue,
        )
        for _ in range(200):
            if (await handle.query(RecoveryWorkflow.status)).stage is Stage.AWAITING_APPROVAL:
                break
            await asyncio.sleep(0.05)
        await handle.signal(RecoveryWorkflow.approve, Approval(by="ana"))
        for _ in range(200):
            if fakes.refused:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1)  # the workflow waits on its timer: nothing is restarted
        status = await handle.query(RecoveryWorkflow.status)
        assert status.stage is Stage.ACTING and fakes.restarted == 0
        fakes.paused = False  # the unpause
        result = await handle.result()
    assert result.stage is Stage.DONE
    assert fakes.refused == 1 and fakes.restarted == 1
    # Approved once: the approval carried over the pause.
    assert [r.actor for r in fakes.records if r.kind == "approval"] == ["ana"]
    replayer = Replayer(workflows=[RecoveryWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


# ---------------------------------------------------------------- the console


def test_an_admin_pauses_through_the_api_and_every_page_says_so(env: Env) -> None:  # noqa: F811
    refused = env.post("ana", "/clusters/a/pause", json={"reason": "switch work"})
    assert refused.status_code == 403  # an approver may not
    no_reason = env.post("root", "/clusters/a/pause", json={})
    assert no_reason.status_code == 400 and no_reason.json()["field"] == "reason"
    assert env.get("vic", "/pause").json()["items"][0]["paused"] is False

    paused = env.post("root", "/clusters/a/pause", json={"reason": "switch work"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["by"] == "root"
    states = {s["cluster"]: s for s in env.get("vic", "/pause").json()["items"]}
    assert states["a"]["paused"] and states["a"]["reason"] == "switch work"
    assert not states["b"]["paused"]
    assert env.rows(control_incident("a"), "pause") == 1

    for page in ("/", "/nodes", "/jobs", "/audit", "/scorecard"):
        html = env.client.get(page, headers=env.auth("vic")).text
        assert 'data-test="paused-banner" data-cluster="a"' in html, page
        assert "is <strong>paused</strong> by root: switch work" in html
    metrics = env.client.get("/metrics", headers=env.auth("vic")).text
    assert 'relaunch_paused{cluster="a"} 1.0' in metrics
    assert 'relaunch_paused{cluster="b"} 0.0' in metrics

    assert env.post("root", "/clusters/a/unpause").status_code == 200
    assert "paused-banner" not in env.client.get("/", headers=env.auth("vic")).text
    metrics = env.client.get("/metrics", headers=env.auth("vic")).text
    assert 'relaunch_paused{cluster="a"} 0.0' in metrics
    assert env.rows(control_incident("a"), "unpause") == 1
