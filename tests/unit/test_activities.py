"""The action activities (isolate, restart, hold, verify) run as Temporal runs them
(``ActivityEnvironment``) against an in-memory cluster (tests/support/fake_scheduler.py) and an
in-memory audit trail: what they change on the cluster, that a retry changes nothing twice, and
what they answer when the cluster says no."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.connectors.audit import OUTSIDE_KINDS, AuditStore, StoredEvent
from relaunch.connectors.slurm.base import Scheduler
from relaunch.models.config import ClusterConfig
from relaunch.models.intake import intake_incident
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    AuditRecord,
    Mode,
    RestartMethod,
    StepOutcome,
    VerifyCheck,
    VerifyInput,
    drain_reason,
)
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from tests.support.fake_scheduler import FakeScheduler

CLUSTER = "dev"
INCIDENT = "relaunch-dev-42-0"
REASON = drain_reason(INCIDENT)
# 20 nodes in the job's partition: the default policy (10 %, cap 4) lets Relaunch take 2 out.
NODES = [f"n{i}" for i in range(1, 21)]


class MemoryAudit:
    """The parts of AuditStore the action activities use, in memory: rows with their dedupe
    keys, the drains the blast-radius guard counts, and the cluster's drain lock."""

    def __init__(self) -> None:
        self.rows: list[StoredEvent] = []
        self._keys: set[str] = set()
        self._lock = asyncio.Lock()
        self.locked = 0  # how many times the drain lock was taken

    async def record(self, record: AuditRecord, *, dedupe_key: str | None = None) -> bool:
        if dedupe_key is not None:
            if dedupe_key in self._keys:
                return False
            self._keys.add(dedupe_key)
        self.rows.append(StoredEvent(id=len(self.rows) + 1, **record.model_dump()))
        return True

    async def events(self, incident_id: str) -> list[StoredEvent]:
        return [r for r in self.rows if r.incident_id == incident_id]

    async def drained_nodes(self, cluster: str, since: datetime) -> list[str]:
        return sorted(
            {
                node
                for r in self.rows
                if r.kind == "action" and r.data.get("step") == "drain" and r.data.get("changed")
                if r.at >= since
                for node in r.nodes
            }
        )

    @contextlib.asynccontextmanager
    async def drain_lock(self, cluster: str, *, hang_limit_s: float = 300.0) -> AsyncIterator[None]:
        async with self._lock:
            self.locked += 1
            yield

    async def node_stages(self, cluster: str) -> dict[str, StoredEvent]:
        latest: dict[str, StoredEvent] = {}
        for r in self.rows:
            if r.kind == "node_stage" and r.nodes:
                latest[r.nodes[0]] = r
        return latest

    def kinds(self, kind: str) -> list[StoredEvent]:
        return [r for r in self.rows if r.kind == kind]

    async def outside_events(
        self,
        cluster: str,
        since: datetime,
        *,
        kinds: Sequence[str] = OUTSIDE_KINDS,
        nodes: Sequence[str] | None = None,
        limit: int = 500,
        trusted: bool | None = None,
    ) -> list[StoredEvent]:
        rows = [
            r
            for r in self.rows
            if r.incident_id == intake_incident(cluster)
            and r.kind in kinds
            and r.at >= since
            and (nodes is None or set(r.nodes) & set(nodes))
            and (trusted is None or (r.data.get("trusted") is True) == trusted)
        ]
        return rows[-limit:]


def cluster(*jobs: Job) -> FakeScheduler:
    nodes = [Node(name=n, state=NodeState.IDLE, partitions=["gpu"]) for n in NODES]
    return FakeScheduler(nodes=nodes, jobs=jobs)


def running_job(**changes: Any) -> Job:
    fields: dict[str, Any] = {
        "job_id": "42",
        "user": "alice",
        "partition": "gpu",
        "state": JobState.RUNNING,
        "nodes": ["n1", "n2"],
        "node_count": 2,
        "requeue_allowed": True,
    }
    return Job(**{**fields, **changes})


