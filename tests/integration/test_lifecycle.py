"""The node lifecycle end to end, on a Slurm cluster of its own ("life", beside the session's
"test" cluster: no other test's jobs or node restores touch its nodes).

A real worker and watcher in autonomous mode; a user's job on a node that dies (slurmd and the
job's processes killed, an Xid 79 line in the node's kernel log) with the dev cluster's GPU
fault marked. The recovery drains the node and hands it to its lifecycle, which checks it
through srun inside a maintenance reservation, reboots it (the dev stack restarts its slurmd),
validates it, and:

- returns it once the fault is cleared (the marker removed), with no user job on it before;
- hands it to repair, a ticket on a real HTTP receiver, while the fault stays; `relaunch nodes
  returned` then has it validated and returned;
- in monitor mode, asks before the reboot and before the return.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from relaunch.activities.deps import Deps
from relaunch.activities.lifecycle import LifecycleActivities
from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.devstack import faults
from relaunch.devstack.stack import Stack
from relaunch.models.lifecycle import (
    LifecycleFault,
    LifecycleSettings,
    LifecycleStatus,
    NodeStage,
    Rung,
    RungInput,
    lifecycle_id,
    reservation_name,
)
from relaunch.models.node_decision import node_decision_id
from relaunch.models.recovery import AutoAction, Category, Mode, Policy
from relaunch.models.scheduler import JobState
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from relaunch.workflows.node_client import LifecycleSignals
from tests.conftest import sbatch
from tests.integration.conftest import MakeHarness
from tests.integration.harness import REPO
from tests.integration.helpers import restore_lifecycles
from tests.integration.serve import serve

pytestmark = pytest.mark.xdist_group("lifecycle")
CLUSTER = "life"


class Receiver:
    """A repair system's webhook: records each ticket it is posted, answers a ticket id."""

    def __init__(self) -> None:
        self.tickets: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self.app = Starlette(
            routes=[
                Route("/tickets", self.post, methods=["POST"]),
                Route("/healthz", lambda _: JSONResponse({})),
            ]
        )

    async def post(self, request: Request) -> JSONResponse:
        self.tickets.append(await request.json())
        self.keys.append(request.headers.get("idempotency-key", ""))
        return JSONResponse({"ticket": f"REP-{len(self.tickets)}"}, status_code=201)


def relaunch(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relaunch.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


async def test_drained_nodes_are_checked_remediated_returned_or_sent_to_repair(
    stack: Stack, make_harness: MakeHarness, temporal_client: Client, tmp_path: Path
) -> None:
    home = stack.home(CLUSTER)
    layout = home.slurm
    sched = stack.scheduler(CLUSTER)
    env = {**os.environ, **layout.env}
    (home.root / "checks").mkdir(parents=True, exist_ok=True)
    receiver = Receiver()
    with serve(receiver.app) as base:
        # Four drains in the test: the blast-radius guard lets them through.
        h = make_harness(
            Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=60, drain_share=1.0, drain_cap=10)
        )
        h.sched = sched
        lifecycle = LifecycleSettings.model_validate(
            {
                **stack.lifecycle_settings(home).model_dump(),
                "settle_s": 1.0,
                "repair_webhook": f"{base}/tickets",
            }
        )
        h.configure(**layout.config_fields, lifecycle=lifecycle)
        name = h.config.name
        audit = await AuditStore.open(stack.database_url)
        try:
            h.start("worker")
            h.start("watch")
            await _scenarios(h, home, layout, sched, env, receiver, audit, temporal_client)
        finally:
            await audit.close()
            for proc in list(h.procs):
                h.kill(proc)
            await restore_lifecycles(home, sched, name, temporal_client)


