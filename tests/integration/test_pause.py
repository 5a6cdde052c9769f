"""The kill switch on the real stack (real Slurm, Temporal, PostgreSQL, worker and watcher
processes): while the cluster is paused an approved drain does not happen; `relaunch unpause`
lets it happen without anyone approving again; both are audit rows with who and why. And
monitor mode holds nothing without an approval."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from relaunch.devstack.stack import Stack
from relaunch.models.pause import control_incident
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job

RELAUNCH = [sys.executable, "-m", "relaunch.cli"]


def relaunch(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RELAUNCH, *args, "--config", str(h.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_an_approved_drain_waits_for_the_unpause(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR, verify_timeout_s=120))
    h.start("worker")
    h.start("watch")
    job_id = h.submit_ddp()
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    await h.wait_log(job_id, r"checkpoint saved step=(\d+)")
    culprit = job.nodes[0]

    # A pause needs who and why; without them nothing is recorded.
    refused = relaunch(h, "pause", "--by", "ops")
    assert refused.returncode == 2 and "a pause needs --reason TEXT" in refused.stderr
    paused = relaunch(h, "pause", "--by", "ops", "--reason", "switch maintenance")
    assert paused.returncode == 0, paused.stderr
    assert f"cluster {h.config.name} is paused by ops: switch maintenance" in paused.stdout

    h.inject_xid(culprit)  # a GPU fault on a live node: detection and planning go on
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=90)
    decision = status.node_decision
    assert decision is not None
    approved = relaunch(h, "approve", incident, "--by", "ana")
    assert approved.returncode == 0, approved.stderr + approved.stdout

    # The approval is kept, the drain waits: a fresh read of Slurm for several seconds.
    await h.until(
        lambda: _has(h, decision, "paused"), "no `paused` row in the decision's trail", 60
    )
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert not (await h.sched.get_node(culprit)).drain_flag, "drained while paused"
        await asyncio.sleep(0.5)
    assert [a.actor for a in await h.events(decision, "approval")] == ["ana"]
    assert not await h.events(decision, "action")
    shown = relaunch(h, "paused")
    assert "is paused by ops: switch maintenance" in shown.stdout

    started = time.monotonic()
    unpaused = relaunch(h, "unpause", "--by", "ops")
    assert unpaused.returncode == 0, unpaused.stderr
    await h.until(
        lambda: _drained(h, culprit, decision), f"{culprit} not drained after the unpause", 180
    )
    took = time.monotonic() - started
    await h.wait_stage(incident, {Stage.DONE}, timeout=180)
    assert culprit not in (await h.sched.get_job(job_id)).nodes
    print(f"drained {took:.1f}s after the unpause")

    rows = await h.events(control_incident(h.config.name))
    assert [(r.kind, r.actor, r.data.get("reason")) for r in rows] == [
        ("pause", "ops", "switch maintenance"),
        ("unpause", "ops", ""),
    ]


async def test_monitor_mode_holds_nothing_without_an_approval(make_harness: MakeHarness) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR, approval_timeout_s=600))
    h.start("worker")
    h.start("watch")
    job_id = h.submit_ddp("--fail-at-step", "12", "--fail-rank", "1")
    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=120)
    assert status.plan is not None and status.plan.action.value == "hold"
    await asyncio.sleep(3)
    assert not await h.events(incident, "action")
    assert (
        await h.handle(incident).query(RecoveryWorkflow.status)
    ).stage is Stage.AWAITING_APPROVAL


async def _has(h: Harness, incident: str, kind: str) -> bool:
    return bool(await h.events(incident, kind))


async def _drained(h: Harness, node: str, decision: str) -> bool:
    found = await h.sched.get_node(node)
    return found.drain_flag and decision in found.reason


def test_dev_status_says_which_cluster_is_paused(stack: Stack) -> None:
    cluster = stack.clusters[0].name
    where = ["--cluster", cluster, "--state-dir", str(stack.state_dir)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*RELAUNCH, *args], capture_output=True, text=True, timeout=120)

    paused = run("pause", "--by", "ops", "--reason", "rack 4 power work", *where)
    assert paused.returncode == 0, paused.stderr
    try:
        status = run("dev", "status", "--state-dir", str(stack.state_dir))
        line = next(s for s in status.stdout.splitlines() if f"kill switch {cluster}" in s)
        assert "PAUSED by ops: rack 4 power work" in line and line.lstrip().startswith("ok")
    finally:
        assert run("unpause", "--by", "ops", *where).returncode == 0
    status = run("dev", "status", "--state-dir", str(stack.state_dir))
    assert any(
        f"kill switch {cluster}" in s and "not paused" in s for s in status.stdout.splitlines()
    )
