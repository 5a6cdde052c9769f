"""End-to-end recoveries on the real stack: real Slurm, Temporal, PostgreSQL and the real DDP
training job; a real worker and watcher in their own processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client

from relaunch.devstack.services import temporal_binary
from relaunch.devstack.stack import Stack
from relaunch.models.recovery import (
    Approval,
    AuditRecord,
    Detection,
    DetectionSource,
    Mode,
    Policy,
    Stage,
)
from relaunch.models.scheduler import JobState
from relaunch.workflows import recovery_client
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
RELAUNCH = [sys.executable, "-m", "relaunch.cli"]


async def save_history(h: Harness, incident: str, name: str) -> None:
    """Keep the history for the replay tests (re-recorded with RELAUNCH_RECORD_HISTORIES=1)."""
    if os.environ.get("RELAUNCH_RECORD_HISTORIES") != "1":
        return
    history = await h.handle(incident).fetch_history()
    HISTORIES.mkdir(exist_ok=True)
    (HISTORIES / f"{name}.json").write_text(history.to_json())


async def actions(h: Harness, incident: str, step: str) -> list[dict[str, object]]:
    return [e.data for e in await h.events(incident, "action") if e.data.get("step") == step]


async def start_training(h: Harness, *args: str) -> tuple[str, list[str], int]:
    job_id = h.submit_ddp(*args)
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    saved = await h.wait_log(job_id, r"checkpoint saved step=(\d+)")
    return job_id, job.nodes, int(saved.group(1))


async def test_autonomous_node_failure_recovers_on_healthy_nodes(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120))
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    culprit = nodes[1]
    await h.wait_log(job_id, r"checkpoint saved step=(1[05]|[2-9]\d)")
    last_ckpt = int(re.findall(r"checkpoint saved step=(\d+)", h.log(job_id))[-1])
    h.kill_node(culprit, job_id)

    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.DONE}, timeout=180)
    assert status.verdict is not None and status.verdict.culprit_nodes == [culprit]
    assert status.verdict.category.value in {"gpu_hardware", "node_failure"}

    # The node's decision drained it (once, whatever other jobs it took down) and requeued
    # the job; the job's recovery joined it and verified the restart.
    decision = status.node_decision
    assert decision == f"relaunch-{h.config.name}-node-{culprit}-1"
    assert status.node_decisions == {culprit: decision}
    node = await h.sched.get_node(culprit)
    assert node.drain_flag and decision in node.reason
    job = await h.sched.get_job(job_id)
    assert job.state is JobState.RUNNING and culprit not in job.nodes
    assert job.restart_count == 1
    resumed = await h.wait_log(job_id, r"resumed from checkpoint step=(\d+)")
    assert int(resumed.group(1)) >= last_ckpt

    kinds = [e.kind for e in await h.events(incident)]
    for kind in ("detection", "evidence", "verdict", "node_decision", "action", "verify", "stage"):
        assert kind in kinds
    restarts = await actions(h, incident, "restart")
    assert [(r["changed"], r["node_decision"]) for r in restarts] == [(True, decision)]
    stages = [e.stage for e in await h.events(incident, "stage")]
    assert stages[0] == "gathering" and stages[-1] == "done"
    drains = await actions(h, decision, "drain")
    assert [(d["target"], d["changed"]) for d in drains] == [(culprit, True)]
    await save_history(h, incident, "autonomous_node_failure_joined")
    await save_history(h, decision, "node_decision_autonomous")

    # What an operator reads afterwards.
    cfg = ["--config", str(h.config_path)]
    listed = subprocess.run(
        [*RELAUNCH, "incidents", "--json", "--node", culprit, *cfg],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {(r["id"], r["nodes"][0]) for r in rows} == {(incident, culprit), (decision, culprit)}
    # The decision stays open a while for late joiners of the same failure.
    assert {r["id"]: r["stage"] for r in rows} == {incident: "done", decision: "acting"}
    shown = subprocess.run(
        [*RELAUNCH, "show", incident, *cfg], capture_output=True, text=True, check=True
    ).stdout
    assert f"node decision {decision}" in shown
    assert f"drain {culprit}: done" in shown and "verify" in shown
    assert f"/workflows/{incident}" in shown
    reputation = subprocess.run(
        [*RELAUNCH, "nodes", "--json", *cfg], capture_output=True, text=True, check=True
    )
    by_node = {r["node"]: r for r in map(json.loads, reputation.stdout.splitlines())}
    assert by_node[culprit]["incidents"] >= 1 and incident in by_node[culprit]["recent"]
    assert set(by_node) == {culprit}  # the healthy node of the job is not implicated


async def test_monitor_waits_then_approval_by_temporal_cli_recovers(
    make_harness: MakeHarness, stack: Stack
) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR, verify_timeout_s=120))
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    culprit = nodes[0]
    h.inject_xid(culprit)  # a GPU fault on a live node: the job keeps running meanwhile
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=60)
    # The node's decision awaits the approval; the job's recovery waits for it.
    decision = status.node_decision
    assert decision is not None and status.awaiting_approval and status.covers == 1
    listed = subprocess.run(
        [
            str(temporal_binary()),
            "workflow",
            "list",
            "--address",
            stack.temporal_address,
            "--query",
            f'RelaunchAwaitingApproval=true AND RelaunchNodes="{culprit}"',
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert decision in listed.stdout
    assert not (await h.sched.get_node(culprit)).drain_flag  # nothing happened yet

    subprocess.run(
        [
            str(temporal_binary()),
            "workflow",
            "signal",
            "--address",
            stack.temporal_address,
            "--workflow-id",
            incident,
            "--name",
            "approve",
            "--input",
            '{"by":"ana"}',
        ],
        check=True,
        capture_output=True,
    )
    await h.wait_stage(incident, {Stage.DONE}, timeout=180)
    assert (await h.sched.get_node(culprit)).drain_flag
    job = await h.sched.get_job(job_id)
    assert culprit not in job.nodes and job.restart_count == 1
    # The approval sent to the job's recovery went to its node decision, which it covers.
    approvals = await h.events(decision, "approval")
    assert [a.actor for a in approvals] == ["ana"]
    assert approvals[0].data["covers"] == [incident]
    await save_history(h, incident, "monitor_approved_joined")
    await save_history(h, decision, "node_decision_monitor_approved")


async def test_monitor_rejection_and_expiry_take_no_action(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR, approval_timeout_s=4))
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    h.inject_xid(nodes[1])
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=60)
    result = await h.handle(incident).result()
    assert result.stage is Stage.EXPIRED
    assert not (await h.sched.get_node(nodes[1])).drain_flag
    assert (await h.sched.get_job(job_id)).restart_count == 0
    await save_history(h, incident, "monitor_expired")

    # A second job on the same cluster, rejected by an operator through the CLI.
    h2 = make_harness(Policy(mode=Mode.MONITOR))
    h2.start("worker")
    h2.start("watch")
    job2, nodes2, _ = await start_training(h2)
    h2.inject_xid(nodes2[0])
    incident2 = h2.incident(job2)
    await h2.wait_stage(incident2, {Stage.AWAITING_APPROVAL}, timeout=60)
    rejected = subprocess.run(
        [
            *RELAUNCH,
            "reject",
            incident2,
            "--by",
            "bob",
            "--reason",
            "known flaky sensor",
            "--config",
            str(h2.config_path),
        ],
        capture_output=True,
        text=True,
    )
    assert rejected.returncode == 0, rejected.stderr
    assert (await h2.handle(incident2).result()).stage is Stage.REJECTED
    # Rejecting the job's recovery rejected its node decision (which it covers).
    decision2 = (await h2.handle(incident2).query(RecoveryWorkflow.status)).node_decision
    assert decision2 is not None
    rows = await h2.events(decision2, "rejection")
    assert rows and rows[0].actor == "bob" and "known flaky sensor" in rows[0].summary
    assert not await actions(h2, decision2, "drain")
    assert not (await h2.sched.get_node(nodes2[0])).drain_flag
    assert (await h2.sched.get_job(job2)).restart_count == 0


async def test_application_error_is_held_without_drain(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS))
    h.start("worker")
    h.start("watch")
    job_id = h.submit_ddp("--fail-at-step", "12", "--fail-rank", "1")
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.HELD}, timeout=120)
    assert status.verdict is not None and status.verdict.category.value == "application"
    assert status.verdict.culprit_nodes == []
    assert not await actions(h, incident, "drain")
    assert all(not n.drain_flag for n in await h.sched.list_nodes())
    # The failing rank takes the job down (srun --kill-on-bad-exit); nothing restarts it.
    job = await wait_job(h.sched, job_id, JobState.FAILED, timeout=60)
    assert job.restart_count == 0
    await save_history(h, incident, "application_held")


async def test_worker_killed_mid_recovery_completes_exactly_once(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120))
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    culprit = nodes[1]
    h.kill_node(culprit, job_id)
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.ISOLATING, Stage.ACTING, Stage.VERIFYING}, timeout=90)
    h.kill("worker")  # SIGKILL, mid-recovery
    h.start("worker")
    result = await h.handle(incident).result()
    assert result.stage is Stage.DONE, result.outcome
    # The node decision drained the node once; the job was requeued once, by its batch.
    assert result.node_decision is not None
    drains = [a for a in await actions(h, result.node_decision, "drain") if a["changed"]]
    restarts = [a for a in await actions(h, incident, "restart") if a["changed"]]
    assert len(drains) == 1 and len(restarts) == 1
    assert restarts[0]["node_decision"] == result.node_decision
    assert (await h.sched.get_job(job_id)).restart_count == 1


async def test_two_detections_of_one_interruption_make_one_workflow(
    make_harness: MakeHarness, temporal_client: Client
) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR))
    h.start("worker")
    job_id, nodes, _ = await start_training(h)
    now = datetime.now(UTC)
    log_det = Detection(
        cluster=h.config.name,
        job_id=job_id,
        attempt=0,
        source=DetectionSource.JOB_LOG,
        kind="signature:gloo_connection_closed",
        text="Connection closed by peer",
        detected_at=now,
    )
    node_det = Detection(
        cluster=h.config.name,
        job_id=job_id,
        attempt=0,
        source=DetectionSource.SCHEDULER,
        kind="node_state:DOWN",
        nodes=[nodes[1]],
        detected_at=now,
    )
    assert await recovery_client.start_or_join(temporal_client, h.config, log_det)
    await recovery_client.start_or_join(temporal_client, h.config, node_det)
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.AWAITING_APPROVAL, Stage.NO_ACTION, Stage.HELD}, timeout=60)
    runs = [w async for w in temporal_client.list_workflows(f'WorkflowId="{incident}"')]
    assert len(runs) == 1
    await h.until(lambda: _count(h, incident, "detection", 2), "two detection rows")
    status = await h.handle(incident).query(RecoveryWorkflow.status)
    assert status.detections == 2
    if status.awaiting_approval:
        await h.handle(incident).signal(RecoveryWorkflow.reject, Approval(by="test"))


async def _count(h: Harness, incident: str, kind: str, n: int) -> bool:
    return len(await h.events(incident, kind)) >= n


async def _seed(h: Harness, incident: str, job_id: str, step: str, node: str | None) -> None:
    await h.audit.ensure_incident(incident, h.config.name, job_id, 0)
    await h.audit.record(
        AuditRecord(
            incident_id=incident,
            kind="action",
            at=datetime.now(UTC),
            nodes=[node] if node else [],
            summary=f"seeded {step}",
            data={"step": step, "changed": True},
        )
    )


async def test_blast_radius_guard_refuses_and_says_so(make_harness: MakeHarness) -> None:
    # The guard as a recovery's own plan meets it (a node decision's: test_node_decision.py).
    h = make_harness(
        Policy(mode=Mode.AUTONOMOUS, drain_share=0.10, drain_cap=4, node_decisions=False)
    )
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    # An earlier incident's drain that is still in force: 1 of 4 nodes, the whole 10% share.
    earlier = next(n.name for n in await h.sched.list_nodes() if n.name not in nodes)
    await h.sched.drain_node(earlier, "relaunch incident earlier")
    await _seed(h, f"relaunch-{h.config.name}-earlier-0", "earlier", "drain", earlier)
    h.inject_xid(nodes[1])
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.HELD}, timeout=90)
    # The plan stands as an override an operator could approve; autonomous mode holds it.
    assert status.plan is not None and status.plan.needs_override
    assert "guard refused" in status.outcome and "blast_radius" in status.outcome
    guards = await h.events(incident, "guard")
    assert any("blast_radius: REFUSED" in g.summary for g in guards)
    assert not (await h.sched.get_node(nodes[1])).drain_flag
    assert not await actions(h, incident, "restart")
    await save_history(h, incident, "autonomous_guard_held")


async def test_an_operator_overrides_a_refused_guard_and_it_is_audited(
    make_harness: MakeHarness,
) -> None:
    """Monitor mode asks a human even when the guard refuses (the recommendation says so);
    approving it is an override: the node is drained past the guard, and the audit says who."""
    h = make_harness(
        Policy(
            mode=Mode.MONITOR,
            drain_share=0.10,
            drain_cap=4,
            verify_timeout_s=120,
            node_decisions=False,  # the override of a recovery's own plan
        )
    )
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    earlier = next(n.name for n in await h.sched.list_nodes() if n.name not in nodes)
    await h.sched.drain_node(earlier, "relaunch incident earlier")
    await _seed(h, f"relaunch-{h.config.name}-earlier-0", "earlier", "drain", earlier)
    h.inject_xid(nodes[1])
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=90)
    assert status.plan is not None and status.plan.needs_override
    assert status.plan.drain_nodes == [nodes[1]]
    asked = await h.stage_row(incident, Stage.AWAITING_APPROVAL)
    assert "blast_radius" in asked.summary and "approving overrides it" in asked.summary
    assert not (await h.sched.get_node(nodes[1])).drain_flag

    await h.handle(incident).signal(
        RecoveryWorkflow.approve, Approval(by="ana", reason="its GPU is gone")
    )
    await h.wait_stage(incident, {Stage.DONE}, timeout=180)
    assert incident in (await h.sched.get_node(nodes[1])).reason
    assert nodes[1] not in (await h.sched.get_job(job_id)).nodes
    approvals = await h.events(incident, "approval")
    assert [(a.actor, a.data.get("override")) for a in approvals] == [("ana", True)]
    assert "override approved by ana" in approvals[0].summary
    guards = await h.events(incident, "guard")
    assert any("overridden by an operator" in g.summary for g in guards)
    await save_history(h, incident, "monitor_override_approved")


async def test_exhausted_restart_budget_holds(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, restart_budget=2))
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    for i in range(2):
        await _seed(h, f"relaunch-{h.config.name}-{job_id}-seed{i}", job_id, "restart", None)
    h.inject_xid(nodes[1])
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.HELD}, timeout=90)
    # The node's decision drained it; its batch found the job's budget spent and left the job
    # to its recovery, which held it.
    guards = await h.events(incident, "guard")
    assert any("restart_budget: REFUSED" in g.summary for g in guards)
    assert (await h.sched.get_job(job_id)).restart_count == 0
    assert status.node_decision is not None and "restart_budget" in status.outcome


async def test_a_job_cancelled_while_awaiting_approval_is_not_restarted(
    make_harness: MakeHarness,
) -> None:
    """The user gives up on the job (scancel) while the recommendation waits: an approval
    that comes later must not bring the job back."""
    h = make_harness(Policy(mode=Mode.MONITOR, verify_timeout_s=60))
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    h.inject_xid(nodes[0])
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=60)
    env = {**os.environ, **h.stack.slurm_env}
    subprocess.run(["scancel", job_id], env=env, check=True, timeout=30)
    await wait_job(h.sched, job_id, JobState.CANCELLED, timeout=60)
    await h.handle(incident).signal(RecoveryWorkflow.approve, Approval(by="ana"))
    status = await h.wait_stage(incident, {Stage.DONE, Stage.FAILED}, timeout=120)
    assert status.stage is Stage.FAILED and "cancelled after this recovery began" in status.outcome
    job = await h.sched.get_job(job_id)
    assert job.state is JobState.CANCELLED and job.restart_count == 0
    assert not [e for e in await h.events(incident, "action") if e.data.get("step") == "restart"]
