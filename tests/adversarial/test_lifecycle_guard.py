"""Hostile users against the node lifecycle (issue 29, row 8), on the real stack with the
lifecycle on (autonomous, the dev cluster's checks and reboot), as relaunch-mallory.

Each node is drained by a genuine fault (a real Xid 79 in its kernel log under a bystander's
job), so each test is also the control: the lifecycle still runs its checks on the drained
node. The attacks:

- mallory's job still runs on the draining node: no check starts beside it; the checks start
  once it has ended, and the wait is in the audit trail;
- mallory planted symbolic links at every path the old storage check could write as root
  (``$RELAUNCH_CHECK_DIR/.relaunch-check-<host>-<pid>``, every pid) towards a root-owned file:
  nothing is written through them;
- mallory has a process on the node (outside any job: the dev nodes share this machine) while
  a check fails: the run is inconclusive, the node goes to a person, and it is neither reset
  nor rebooted (its slurmd keeps its pid).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.connectors.audit import StoredEvent
from relaunch.devstack import faults
from relaunch.devstack.slurm import slurmd_pid
from relaunch.devstack.stack import Stack
from relaunch.models.lifecycle import LifecycleStatus, NodeStage
from relaunch.models.recovery import Mode, Policy
from relaunch.models.scheduler import JobState
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from tests.adversarial.hostile import QUIET_JOB, Tier
from tests.integration.helpers import restore_lifecycles, wait_job

# Two drains in the module: the guard lets both through.
POLICY = Policy(
    mode=Mode.AUTONOMOUS,
    drain_share=0.5,
    drain_cap=2,
    verify_timeout_s=20,
    approval_timeout_s=900,
    node_decisions=False,
)


@pytest.fixture(scope="module")
async def guarded(tier: Tier, stack: Stack) -> AsyncIterator[Tier]:
    """The tier's cluster with the dev cluster's lifecycle on (autonomous, a short settle),
    its storage check pointed at a shared scratch folder anyone may write (no sticky bit, as
    on a project folder of a parallel filesystem), and the census of the node's processes on
    (the dev cluster turns it off: its nodes share this machine)."""
    scratch = tier.h.tmp / "scratch"
    scratch.mkdir(exist_ok=True)
    scratch.chmod(0o777)
    settings = stack.lifecycle_settings(stack.home()).model_copy(
        update={
            "settle_s": 2.0,
            "check_workdir": str(scratch),
            "mode": Mode.AUTONOMOUS,
            "census": True,
        }
    )
    tier.h.configure(lifecycle=settings)
    tier.h.kill("worker")
    tier.h.start("worker")
    yield tier


@pytest.fixture
async def life(guarded: Tier, arena: Tier, stack: Stack) -> AsyncIterator[Tier]:
    """One test's arena; afterwards its lifecycles end, reservations and GPU-fault markers go
    (before the arena puts the nodes back)."""
    try:
        yield arena
    finally:
        h = arena.h
        await restore_lifecycles(stack.home(), h.sched, h.config.name, h.client)


async def drained_for_a_genuine_fault(t: Tier, node: str) -> tuple[str, str]:
    """A bystander's job on ``node`` and a real Xid 79 in its kernel log: the recovery drains
    the node and hands it to its lifecycle. (incident, lifecycle id)."""
    bystander = t.submit(QUIET_JOB, "-w", node, "-n1", user=pwd.getpwuid(0))
    await wait_job(t.h.sched, bystander, JobState.RUNNING, timeout=60)
    incident = await t.inject_until_detected(node, bystander)
    await t.h.until(lambda: t.drained_by(node, incident), f"{node} drained", timeout=120)
    rows: list[StoredEvent] = []

    async def handed() -> bool:
        rows[:] = [e for e in await t.h.events(incident, "lifecycle") if e.data.get("lifecycle")]
        return bool(rows)

    await t.h.until(handed, f"{node} handed to its lifecycle", timeout=60)
    return incident, str(rows[0].data["lifecycle"])


async def rows(t: Tier, lid: str, kind: str) -> list[StoredEvent]:
    return await t.h.events(lid, kind)


async def status(t: Tier, lid: str) -> LifecycleStatus | None:
    try:
        return await t.h.client.get_workflow_handle(lid).query(NodeLifecycleWorkflow.status)
    except Exception:  # not started yet
        return None


async def until_stage(t: Tier, lid: str, stages: set[NodeStage], timeout: float) -> LifecycleStatus:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await status(t, lid)
        if last is not None and last.stage in stages:
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{lid} not in {stages} after {timeout}s: {last}")


def plant_links(scratch: Path, target: Path, uid: int, gid: int) -> list[Path]:
    """Mallory's links at every path the old storage check could open for writing."""
    host = socket.gethostname()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    pids = range(1, pid_max + 1) if pid_max <= 65536 else range(last, last + 30000)
    links = []
    for pid in pids:
        link = scratch / f".relaunch-check-{host}-{pid}"
        os.symlink(target, link)
        os.lchown(link, uid, gid)
        links.append(link)
    return links