def activities(sched: FakeScheduler, audit: MemoryAudit | None = None) -> ActionActivities:
    config = ClusterConfig(name=CLUSTER, database_url="postgresql://unused", bundle_dir="/tmp")
    deps = Deps(
        config=config,
        scheduler=sched,  # Deps takes the Scheduler protocol, which FakeScheduler satisfies
        audit=cast(AuditStore, audit if audit is not None else MemoryAudit()),
    )
    return ActionActivities(deps)


def act(**plan: Any) -> ActInput:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "action": Action.ISOLATE_AND_RESTART,
        "mode": Mode.AUTONOMOUS,
        "job_id": "42",
        "expected_restart_count": 0,
    }
    return ActInput(incident_id=INCIDENT, cluster=CLUSTER, plan=ActionPlan(**{**fields, **plan}))


async def run(fn: Any, inp: Any) -> StepOutcome:
    return cast(StepOutcome, await ActivityEnvironment().run(fn, inp))


def test_the_fake_scheduler_is_a_scheduler() -> None:
    sched: Scheduler = cluster()  # checked statically by mypy, and here at run time
    assert isinstance(sched, Scheduler)


# ---------------------------------------------------------------- isolate


async def test_isolate_drains_and_fences_the_plan_s_nodes() -> None:
    sched, audit = cluster(running_job()), MemoryAudit()
    outcome = await run(
        activities(sched, audit).isolate, act(drain_nodes=["n2"], fence_nodes=["n3"])
    )
    assert outcome == StepOutcome(ok=True, changed=True, detail="n2: drained; n3: marked down")
    assert sched.drains == ["n2"] and sched.fences == ["n3"]
    # The guard was re-checked on a fresh read of the nodes, under the cluster's drain lock,
    # before anything was drained.
    names = [c[0] for c in sched.calls]
    assert names.index("list_nodes") < names.index("drain_node") and audit.locked == 1
    # A fresh read shows the drain with the incident's reason, and the audit names the node.
    drained = await sched.get_node("n2")
    assert drained.drain_flag and drained.reason == REASON
    assert (await sched.get_node("n3")).state is NodeState.DOWN
    assert [(r.nodes, r.data["step"]) for r in audit.kinds("action")] == [
        (["n2"], "drain"),
        (["n3"], "fence"),
    ]


async def test_isolate_run_again_drains_nothing_twice() -> None:
    """A retry (a worker died after the drain, before the answer) finds the node drained with
    this incident's reason: nothing is drained again, and it still counts as this drain."""
    sched, audit = cluster(running_job()), MemoryAudit()
    acts = activities(sched, audit)
    await run(acts.isolate, act(drain_nodes=["n2"]))
    again = await run(acts.isolate, act(drain_nodes=["n2"]))
    assert sched.drains == ["n2"]
    assert len(sched.calls_to("drain_node")) == 2  # asked twice, drained once
    # Still reported as this incident's drain (the guard counts it), under the same audit row.
    assert again == StepOutcome(ok=True, changed=True, detail="n2: drained")
    (row,) = audit.kinds("action")
    assert row.data["changed"] is True
    assert await audit.drained_nodes(CLUSTER, datetime.min.replace(tzinfo=UTC)) == ["n2"]


async def test_a_node_an_operator_already_drained_is_not_drained_again() -> None:
    sched = cluster(running_job())
    sched.set_node("n2", flags=["DRAIN"], reason="bad fan (ops)")
    outcome = await run(activities(sched).isolate, act(drain_nodes=["n2"]))
    assert sched.drains == []
    assert outcome.ok and not outcome.changed
    assert outcome.detail == "n2: already draining/drained: bad fan (ops)"
    assert (await sched.get_node("n2")).reason == "bad fan (ops)"  # the operator's reason kept


async def test_a_drain_the_fresh_state_refuses_is_reported_not_ok() -> None:
    """Planned when nothing was drained; by the time isolate runs, other recoveries have taken
    two nodes out (Slurm's drain reason says Relaunch did): a third exceeds the limit."""
    sched, audit = cluster(running_job()), MemoryAudit()
    for node in ("n7", "n8"):
        sched.set_node(node, flags=["DRAIN"], reason=drain_reason("relaunch-dev-7-0"))
    outcome = await run(activities(sched, audit).isolate, act(drain_nodes=["n2"]))
    assert not outcome.ok and not outcome.changed
    assert "REFUSED at drain time" in outcome.detail and "n2 not drained" in outcome.detail
    assert sched.drains == [] and not sched.calls_to("drain_node")
    (guard,) = audit.kinds("guard")
    assert guard.nodes == ["n2"] and guard.data["allowed"] is False
    assert guard.data["out_of_service"] == ["n7", "n8"]


