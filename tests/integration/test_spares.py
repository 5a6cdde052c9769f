"""A job with a spare node in its allocation (examples/jobs/train_elastic.sbatch: torchrun's
elastic agent on three nodes, two of which train) on the real stack: a fault convicts one of its
training nodes, and the job trains again on the spare without being requeued (docs/spares.md)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
from datetime import datetime, timedelta

import psutil

from relaunch.connectors.launcher_health import LauncherHealth
from relaunch.devstack import faults
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job
from tests.integration.test_recovery import save_history


def training_nodes(log: str) -> set[str]:
    """The nodes the job's ranks printed progress from (the spare prints none)."""
    return set(re.findall(r"step=\d+ loss=\S+ rank=\d node=(\S+)", log))


def kill_rank(h: Harness, node: str, job_id: str) -> int:
    """SIGKILL the job's training process on ``node`` (not its launcher's agent)."""
    killed = 0
    for proc in faults.rank_processes(h.stack.slurm, node, job_id):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
            killed += 1
    return killed


async def test_a_gpu_fault_trains_again_on_the_spare_without_a_requeue(
    make_harness: MakeHarness,
) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120))
    h.start("worker")
    h.start("watch")
    job_id = h.submit_elastic()
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    assert len(job.nodes) == 3
    await h.wait_log(job_id, r"checkpoint saved step=(1[05]|[2-9]\d)", timeout=120)
    # A training node that is not the batch host (whose script cannot leave its own job).
    trains = training_nodes(h.log(job_id))
    culprit = sorted(trains - {job.nodes[0]})[0]
    spare = (set(job.nodes) - trains).pop()

    health = LauncherHealth(h.config.launcher_health_pattern or "")

    async def all_fit() -> bool:
        return all(health.fit(n) for n in job.nodes)

    await h.until(all_fit, "every node's health file (the watcher writes them)")
    h.inject_xid(culprit)
    assert kill_rank(h, culprit, job_id) == 1
    status = await h.wait_stage(h.incident(job_id), {Stage.DONE}, timeout=180)
    assert status.verdict is not None and status.verdict.culprit_nodes == [culprit]
    # The launcher's own check (exists and reads) finds the culprit unhealthy, the rest fit;
    # the file went within a second of the conviction (the verdict's row).
    assert not health.fit(culprit) and all(health.fit(n) for n in set(job.nodes) - {culprit})
    note = json.loads(health.path(culprit).with_name(f"{culprit}.unhealthy").read_text())
    # By the node's decision (the watcher's report) or the job's recovery, whichever first.
    assert note["incident"] == h.incident(job_id) or note["incident"].startswith(
        f"relaunch-{h.config.name}-node-{culprit}-"
    )
    detected = min(e.at for e in await h.events(h.incident(job_id), "detection"))
    assert datetime.fromisoformat(note["at"]) - detected < timedelta(seconds=1)

    after = await h.sched.get_job(job_id)
    # Never requeued: the same attempt, RUNNING, on the rest of its allocation.
    assert after.state is JobState.RUNNING and after.restart_count == 0
    assert sorted(after.nodes) == sorted(set(job.nodes) - {culprit})
    drained = {n.name for n in await h.sched.list_nodes() if n.drain_flag}
    assert drained == {culprit}
    log = h.log(job_id)
    resumed = log.rfind("resumed from checkpoint")
    assert resumed > 0 and f"node={spare}" in log[resumed:]
    restarts = [e.data for e in await h.events(h.incident(job_id), "action")]
    assert {r["action"] for r in restarts if r.get("step") == "restart"} == {
        "shrink",
        "end_steps",
    }
    await save_history(h, h.incident(job_id), "spare_restart")


async def test_the_launchers_own_restart_is_recognized_and_not_fought(
    make_harness: MakeHarness,
) -> None:
    """An application error that torchrun restarts in the job: the recovery sees the job
    train again in the same attempt and does nothing (no hold, no requeue, no drain)."""
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120))
    h.start("worker")
    h.start("watch")
    job_id = h.submit_elastic("--fail-at-step", "12", "--fail-rank", "1", "--fail-once")
    await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    await h.wait_log(job_id, r"injected application error at step 12", timeout=120)
    try:
        status = await h.wait_stage(h.incident(job_id), {Stage.NO_ACTION}, timeout=120)
    except AssertionError:
        for e in await h.events(h.incident(job_id)):
            print("EVENT", e.at, e.kind, e.summary[:300], e.data)
        print(h.log(job_id)[-6000:])
        raise
    assert status.verdict is not None and status.verdict.category.value == "application"
    rows = await h.events(h.incident(job_id), "in_job_restart")
    assert len(rows) == 1 and rows[0].data["launcher"] == "torchrun"
    assert rows[0].data["resumed_step"] == 10 and rows[0].data["latest_step"] > 10
    job = await h.sched.get_job(job_id)
    assert job.state is JobState.RUNNING and job.restart_count == 0 and not job.held
    assert not await actions_of(h, h.incident(job_id))
    assert not {n.name for n in await h.sched.list_nodes() if n.drain_flag}
    await save_history(h, h.incident(job_id), "in_job_restart")


async def actions_of(h: Harness, incident: str) -> list[dict[str, object]]:
    return [e.data for e in await h.events(incident, "action")]
