"""Row 10 of issue 12's attack table: SSH mode as a non-root service account with
``restart_method: resubmit``. Such an account cannot pass ``--uid``, so a resubmission would run
the user's batch script as the service account: Relaunch must refuse it, say why in the audit
trail, and leave the job alone.

The Slurm commands of this module's cluster go through the session's real sshd as
``relaunch-svc`` (an ordinary account); the job is the hostile user's."""

from __future__ import annotations

import subprocess

import pytest

from relaunch.models.recovery import Mode, Policy, RestartMethod
from relaunch.models.scheduler import JobState
from tests.adversarial.hostile import HOSTILE_USER, Tier
from tests.conftest import SLURM_RELEASE

SSH_USER = "relaunch-svc"
POLICY = Policy(
    mode=Mode.AUTONOMOUS,
    restart_method=RestartMethod.RESUBMIT,
    drain_share=0.25,
    drain_cap=1,
    verify_timeout_s=20,
    approval_timeout_s=900,
)
CANARY = "n1"


@pytest.mark.skipif(
    SLURM_RELEASE != "22.05",
    reason="the dev stack's 24.11 commands enter a mount namespace, which needs root: an "
    "ordinary SSH account cannot run them here (the refusal itself is the same on every release)",
)
async def test_resubmit_by_a_non_root_ssh_account_is_refused_and_audited(arena: Tier) -> None:
    t = arena
    script = '#!/bin/bash\necho "srun: error: Node failure on $SLURM_JOB_NODELIST"\nsleep 900\n'
    job_id = t.submit(script, "-N1", f"--exclude={CANARY}")
    await t.running(job_id, printed="Node failure on")
    incident = await t.incident(job_id)
    t.say("10", await t.settled(incident))

    async def refused() -> bool:
        return any("REFUSED" in e.summary for e in await t.h.events(incident, "action"))

    await t.h.until(refused, f"a refused resubmission in {incident}", timeout=120)
    rows = [e.summary for e in await t.h.events(incident, "action") if "REFUSED" in e.summary]
    assert any(SSH_USER in r and "--uid" in r and HOSTILE_USER in r for r in rows), rows

    # The job was neither cancelled nor copied: it still runs as its user, and no job of the
    # service account (or anyone) carries it as its parent.
    job = await t.h.sched.get_job(job_id)
    assert job.state is JobState.RUNNING and job.user == HOSTILE_USER, job
    queue = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i|%u|%k"],
        env=t.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    children = [line for line in queue.splitlines() if f"relaunch_parent={job_id}" in line]
    assert children == [], children
    assert not [line for line in queue.splitlines() if f"|{SSH_USER}|" in line]
    assert t.drained() == {}
    t.alive()

    # A genuine fault is still detected and attributed on the kernel log's word (draining
    # needs root or SlurmUser, which this account is not).
    await t.genuine_fault_is_caught(CANARY, drain=False)
    await t.no_secret_anywhere()