async def test_an_operator_s_override_lets_a_refused_drain_through() -> None:
    sched, audit = cluster(running_job()), MemoryAudit()
    for node in ("n7", "n8"):
        sched.set_node(node, flags=["DRAIN"], reason=drain_reason("relaunch-dev-7-0"))
    await audit.record(
        AuditRecord(
            incident_id=INCIDENT,
            kind="approval",
            at=datetime.now(UTC),
            actor="ops",
            data={"override": True},
        )
    )
    outcome = await run(
        activities(sched, audit).isolate, act(drain_nodes=["n2"], needs_override=True)
    )
    assert outcome.ok and sched.drains == ["n2"]
    (guard,) = audit.kinds("guard")
    assert guard.data["overridden"] is True and "overridden" in guard.summary


async def test_a_plan_without_nodes_isolates_nothing() -> None:
    sched = cluster(running_job())
    outcome = await run(activities(sched).isolate, act())
    assert outcome == StepOutcome(ok=True, detail="nothing to isolate")
    assert sched.calls == []


# ---------------------------------------------------------------- restart


async def test_restart_requeues_once() -> None:
    sched, audit = cluster(running_job()), MemoryAudit()
    acts = activities(sched, audit)
    first = await run(acts.restart, act())
    assert first == StepOutcome(ok=True, changed=True, detail="requeued")
    assert sched.requeues == ["42"]
    assert sched.jobs["42"].restart_count == 1
    # Slurm starts the requeued job again elsewhere; the retried step must not requeue it.
    sched.set_job("42", state=JobState.RUNNING, nodes=["n3", "n4"])
    second = await run(acts.restart, act())
    assert second == StepOutcome(ok=True, changed=False, detail="already requeued")
    assert sched.requeues == ["42"]
    (row,) = audit.kinds("action")  # the retry's "unchanged" is the same audit row
    assert row.data["changed"] is True


async def test_restart_excludes_the_culprits_from_the_requeued_job() -> None:
    sched, audit = cluster(running_job()), MemoryAudit()
    outcome = await run(activities(sched, audit).restart, act(exclude_nodes=["n2"]))
    assert outcome.ok and outcome.detail == "requeued; excluded n2"
    assert sched.exclusions == [("42", ("n2",))]
    assert sched.jobs["42"].excluded_nodes == ["n2"]
    assert [r.data["step"] for r in audit.kinds("action")] == ["restart", "exclude"]


async def test_restart_does_not_undo_someone_else_s_cancel() -> None:
    sched = cluster(running_job(state=JobState.CANCELLED))
    with pytest.raises(ApplicationError) as caught:
        await run(activities(sched).restart, act())
    assert caught.value.type == "InvalidStateError" and caught.value.non_retryable
    assert "cancelled after this recovery began" in caught.value.message
    assert sched.requeues == [] and sched.submissions == []


async def test_a_resubmission_cancels_then_submits_once() -> None:
    sched, audit = cluster(running_job()), MemoryAudit()
    acts = activities(sched, audit)
    plan = act(restart_method=RestartMethod.RESUBMIT, exclude_nodes=["n2"])
    first = await run(acts.restart, plan)
    assert first.ok and first.changed and first.new_job_id == "43"
    assert sched.cancels == ["42"] and sched.submissions == ["43"]
    assert sched.jobs["43"].excluded_nodes == ["n2"]
    assert sched.jobs["43"].comment_fields["relaunch_parent"] == "42"
    # Retried: the job is cancelled (by this recovery, as the audit says), its child exists.
    again = await run(acts.restart, plan)
    assert again.ok and not again.changed and again.new_job_id == "43"
    assert sched.cancels == ["42"] and sched.submissions == ["43"]


# ---------------------------------------------------------------- hold


