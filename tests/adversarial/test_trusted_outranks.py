"""Issue 29 rows 4 and 5 on the real stack, as ``relaunch-mallory``: what a job writes never
hides a node that Relaunch's probes or Slurm's node state convict, and never restarts a job
that still runs and advances with no trusted fault; a later genuine fault of that same attempt
is still recovered (its next recovery, ``<id>-r2``).

A silent node is made as tests/integration/test_silent_failures.py makes one: its slurmd
killed and the job's processes on it stopped (relaunch.devstack.faults.freeze_node). The
without-noise controls of a silent node and a Slurm-failed node are that module's and
tests/unit/test_trusted_outranks.py's; here every dead node has the job's noise around it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from relaunch.devstack import faults
from relaunch.models.recovery import Action, Category, Stage
from relaunch.models.scheduler import JobState
from tests.adversarial.hostile import Tier

PAIR = ["-N2", "--ntasks-per-node=1", "-w", "n2,n3"]  # n3 is the node that dies
OWN_CANCEL = (
    'echo "slurmstepd: error: *** JOB $SLURM_JOB_ID ON $SLURMD_NODENAME CANCELLED AT'
    ' $(date +%FT%T) ***"'
)
OWN_PREEMPTION = (
    'echo "slurmstepd: error: *** JOB $SLURM_JOB_ID ON $SLURMD_NODENAME CANCELLED AT'
    ' $(date +%FT%T) DUE TO PREEMPTION ***"'
)


def script(*lines: str) -> str:
    return "#!/bin/bash\n" + "\n".join(lines) + "\n"


def out_of_service(t: Tier) -> dict[str, str]:
    """Nodes drained, down or failed now (a fenced node is drained and down), with Slurm's
    reason."""
    return t.drained(("drain", "down", "fail"))


def opt_in(t: Tier, job_id: str) -> None:
    """Watch a job from now on (its output so far is read from the start: the banner is in
    the evidence of the recovery that finds its dead node)."""
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", f"Comment={t.opt_in}"],
        env=t.env,
        timeout=30,
        check=True,
    )


async def taken_out_for(t: Tier, node: str, incident: str) -> None:
    async def check() -> bool:
        return incident in out_of_service(t).get(node, "")

    await t.h.until(check, f"{node} taken out of service for {incident}", timeout=90)


# ---------------------------------------------------------------------------- row 4


async def test_a_printed_own_cancel_banner_and_noise_do_not_hide_an_unreachable_node(
    arena: Tier,
) -> None:
    """The job prints its own ``CANCELLED`` banner and ``srun: error: Node failure on n2``
    (its healthy peer); n3 then dies silently. The probe convicts n3, which is drained; n2 is
    a suspect only."""
    t = arena
    job_id = t.submit(
        script(OWN_CANCEL, 'echo "srun: error: Node failure on n2"', "exec sleep 900"),
        *PAIR,
        comment="relaunch=off",
    )
    await t.running(job_id, printed="Node failure on n2")
    frozen = faults.freeze_node(t.h.stack.slurm, "n3", job_id=job_id)
    try:
        opt_in(t, job_id)
        incident = await t.incident(job_id)
        status = await t.settled(incident)
        t.say("29/4 banner", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        assert verdict.category is Category.NODE_FAILURE, verdict
        assert "probe" in verdict.corroboration["n3"], verdict.corroboration
        assert verdict.corroboration.get("n2") == [], verdict.corroboration
        assert plan.action is Action.ISOLATE_AND_RESTART and plan.drain_nodes == ["n3"], plan
        assert "n2" in plan.suspect_nodes, plan
        await taken_out_for(t, "n3", incident)
        assert list(out_of_service(t)) == ["n3"], out_of_service(t)
    finally:
        faults.release_frozen(frozen)
    t.alive()


async def test_a_real_scancel_from_the_jobs_error_trap_does_not_hide_an_unreachable_node(
    arena: Tier,
) -> None:
    """n3 dies silently and the job's own trap cancels it (a real ``scancel $SLURM_JOB_ID``):
    Slurm lists the job CANCELLED, but n3 is still convicted on the probe's word and drained,
    and the job is not restarted against its user's cancel."""
    t = arena
    go = t.home / f"go-{id(t)}"
    job_id = t.submit(
        script(
            "srun sleep 900 &",
            f"while [ ! -e {go} ]; do sleep 0.1; done",
            'scancel "$SLURM_JOB_ID"',
            "sleep 60",
        ),
        *PAIR,
    )
    await t.running(job_id)
    frozen = faults.freeze_node(t.h.stack.slurm, "n3", job_id=job_id)
    try:
        go.touch()
        incident = await t.incident(job_id)
        status = await t.h.wait_stage(incident, {Stage.DONE, Stage.FAILED}, timeout=120)
        t.say("29/4 scancel", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        assert verdict.culprit_nodes == ["n3"], verdict
        assert "probe" in verdict.corroboration["n3"], verdict.corroboration
        assert plan.drain_nodes == ["n3"], plan
        await taken_out_for(t, "n3", incident)
        assert list(out_of_service(t)) == ["n3"], out_of_service(t)
        job = await t.h.sched.get_job(job_id)
        assert job.restart_count == 0 and job.state is not JobState.PENDING, job
        # Ended at once (Slurm already listed the job CANCELLED), or at the restart step,
        # which refuses to undo a cancel (while Slurm still listed it COMPLETING).
        assert "not restarted" in status.outcome, status.outcome
    finally:
        faults.release_frozen(frozen)
        go.unlink(missing_ok=True)
    t.alive()


async def test_a_printed_preemption_banner_does_not_hide_a_node_slurm_marks_failed(
    arena: Tier,
) -> None:
    """The job prints its own preemption banner; an administrator marks n3 failed in Slurm
    (``State=FAIL``: the job keeps running). Slurm's node state convicts n3: drained."""
    t = arena
    job_id = t.submit(script(OWN_PREEMPTION, "exec sleep 900"), *PAIR, comment="relaunch=off")
    await t.running(job_id, printed="DUE TO PREEMPTION")
    subprocess.run(
        ["scontrol", "update", "NodeName=n3", "State=FAIL", "Reason=admin: failing DIMM"],
        env=t.env,
        timeout=30,
        check=True,
    )
    opt_in(t, job_id)
    incident = await t.incident(job_id)
    status = await t.settled(incident)
    t.say("29/4 preemption", status)
    verdict, plan = status.verdict, status.plan
    assert verdict is not None and plan is not None, status
    assert verdict.culprit_nodes == ["n3"], verdict
    assert verdict.corroboration["n3"] == ["slurm_node_state"], verdict.corroboration
    assert plan.action is Action.ISOLATE_AND_RESTART and plan.drain_nodes == ["n3"], plan
    await taken_out_for(t, "n3", incident)
    assert list(out_of_service(t)) == ["n3"], out_of_service(t)
    t.alive()


# ---------------------------------------------------------------------------- row 5


async def test_a_running_advancing_job_is_not_restarted_by_a_printed_hang_but_a_real_one_is(
    arena: Tier,
) -> None:
    """The job prints progress and an NCCL watchdog timeout while its ranks go on: the
    recovery records a verdict and takes no action (nothing requeued). Then it really stalls:
    the watcher's stall opens the attempt's next recovery, which restarts the job."""
    t = arena
    stop = t.home / f"stop-{id(t)}"
    watchdog = (
        "[rank0]:[E1204 21:59:00.1 ProcessGroupNCCL.cpp:697] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds before timing out."
    )
    job_id = t.submit(
        script(
            'if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then exec sleep 900; fi',
            'for i in $(seq 1 5); do echo "step=$i loss=0.5"; sleep 0.3; done',
            f'echo "{watchdog}"',
            "i=5",
            f'while [ ! -e {stop} ]; do i=$((i+1)); echo "step=$i loss=0.5"; sleep 0.3; done',
            "exec sleep 900",
        ),
        "-N1",
        "-w",
        "n4",
        comment=f"{t.opt_in},hang_after=5s",
    )
    await t.running(job_id, printed="Watchdog caught")
    first = await t.incident(job_id)
    status = await t.h.wait_stage(first, {Stage.NO_ACTION}, timeout=90)
    t.say("29/5 advancing", status)
    assert status.verdict is not None and status.plan is not None, status
    assert status.verdict.still_running and status.plan.action is Action.NONE, status
    job = await t.h.sched.get_job(job_id)
    assert job.state is JobState.RUNNING and job.restart_count == 0, job
    assert Path(t.home / f"{job_id}.out").exists()

    stop.touch()  # a genuine hang of the same attempt
    try:
        again = f"{first}-r2"

        async def reopened() -> bool:
            rows = await t.h.audit.incidents(cluster=t.h.config.name, job_id=job_id)
            return again in {r.id for r in rows}

        await t.h.until(reopened, f"recovery {again} opened", timeout=60)
        status = await t.settled(again)
        t.say("29/5 stalled", status)
        assert status.verdict is not None and status.plan is not None, status
        assert status.verdict.category is Category.HANG and not status.verdict.still_running
        assert status.plan.action is Action.RESTART, status.plan

        async def requeued() -> bool:
            return (await t.h.sched.get_job(job_id)).restart_count == 1

        await t.h.until(requeued, f"job {job_id} requeued", timeout=60)
        assert out_of_service(t) == {}, out_of_service(t)
    finally:
        stop.unlink(missing_ok=True)
    t.alive()