async def _scenarios(
    h: Any,
    home: Any,
    layout: Any,
    sched: Any,
    env: dict[str, str],
    receiver: Receiver,
    audit: AuditStore,
    client: Client,
) -> None:
    name = h.config.name
    node_dir = {n: home.root / "nodes" / n for n in layout.nodes}

    def fail_node(node: str) -> str:
        """A user's job on ``node``, then the node's GPU fault and its death."""
        job = sbatch(
            env,
            "-w", node, "-N1", "-J", "victim",
            f"--comment=relaunch=on,relaunch_cluster={name}",
            "-o", str(h.tmp / f"victim-{node}-%j.out"),
            script="#!/bin/sh\nsleep 600\n",
        )  # fmt: skip
        h.jobs.append(job)
        deadline = time.monotonic() + 60
        while True:
            job_state = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout.strip()
            if job_state == "RUNNING":
                break
            assert time.monotonic() < deadline, f"job {job} not running: {job_state}"
            time.sleep(0.3)
        time.sleep(2)  # the watcher has seen it running
        faults.mark_gpu_fault(node_dir[node])
        faults.kill_node(layout, node, job_id=job, kernel_log=h.node_log(node))
        return job

    async def status(lid: str) -> LifecycleStatus | None:
        try:
            return await client.get_workflow_handle(lid).query(NodeLifecycleWorkflow.status)
        except Exception:
            return None

    async def until_stage(
        lid: str, stages: set[NodeStage], timeout: float = 150
    ) -> LifecycleStatus:
        last = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = await status(lid)
            if last is not None and last.stage in stages:
                return last
            await asyncio.sleep(0.5)
        raise AssertionError(f"{lid} not in {stages} after {timeout}s: {last}\n{await scene()}")

    async def scene() -> str:
        """What a person would look at: the cluster's nodes, jobs and reservations, the node
        decisions' trails, and the worker's last words."""
        shown = []
        for node in ("n1", "n2"):
            for trail_id in (node_decision_id(name, node, 1), lifecycle_id(name, node, 1)):
                trail = await audit.events(trail_id)
                shown.append(
                    f"$ relaunch show {trail_id}\n"
                    + "".join(f"{e.at:%H:%M:%S} {e.kind}: {e.summary[:160]}\n" for e in trail)
                )
            try:  # what the lifecycle waits on: its activity, attempt and last heartbeat
                described = await client.get_workflow_handle(lifecycle_id(name, node, 1)).describe()
                for act in described.raw_description.pending_activities:
                    beats = act.heartbeat_details.payloads
                    shown.append(
                        f"pending {act.activity_type.name} attempt {act.attempt} state "
                        f"{act.state} last beat {beats[-1].data[:160]!r} "
                        f"failure {act.last_failure.message[:200]!r}\n"
                        if beats
                        else f"pending {act.activity_type.name} attempt {act.attempt} state "
                        f"{act.state} failure {act.last_failure.message[:200]!r}\n"
                    )
            except Exception as exc:  # a diagnosis: never the test's own failure
                shown.append(f"(no description of {node}'s lifecycle: {exc})\n")
        for argv in (
            ["sinfo", "-N", "-h", "-o", "%N %T %E"],
            ["squeue", "-h", "-t", "all", "-o", "%i %T %N %j %r"],
            ["scontrol", "show", "reservation"],
        ):
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
            shown.append(f"$ {' '.join(argv)}\n{run.stdout}{run.stderr}")
        worker = h.tmp / "worker.log"
        tail = worker.read_text(errors="replace")[-4000:] if worker.exists() else ""
        return "\n".join(shown) + f"\nworker.log (tail):\n{tail}"

    async def until_pending(lid: str, step: str, timeout: float = 150) -> LifecycleStatus:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = await status(lid)
            if last is not None and last.pending is not None and last.pending.step == step:
                return last
            await asyncio.sleep(0.5)
        raise AssertionError(f"{lid}: no pending {step} after {timeout}s: {last}")

    async def rows(lid: str, kind: str) -> list[StoredEvent]:
        return [e for e in await audit.events(lid) if e.kind == kind]

    # ---- 1. n1: the fault clears; worker killed mid-reboot; no user job before the return.
    # ---- 2. n2, at the same time: the fault stays; a ticket; repaired; validated; returned.
    fail_node("n1")
    # The "transient" fault: gone by the time the node is back (a dead node's diagnosis
    # fails on its silence alone; the validation after the reboot looks for the marker).
    faults.clear_gpu_fault(node_dir["n1"])
    fail_node("n2")
    one, two = lifecycle_id(name, "n1", 1), lifecycle_id(name, "n2", 1)
    await h.until(lambda: _has(rows(one, "node_stage")), "n1's lifecycle", timeout=60)
    # A user's job asks for n1 while it is out: it must not start there before the return.
    waiting = sbatch(
        env, "-w", "n1", "-N1", "-J", "eager", "-o", "/dev/null",
        script="#!/bin/sh\nsleep 1\n",
    )  # fmt: skip
    h.jobs.append(waiting)
    # The worker dies once the reboot was asked; the one that replaces it does not reboot
    # again. (A worker that dies before its ask is confirmed is followed by an ask:
    # tests/unit/test_lifecycle_rung.py.)
    await h.until(lambda: _has(rows(one, "rung_asked")), "n1's reboot asked", timeout=150)
    h.kill("worker")
    h.start("worker")
    done = await until_stage(one, {NodeStage.RETURNED, NodeStage.ESCALATED})
    assert done.stage is NodeStage.RETURNED, done.outcome
    assert done.tried == ["reboot"], done.tried
    assert len(await rows(one, "rung_started")) == 1
    assert len(await rows(one, "rung_asked")) == 1
    assert len(await rows(one, "rung")) == 1
    checks = await rows(one, "checks")
    assert [c.data["passed"] for c in checks] == [False, True], [c.summary for c in checks]
    diagnosis, validation = checks[0].data, checks[1].data
    assert "does not answer" in diagnosis["results"][0]["detail"]
    ran = {r["id"]: r for r in validation["results"]}
    # Real checks through srun: the node's own output, and the skipped GPU ones say why.
    assert ran["node-basics"]["passed"] and "MemAvailable" in ran["node-basics"]["output"]
    assert ran["storage-rw"]["passed"] and "storage ok" in ran["storage-rw"]["output"]
    assert ran["dev-gpu"]["passed"]
    assert (
        ran["gpu-smi"]["skipped"]
        and "nvidia-smi is not installed on n1" in (ran["gpu-smi"]["detail"])
    )
    n1 = await sched.get_node("n1")
    assert not n1.drain_flag and n1.responding, n1.display_state
    assert await sched.maintenance().reservation_nodes(reservation_name("n1")) is None
    returned_at = (await rows(one, "node_stage"))[-1].at
    start = subprocess.run(
        ["scontrol", "show", "job", waiting], env=env, capture_output=True, text=True
    ).stdout
    # Either still pending (scheduled a moment later) or started after the return.
    if "JobState=PENDING" not in start:
        started = _start_time(start)
        assert started >= returned_at.replace(microsecond=0, tzinfo=None), (started, returned_at)

    # n2: the fault stays: reboot, the checks fail again, a ticket.
    sent = await until_stage(two, {NodeStage.ESCALATED, NodeStage.RETURNED})
    assert sent.stage is NodeStage.ESCALATED, sent.outcome
    assert sent.ticket == "REP-1" and len(receiver.tickets) == 1
    ticket = receiver.tickets[0]
    assert ticket["node"] == "n2" and ticket["cluster"] == name
    assert ticket["tried"] == ["reboot"]
    assert [c["id"] for c in ticket["failed_checks"]] == ["dev-gpu"]
    assert "fallen off the bus" in ticket["failed_checks"][0]["output"]
    assert ticket["faults"][0]["category"] == "gpu_hardware"
    assert ticket["faults"][0]["remedy"] == "reboot"  # Xid 79, by the catalogue
    assert any(e["kind"] == "action" for e in ticket["history"]), "the incident's history"
    assert receiver.keys == [two]
    n2 = await sched.get_node("n2")
    assert n2.drain_flag and n2.reason == "relaunch: repair REP-1", n2.reason
    assert await sched.maintenance().reservation_nodes(reservation_name("n2")) is None
    # Not repaired yet: `returned` validates, the checks fail, and it goes back to repair.
    told = relaunch(h.config_path, "nodes", "returned", "n2", "--by", "tech")
    assert told.returncode == 0, told.stderr
    await h.until(lambda: _count(rows(two, "checks"), 3), "n2 validated after repair", 90)
    again = await until_stage(two, {NodeStage.ESCALATED})
    assert not (await rows(two, "checks"))[-1].data["passed"]
    assert again.stage is NodeStage.ESCALATED
    # Repaired for real this time.
    faults.clear_gpu_fault(node_dir["n2"])
    told = relaunch(h.config_path, "nodes", "returned", "n2", "--by", "tech", "--ticket", "REP-1")
    assert told.returncode == 0, told.stderr
    back = await until_stage(two, {NodeStage.RETURNED})
    assert "validated after repair" in back.outcome
    n2 = await sched.get_node("n2")
    assert not n2.drain_flag and n2.responding, n2.display_state
    listed = relaunch(h.config_path, "nodes", "--json")
    assert '"lifecycle_stage": "returned"' in listed.stdout, listed.stdout + listed.stderr

    # ---- 3. n1 again, returned minutes ago: a lemon, straight to repair.
    fail_node("n1")
    lemon = await until_stage(lifecycle_id(name, "n1", 2), {NodeStage.ESCALATED}, 120)
    assert "returned to service by" in lemon.outcome and lemon.tried == []

    # ---- 4. monitor mode: n3 waits for a person before the reboot and before the return.
    h.configure(
        lifecycle=h.config.lifecycle.model_copy(update={"mode": Mode.MONITOR}),
        # Its checks run unasked here (tests/unit/test_monitor_asks.py has them asked).
        policy=h.config.policy.model_copy(update={"auto_actions": [AutoAction.CHECKS]}),
    )
    h.kill("worker")
    h.start("worker")
    fail_node("n3")
    three = lifecycle_id(name, "n3", 1)
    asked = await until_pending(three, "reboot")
    assert asked.stage is NodeStage.REMEDIATING
    assert (await sched.get_node("n3")).drain_flag
    faults.clear_gpu_fault(node_dir["n3"])
    approved = relaunch(h.config_path, "approve", three, "--by", "ana")
    assert approved.returncode == 0, approved.stderr
    await until_pending(three, "return")
    assert (await sched.get_node("n3")).drain_flag, "out of service until the return is approved"
    approved = relaunch(h.config_path, "approve", three, "--by", "ana", "--reason", "checks ok")
    assert approved.returncode == 0, approved.stderr
    returned = await until_stage(three, {NodeStage.RETURNED})
    assert returned.tried == ["reboot"]
    decisions = await rows(three, "approval")
    assert [d.data["step"] for d in decisions] == ["reboot", "return"]
    assert all(d.actor == "ana" for d in decisions)