async def test_hold_holds_a_pending_job_once() -> None:
    sched, audit = cluster(running_job(state=JobState.PENDING, nodes=[])), MemoryAudit()
    acts = activities(sched, audit)
    first = await run(acts.hold, act(action=Action.HOLD))
    assert first == StepOutcome(ok=True, changed=True, detail="held")
    assert sched.jobs["42"].held
    again = await run(acts.hold, act(action=Action.HOLD))
    assert again == StepOutcome(ok=True, changed=False, detail="already held")
    assert sched.holds == ["42"]
    (row,) = audit.kinds("action")
    assert row.summary == "hold 42: done"


async def test_hold_leaves_a_running_job_to_a_human() -> None:
    sched = cluster(running_job())
    outcome = await run(activities(sched).hold, act(action=Action.HOLD))
    assert outcome.ok and not outcome.changed
    assert outcome.detail == "job 42 is RUNNING: nothing to hold, left for a human"
    assert sched.holds == [] and not sched.calls_to("hold_job")


# ---------------------------------------------------------------- verify


def verify_input() -> VerifyInput:
    return VerifyInput(incident_id=INCIDENT, cluster=CLUSTER, job_id="42", avoid_nodes=["n2"])


async def look(fn: Any, inp: VerifyInput) -> VerifyCheck:
    return cast(VerifyCheck, await ActivityEnvironment().run(fn, inp))


async def test_verify_passes_when_the_job_runs_away_from_the_avoided_nodes() -> None:
    sched, audit = cluster(running_job(nodes=["n3", "n4"], restart_count=1)), MemoryAudit()
    check = await look(activities(sched, audit).verify_check, verify_input())
    assert check == VerifyCheck(done=True, detail="RUNNING on n3,n4")
    assert sched.calls == [("get_job_brief", "42")]  # one look through the cheap brief listing
    (row,) = audit.kinds("verify")
    assert row.nodes == ["n3", "n4"] and row.data == {"job_id": "42", "nodes": ["n3", "n4"]}


async def test_verify_passes_on_an_avoided_node_its_lifecycle_returned_since() -> None:
    """The job runs on the culprit its node decision drained, after the node's lifecycle
    validated it and returned it to service: a healthy node by Relaunch's own checks. One the
    lifecycle returned before this recovery began, or has not returned, is still avoided."""
    sched = cluster(running_job(nodes=["n2"], restart_count=1))
    audit = MemoryAudit()
    began = datetime.now(UTC)
    await audit.record(AuditRecord(incident_id=INCIDENT, kind="stage", at=began, stage="gathering"))
    returned = AuditRecord(
        incident_id="relaunch-test-lifecycle-n2-1",
        kind="node_stage",
        at=began,
        stage="returned",
        nodes=["n2"],
    )
    await audit.record(returned)  # not after the recovery began: still avoided
    check = await look(activities(sched, audit).verify_check, verify_input())
    assert not check.done and not check.failed and check.detail == "RUNNING on n2", check
    assert audit.kinds("verify") == []
    await audit.record(returned.model_copy(update={"at": datetime.now(UTC)}))
    check = await look(activities(sched, audit).verify_check, verify_input())
    assert check == VerifyCheck(done=True, detail="RUNNING on n2")


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        pytest.param(
            running_job(state=JobState.PENDING, nodes=[], reason="Resources"),
            VerifyCheck(detail="PENDING on - Resources"),
            id="still-pending",
        ),
        pytest.param(
            running_job(nodes=["n2", "n3"]),
            VerifyCheck(detail="RUNNING on n2,n3"),
            id="on-an-avoided-node",
        ),
        pytest.param(
            running_job(state=JobState.FAILED),
            VerifyCheck(failed=True, detail="job 42 ended (FAILED)"),
            id="ended",
        ),
    ],
)
async def test_verify_waits_or_fails_while_the_job_is_not_running_on_healthy_nodes(
    job: Job, expected: VerifyCheck
) -> None:
    sched, audit = cluster(job), MemoryAudit()
    check = await look(activities(sched, audit).verify_check, verify_input())
    assert check == expected
    assert audit.kinds("verify") == []
