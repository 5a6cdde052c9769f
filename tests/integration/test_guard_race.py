"""The blast-radius guard under concurrency, on the real stack: recoveries planned or approved
at the same time never drain more than the guard allows, because `isolate` re-checks it under
the cluster's PostgreSQL advisory lock; the ones it refuses are held and audited. And the lock
itself: exclusive, and let go by a worker that dies holding it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.service import RPCError

from relaunch.connectors.audit import AuditStore
from relaunch.models.recovery import Approval, Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.conftest import sbatch
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job
from tests.integration.test_recovery import save_history

SLEEPER = """#!/bin/bash
srun bash -c 'for i in $(seq 1 900); do echo "step $i on $SLURMD_NODENAME"; sleep 1; done'
"""
PAST_ISOLATING = {Stage.ACTING, Stage.VERIFYING, Stage.DONE, Stage.FAILED, Stage.HELD}


def submit_on(h: Harness, node: str) -> str:
    """A one-node job of the harness's cluster pinned to ``node``."""
    job_id = sbatch(
        {**os.environ, **h.stack.slurm_env},
        "-N1",
        "-n1",
        f"--nodelist={node}",
        "--requeue",
        "--open-mode=append",
        f"--output={h.tmp}/race-%j.out",
        f"--comment=relaunch=on,relaunch_cluster={h.config.name}",
        script=SLEEPER,
    )
    h.jobs.append(job_id)
    return job_id


async def inject_until_detected(h: Harness, incidents: dict[str, str]) -> None:
    """A real Xid 79 line in each node's kernel log, repeated (as a failing GPU repeats it)
    until the node's recovery has started: the watcher takes news from a node's log only from
    the pass after it first looked at it, and a loaded machine starts it slowly."""
    deadline = asyncio.get_running_loop().time() + 90
    waiting = dict(incidents)
    while waiting:
        for node in waiting:
            h.inject_xid(node)
        await asyncio.sleep(2)
        for node, incident in list(waiting.items()):
            with contextlib.suppress(RPCError):  # not started yet
                await h.handle(incident).describe()
                del waiting[node]
        assert asyncio.get_running_loop().time() < deadline, f"no recovery for {waiting}"


@pytest.mark.parametrize("mode", [Mode.MONITOR, Mode.AUTONOMOUS])
async def test_recoveries_at_once_drain_at_most_the_guards_limit(
    make_harness: MakeHarness, mode: Mode
) -> None:
    """Four jobs, each on its own node, each node with a real Xid 79 in its kernel log, and a
    guard limit of 2 nodes. Monitor mode: the four plans wait for approval, then all four are
    approved at once. Autonomous mode: the four are planned and act at once."""
    # Recoveries that plan their own drains race for the guard here (node decisions race
    # through the same isolate step and lock: tests/unit/test_node_decision.py).
    h = make_harness(
        Policy(mode=mode, drain_cap=2, drain_share=1.0, verify_timeout_s=60, node_decisions=False)
    )
    h.start("worker")
    h.start("watch")
    nodes = sorted(n.name for n in await h.sched.list_nodes())
    assert len(nodes) >= 4
    jobs = {node: submit_on(h, node) for node in nodes[:4]}
    for job_id in jobs.values():
        await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    incidents = {node: h.incident(job_id) for node, job_id in jobs.items()}
    await inject_until_detected(h, incidents)

    if mode is Mode.MONITOR:
        for node, incident in incidents.items():
            status = await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=90)
            assert status.plan is not None and status.plan.drain_nodes == [node]
            assert not status.plan.needs_override  # allowed when planned: refused at drain time
        await asyncio.gather(
            *(
                h.handle(i).signal(RecoveryWorkflow.approve, Approval(by="ana"))
                for i in incidents.values()
            )
        )
    stages = {
        node: (await h.wait_stage(i, PAST_ISOLATING, timeout=120)).stage
        for node, i in incidents.items()
    }

    drained = sorted(n.name for n in await h.sched.list_nodes() if n.drain_flag)
    assert len(drained) == 2, (drained, stages)
    held = sorted(node for node, stage in stages.items() if stage is Stage.HELD)
    assert held == sorted(set(nodes[:4]) - set(drained)), stages
    for node in drained:
        assert incidents[node] in (await h.sched.get_node(node)).reason
    for node in held:
        incident = incidents[node]
        refusals = [g for g in await h.events(incident, "guard") if "REFUSED" in g.summary]
        assert refusals, f"{incident} held without a recorded refusal"
        drains = [
            e
            for e in await h.events(incident, "action")
            if e.data.get("step") == "drain" and e.data.get("changed")
        ]
        assert not drains
        await h.stage_row(incident, Stage.HELD)  # its last row is the hold
        assert (await h.events(incident, "stage"))[-1].stage == "held"
    if mode is Mode.MONITOR:
        await save_history(h, incidents[held[0]], "monitor_refused_at_drain")
        # "ana" is what the signal said; who sent it is what Temporal recorded, kept beside it.
        for incident in incidents.values():
            approvals = await h.events(incident, "approval")
            assert [(a.actor, a.data.get("via")) for a in approvals] == [("ana", "signal")]
            assert approvals[0].data["temporal_identity"] == h.client.identity
    # The drains on record are the drains made.
    since = datetime.now(UTC) - timedelta(hours=1)
    assert await h.audit.drained_nodes(h.config.name, since) == drained


LOCK_HOLDER = """
import asyncio, sys
from relaunch.connectors.audit import AuditStore

async def main() -> None:
    store = await AuditStore.open(sys.argv[1])
    async with store.drain_lock(sys.argv[2]):
        print("locked", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_drain_lock_is_exclusive_and_dies_with_its_holder(database_url: str) -> None:
    store = await AuditStore.open(database_url)
    cluster = f"lock-{os.getpid()}"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCK_HOLDER, database_url, cluster, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), timeout=30) == b"locked\n"

        async def take() -> None:
            async with store.drain_lock(cluster):
                pass

        with pytest.raises(TimeoutError):  # held by the other process
            await asyncio.wait_for(take(), timeout=2)
        async with store.drain_lock(f"{cluster}-other"):  # one lock per cluster
            pass
        holder.send_signal(signal.SIGKILL)  # a worker that crashes holding the lock
        await holder.wait()
        await asyncio.wait_for(take(), timeout=10)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await store.close()