async def _has(rows: Any) -> bool:
    return bool(await rows)


async def _count(rows: Any, n: int) -> bool:
    return len(await rows) >= n


def _start_time(scontrol: str) -> Any:
    from datetime import datetime

    text = next(p.split("=", 1)[1] for p in scontrol.split() if p.startswith("StartTime="))
    return datetime.fromisoformat(text)


async def test_a_reboot_slurm_refuses_is_said_and_the_ladder_goes_on(stack: Stack) -> None:
    """Without a reboot command, the reboot rung asks `scontrol reboot`. The local Slurm has no
    RebootProgram: it refuses, and the rung says so (not applied) instead of waiting for a
    reboot that never comes; a Slurm that accepts has the node flagged for it."""
    home = stack.home(CLUSTER)
    sched = stack.scheduler(CLUSTER)
    config = stack.cluster_config(CLUSTER)
    audit = await AuditStore.open(stack.database_url)
    try:
        deps = Deps(config=config, scheduler=sched, audit=audit)
        lid = lifecycle_id(f"reboot{os.getpid()}x{time.monotonic_ns()}", "n4", 1)
        await audit.ensure_incident(lid, CLUSTER, "", 1)
        settings = LifecycleSettings(reboot_command=[], reboot_timeout_s=5)
        rung = RungInput(
            lifecycle_id=lid,
            cluster=CLUSTER,
            node="n4",
            settings=settings,
            rung=Rung.REBOOT,
            reason="relaunch: reboot test",
        )
        result = await ActivityEnvironment().run(LifecycleActivities(deps).apply_rung, rung)
        print(f"scontrol reboot on the local Slurm: {result.detail}")  # shown with -s
        node = await sched.get_node("n4")
        if not result.done:
            assert "Slurm refused to reboot n4" in result.detail, result.detail
            assert not any(f.startswith("REBOOT") for f in node.flags), node.flags
        else:  # accepted: the node waits for its reboot (cancelled here)
            assert any(f.startswith("REBOOT") for f in node.flags), node.flags
            subprocess.run(
                ["scontrol", "cancel_reboot", "n4"],
                env={**os.environ, **home.slurm.env},
                check=False,
                timeout=30,
            )
        # A retried attempt does not ask Slurm again.
        again = await ActivityEnvironment().run(LifecycleActivities(deps).apply_rung, rung)
        assert "earlier attempt" in again.detail
    finally:
        await audit.close()


