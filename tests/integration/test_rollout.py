"""Earning autonomy on the real stack: a series of real recoveries, operators' answers and
outcomes, and the scorecard, its suggestions and the staged rollout they lead to.

On the session's second Slurm cluster ("life", where node lifecycles may run), with a real
worker and watcher and a policy that is autonomous on the canary partition `batch` only:

1. Four exclusive jobs. Job A's node dies with an Xid 79 line (debug: monitor) while job D's
   processes are killed under an Xid line on a node that stays healthy (batch: the canary).
   D's node is drained at once while A's decision waits for a person: the canary acts, the
   rest waits. An approval drains A's node; both nodes go to their lifecycles. A's node fails
   its diagnosis (the drain was right); D's passes its checks (a wrong autonomous drain) and is
   returned to service.
2. The scorecard then: one approved and right decision in gpu_hardware and debug (a bar of one
   decision: both suggested for promotion), one wrong autonomous drain (demote batch).
3. Jobs B and C fail the same way on healthy nodes in debug: B is rejected, C expires. Every
   number of the scorecard checked; gpu_hardware and debug no longer meet the bar; the
   restarted jobs A and D ran the window out (two right restarts).
4. A promotion recorded with `relaunch rollout promote --partition debug` takes effect at the
   next plan: a new debug job fails on D's node, and the node is drained without anyone asked.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.devstack import faults
from relaunch.devstack.stack import Stack
from relaunch.models.lifecycle import LifecycleSettings, lifecycle_id
from relaunch.models.recovery import AutoAction, Mode, Policy, Stage
from relaunch.models.rollout import RolloutSettings
from relaunch.models.scheduler import JobState
from tests.conftest import sbatch
from tests.integration.conftest import MakeHarness
from tests.integration.harness import REPO, Harness
from tests.integration.helpers import restore_lifecycles

pytestmark = pytest.mark.xdist_group("lifecycle")
CLUSTER = "life"
WINDOW_S = 5.0


def relaunch(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relaunch.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def scorecard(h: Harness) -> dict[str, Any]:
    out = relaunch(h.config_path, "scorecard", "--json")
    assert out.returncode == 0, out.stderr
    card: dict[str, Any] = json.loads(out.stdout)
    return card


def suggested(card: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(s["change"], s["scope"], s["name"]) for s in card["suggestions"]}


def scope(card: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    cards: list[dict[str, Any]] = card["categories" if kind == "category" else "partitions"]
    return next(c for c in cards if c["name"] == name)


async def test_scorecard_suggestions_canary_and_promotion(
    stack: Stack, make_harness: MakeHarness, temporal_client: Client
) -> None:
    home = stack.home(CLUSTER)
    layout = home.slurm
    sched = stack.scheduler(CLUSTER)
    env = {**os.environ, **layout.env}
    h = make_harness(
        Policy(
            mode=Mode.AUTONOMOUS,
            canary_partition="batch",
            # The monitor-mode lifecycle's checks and tickets run unasked: the scorecard's story.
            auto_actions=[AutoAction.CHECKS, AutoAction.REPAIR_TICKET],
            approval_timeout_s=15,
            verify_timeout_s=90,
            drain_share=1.0,
            drain_cap=10,
        )
    )
    h.sched = sched
    lifecycle = LifecycleSettings.model_validate(
        {**stack.lifecycle_settings(home).model_dump(), "settle_s": 1.0, "mode": Mode.MONITOR}
    )
    h.configure(
        **layout.config_fields,
        lifecycle=lifecycle,
        rollout=RolloutSettings(
            restart_ok_after_s=WINDOW_S, promote_min_decisions=1, promote_min_share=0.95
        ),
    )
    name = h.config.name
    audit = await AuditStore.open(stack.database_url)
    try:
        h.start("worker")
        h.start("watch")
        try:
            await _series(h, layout, sched, env, audit, home)
        except AssertionError:
            await _dump(audit, name)  # what the trail says, in the failure's output
            raise
    finally:
        await audit.close()
        for proc in list(h.procs):
            h.kill(proc)
        await restore_lifecycles(home, sched, name, temporal_client)


async def _series(
    h: Harness, layout: Any, sched: Any, env: dict[str, str], audit: AuditStore, home: Any
) -> None:
    name = h.config.name

    def submit(label: str, partition: str, node: str | None = None) -> str:
        job = sbatch(
            env,
            *(["-w", node] if node else []),
            "-N1", "--exclusive", "-p", partition, "-J", label,
            f"--comment=relaunch=on,relaunch_cluster={name}",
            "-o", str(h.tmp / f"{label}-%j.out"),
            script="#!/bin/sh\nsleep 600\n",
        )  # fmt: skip
        h.jobs.append(job)
        return job

    def fail_healthy(node: str, job: str) -> None:
        """The job's processes killed under an Xid line; the node itself stays healthy."""
        pids = [p.pid for p in faults.job_processes(layout, node, job)]
        assert pids, f"no processes of job {job} on {node}"
        faults.kill_pids(node, pids, kernel_log=h.node_log(node))

    async def rows(incident: str, kind: str) -> list[StoredEvent]:
        return [e for e in await audit.events(incident) if e.kind == kind]

    async def diagnosed(node: str) -> StoredEvent:
        life = lifecycle_id(name, node, 1)
        checks: list[StoredEvent] = []

        async def seen() -> bool:
            checks[:] = await rows(life, "checks")
            return bool(checks)

        await h.until(seen, f"{node}'s diagnosis", timeout=90)
        return checks[0]

    # ---- 1. the canary acts while debug waits; an approval; two lifecycles judge the drains.
    a, b, c = submit("a", "debug"), submit("b", "debug"), submit("c", "debug")
    d = submit("d", "batch")
    nodes = {job: await _wait_running(sched, job) for job in (a, b, c, d)}
    assert len(set(nodes.values())) == 4, nodes
    await asyncio.sleep(2)  # the watcher has seen them running
    faults.mark_gpu_fault(home.root / "nodes" / nodes[a])
    faults.kill_node(layout, nodes[a], job_id=a, kernel_log=h.node_log(nodes[a]))
    fail_healthy(nodes[d], d)
    waiting = await h.wait_stage(h.incident(a), {Stage.AWAITING_APPROVAL}, timeout=60)
    assert waiting.awaiting_approval

    async def drained(node: str) -> bool:
        return bool((await sched.get_node(node)).drain_flag)

    await h.until(lambda: drained(nodes[d]), f"the canary's {nodes[d]} drained", timeout=60)
    assert not await drained(nodes[a]), "debug waits for a person"
    approved = relaunch(h.config_path, "approve", h.incident(a), "--by", "ana")
    assert approved.returncode == 0, approved.stderr
    right, wrong = await diagnosed(nodes[a]), await diagnosed(nodes[d])
    assert right.data["passed"] is False and wrong.data["passed"] is True
    # D's node passed its checks: its lifecycle asks before returning it; yes.
    life_d = lifecycle_id(name, nodes[d], 1)

    async def asks() -> bool:
        return any(e.stage == "awaiting_approval" for e in await rows(life_d, "stage"))

    await h.until(asks, f"{life_d} asking to return {nodes[d]}", timeout=30)
    back = relaunch(h.config_path, "approve", life_d, "--by", "ana")
    assert back.returncode == 0, back.stderr

    # ---- 2. the scorecard after two decisions.
    card = scorecard(h)
    total = card["total"]
    assert (total["recommended"], total["approved"], total["autonomous"]) == (2, 1, 1)
    assert (total["approved_right"], total["autonomous_wrong"]) == (1, 1)
    assert card["drains"] == {"right": 1, "wrong": 1, "pending": 0}
    assert suggested(card) == {
        ("promote", "category", "gpu_hardware"),
        ("promote", "partition", "debug"),
        ("demote", "partition", "batch"),
    }
    assert scope(card, "partition", "batch")["mode"] == "autonomous"
    assert scope(card, "partition", "debug")["mode"] == "monitor"

    # ---- 3. a rejection and an expiry; the restarted jobs run the window out.
    fail_healthy(nodes[b], b)
    fail_healthy(nodes[c], c)
    await h.wait_stage(h.incident(b), {Stage.AWAITING_APPROVAL}, timeout=60)
    await h.wait_stage(h.incident(c), {Stage.AWAITING_APPROVAL}, timeout=60)
    rejected = relaunch(h.config_path, "reject", h.incident(b), "--by", "bo", "--reason", "no")
    assert rejected.returncode == 0, rejected.stderr
    await h.wait_stage(h.incident(b), {Stage.REJECTED}, timeout=30)
    await h.wait_stage(h.incident(c), {Stage.EXPIRED}, timeout=45)
    # A and D were requeued off their nodes: they run again where B and C ran, or on D's node,
    # which its lifecycle validated and returned.
    for job in (a, d):
        await h.wait_stage(h.incident(job), {Stage.DONE}, timeout=90)
    verified = max([(await rows(h.incident(job), "verify"))[0].at for job in (a, d)])
    await asyncio.sleep(max(0.0, WINDOW_S - (time.time() - verified.timestamp())) + 0.5)

    card = scorecard(h)
    total = card["total"]
    assert total["recommended"] == 4
    assert (total["approved"], total["rejected"], total["expired"]) == (1, 1, 1)
    assert (total["autonomous"], total["acted_differently"], total["pending"]) == (1, 0, 0)
    assert (total["approved_right"], total["approved_wrong"], total["autonomous_wrong"]) == (
        1,
        0,
        1,
    )
    assert card["drains"] == {"right": 1, "wrong": 1, "pending": 0}
    assert card["restarts"] == {"right": 2, "wrong": 0, "pending": 0}
    gpu = scope(card, "category", "gpu_hardware")["tally"]
    assert (gpu["recommended"], gpu["approved_right"]) == (4, 1)
    debug = scope(card, "partition", "debug")["tally"]
    assert (debug["recommended"], debug["rejected"], debug["expired"]) == (3, 1, 1)
    assert suggested(card) == {("demote", "partition", "batch")}
    demote = card["suggestions"][0]
    assert nodes[d] in demote["why"] and "passed its diagnosis" in demote["why"]
    text = relaunch(h.config_path, "scorecard")
    assert "demote partition batch to monitor" in text.stdout, text.stdout

    # ---- 4. promote debug: the next failure there is acted on without asking.
    promoted = relaunch(
        h.config_path, "rollout", "promote", "--partition", "debug", "--by", "ana",
        "--reason", "1 of 1 approved and right",
    )  # fmt: skip
    assert promoted.returncode == 0, promoted.stderr
    shown = json.loads(relaunch(h.config_path, "rollout", "show", "--json").stdout)
    assert shown["partitions"] == {"debug": "autonomous"}
    assert shown["changes"][0]["by"] == "ana"
    assert scope(scorecard(h), "partition", "debug")["mode"] == "autonomous"
    # D's node, back in service, takes a new debug job; its failure there is a new decision
    # (the node's last one closed with its return), and debug is autonomous now.
    for job in (a, d):  # a requeued job may have gone there: it makes room
        if nodes[d] in (await sched.get_job(job)).nodes:
            await sched.cancel_job(job)
    e = submit("e", "debug", nodes[d])
    await _wait_running(sched, e)
    await asyncio.sleep(1)
    fail_healthy(nodes[d], e)
    await h.until(lambda: drained(nodes[d]), f"{nodes[d]} drained without approval", timeout=60)
    joined = await rows(h.incident(e), "node_decision")
    decision = str(joined[0].data["requeue_by"])
    assert decision == f"relaunch-{name}-node-{nodes[d]}-2", decision
    plan = (await rows(decision, "plan"))[0]
    assert plan.data["mode"] == "autonomous" and plan.nodes == [nodes[d]]
    assert not await rows(decision, "approval")


async def _dump(audit: AuditStore, cluster: str) -> None:
    for row in await audit.incidents(cluster=cluster):
        for e in await audit.events(row.id):
            print(f"{e.at:%H:%M:%S.%f} {e.incident_id} {e.kind} {e.stage or ''} {e.summary[:160]}")


async def _wait_running(sched: Any, job: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        info = await sched.get_job(job)
        if info.state is JobState.RUNNING and info.nodes:
            return str(info.nodes[0])
        assert time.monotonic() < deadline, f"job {job} not running: {info.state}"
        await asyncio.sleep(0.3)