async def test_no_check_beside_a_users_job_and_nothing_written_through_a_planted_link(
    life: Tier,
) -> None:
    t, node = life, "n2"
    scratch = t.h.tmp / "scratch"
    victim = t.h.tmp / "victim"  # root's, in a folder mallory cannot write
    victim.write_text("untouched\n")
    links = plant_links(scratch, victim, t.user.pw_uid, t.user.pw_gid)
    # Mallory's job shares the node with the bystander's (one CPU each); not opted in.
    job = t.submit(QUIET_JOB, "-w", node, "-n1", comment="relaunch=off")
    await t.running(job, printed="ready on")
    incident, lid = await drained_for_a_genuine_fault(t, node)

    # The lifecycle reaches its checks while mallory's job still runs: it must wait.
    deadline = time.monotonic() + 60
    while not (waited := await rows(t, lid, "checks_wait")):
        ran = await rows(t, lid, "checks")
        assert not ran, (
            f"checks ran beside mallory's job {job} on {node}: {ran[0].summary}; the victim "
            f"file now holds {victim.stat().st_size} bytes"
        )
        assert time.monotonic() < deadline, f"{lid}: neither a wait nor checks after 60 s"
        await asyncio.sleep(0.5)
    assert f"job {job} (uid {t.user.pw_uid}, RUNNING)" in waited[0].summary, waited[0].summary
    await asyncio.sleep(8)  # a while longer: still no check, the node still drained
    assert not await rows(t, lid, "checks")
    assert (await t.h.sched.get_job(job)).state is JobState.RUNNING
    assert (await t.h.sched.get_node(node)).drain_flag
    print(f"row 8: {lid} waits: {waited[0].summary}")

    # The job ends: now the checks run, on the drained node, and pass; the node returns.
    await t.h.sched.cancel_job(job)
    ended = datetime.now(UTC)
    done = await until_stage(t, lid, {NodeStage.RETURNED, NodeStage.ESCALATED}, timeout=120)
    assert done.stage is NodeStage.RETURNED, done.outcome
    checks = await rows(t, lid, "checks")
    assert len(checks) == 1 and checks[0].data["passed"], [c.summary for c in checks]
    started = datetime.fromisoformat(checks[0].data["started_at"])
    assert started >= ended.replace(microsecond=0), (started, ended)
    clear = await rows(t, lid, "checks_waited")
    assert clear and "clear after" in clear[0].summary, [c.summary for c in clear]
    print(f"row 8: checks started {(started - ended).total_seconds():.1f}s after the job ended")

    # The storage check wrote, and wrote nowhere a link led it.
    storage = next(r for r in checks[0].data["results"] if r["id"] == "storage-rw")
    assert storage["passed"] and "storage ok" in storage["output"], storage
    assert victim.read_text() == "untouched\n"
    assert all(link.is_symlink() for link in links), "a planted link was removed (opened?)"
    assert not [p for p in scratch.iterdir() if p.name.startswith("relaunch-check.")]


async def test_a_check_failing_beside_a_users_process_is_inconclusive_not_a_reboot(
    life: Tier, stack: Stack
) -> None:
    t, node = life, "n3"
    faults.mark_gpu_fault(stack.home().root / "nodes" / node)  # the genuine fault stays
    # Mallory's process on the node, outside any job (a login, a leftover).
    lurker = await asyncio.create_subprocess_exec(
        "sleep", "300", user=t.user.pw_uid, group=t.user.pw_gid, extra_groups=[]
    )
    try:
        slurmd = slurmd_pid(stack.slurm, node)
        incident, lid = await drained_for_a_genuine_fault(t, node)
        deadline = time.monotonic() + 120
        while True:
            now = await status(t, lid)
            tried = await rows(t, lid, "rung_started")
            assert not tried, f"{node} {tried[0].summary} after checks beside mallory's process"
            if now is not None and now.stage is NodeStage.ESCALATED:
                break
            assert time.monotonic() < deadline, f"{lid} not escalated: {now}"
            await asyncio.sleep(0.5)
        checks = await rows(t, lid, "checks")
        assert len(checks) == 1, [c.summary for c in checks]
        run = checks[0].data
        gpu = next(r for r in run["results"] if r["id"] == "dev-gpu")
        assert not gpu["passed"] and t.user.pw_uid in gpu["users"], gpu  # the census saw her
        assert not run["passed"] and "dev-gpu failed while" in run["inconclusive"], run
        assert now.tried == [] and "inconclusive" in now.outcome, now.outcome
        assert slurmd_pid(stack.slurm, node) == slurmd, "the node's slurmd was restarted"
        assert (await t.h.sched.get_node(node)).drain_flag
        print(f"row 8: {lid}: {now.outcome}")
    finally:
        lurker.kill()
        await lurker.wait()