async def test_a_suspect_is_checked_while_its_job_finishes_and_is_never_drained(
    stack: Stack, make_harness: MakeHarness, temporal_client: Client
) -> None:
    """A node only job output named, in the jobs of two users (the plan's check_nodes): its
    lifecycle fences it in its maintenance reservation while a user's job on it goes on, runs
    the real checks through srun once the job is done, and, as they pass, ends the reservation.
    The node is never drained, and the job ends on its own."""
    home = stack.home(CLUSTER)
    layout = home.slurm
    sched = stack.scheduler(CLUSTER)
    env = {**os.environ, **layout.env}
    node = layout.nodes[-1]
    h = make_harness(Policy(mode=Mode.AUTONOMOUS))
    h.sched = sched
    settings = stack.lifecycle_settings(home).model_copy(update={"settle_s": 0.0})
    h.configure(**layout.config_fields, lifecycle=settings)
    name = h.config.name
    audit = await AuditStore.open(stack.database_url)
    try:
        faults.clear_gpu_fault(home.root / "nodes" / node)  # its checks pass
        h.start("worker")
        job = sbatch(
            env, "-w", node, "-N1", "-J", "bystander", "-o", "/dev/null",
            script="#!/bin/sh\nsleep 8\n",
        )  # fmt: skip
        h.jobs.append(job)

        async def running() -> bool:
            return (await sched.get_job(job)).state is JobState.RUNNING

        await h.until(running, f"job {job} running")
        fault = LifecycleFault(
            incident_id=f"relaunch-{name}-9100-0",
            category=Category.GPU_HARDWARE,
            kind="suspect/gpu_hardware",
            summary="named by the output of jobs of ana and bo",
            at=datetime.now(UTC),
            suspect=True,
        )
        lid = await LifecycleSignals(temporal_client).fault(h.config, node, fault)
        handle = temporal_client.get_workflow_handle_for(NodeLifecycleWorkflow.run, lid)
        drained_at: list[str] = []
        deadline = time.monotonic() + 150
        while True:
            seen = await sched.get_node(node)
            if seen.drain_flag:
                drained_at.append(seen.display_state)
            status = await handle.query(NodeLifecycleWorkflow.status)
            if status.stage in {NodeStage.CLOSED, NodeStage.RETURNED, NodeStage.ESCALATED}:
                break
            assert time.monotonic() < deadline, f"{lid} still {status.stage}: {status.outcome}"
            await asyncio.sleep(0.3)
        assert status.stage is NodeStage.CLOSED, status.outcome
        assert "suspect cleared: the checks passed" in status.outcome
        assert drained_at == [], f"{node} was drained: {drained_at}"
        rows = await audit.events(lid)
        waited = [r for r in rows if r.kind == "checks_wait"]
        assert waited and job in waited[0].summary  # no check beside the user's job
        checks = [r for r in rows if r.kind == "checks"]
        assert [c.data["passed"] for c in checks] == [True]
        assert (await sched.get_job(job)).state is JobState.COMPLETED  # its job went on
        shown = subprocess.run(
            ["scontrol", "show", "reservation"], env=env, capture_output=True, text=True
        ).stdout
        assert reservation_name(node) not in shown  # fence gone: it takes jobs again
        after = await sched.get_node(node)
        assert after.responding and not after.drain_flag, after.display_state
    finally:
        await audit.close()
        for proc in list(h.procs):
            h.kill(proc)
        await restore_lifecycles(home, sched, name, temporal_client)
