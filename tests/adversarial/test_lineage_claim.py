"""Row 3 of issue 29: resubmission lineage claimed by another user's comment.

With ``restart_method: resubmit``, the victim's (``relaunch-bob``) job faults for real (an Xid 79
in its node's kernel log) while the attacker (``relaunch-mallory``) runs a job whose comment says
``relaunch_parent=<victim's id>``. Relaunch must resubmit the victim's script as the victim, leave
the attacker's job alone, verify the real child, and show only the real child as the victim's
lineage (the audit trail's, the console's)."""

from __future__ import annotations

import os
import re
import subprocess

from relaunch.models.recovery import RestartMethod, Stage
from relaunch.models.scheduler import JobState
from tests.adversarial.conftest import DEFAULT_POLICY
from tests.adversarial.hostile import OTHER_USER, QUIET_JOB, Tier, ensure_user
from tests.integration.helpers import wait_job

POLICY = DEFAULT_POLICY.model_copy(update={"restart_method": RestartMethod.RESUBMIT})
VICTIM_NODE, ATTACKER_NODE = "n1", "n3"


def _lineage_on_page(html: str) -> list[str]:
    """The job ids of the job page's lineage line, in order."""
    line = re.search(r'<p data-test="lineage">(.*?)</p>', html, re.S)
    assert line, html[:2000]
    return re.findall(r">\s*(\d+)\s*<", line.group(1))


async def test_a_comment_claiming_the_parent_is_not_taken_for_its_resubmission(
    arena: Tier,
) -> None:
    t = arena
    bob = ensure_user(OTHER_USER)
    out = t.h.tmp / "bob"
    out.mkdir(exist_ok=True)
    os.chown(out, bob.pw_uid, bob.pw_gid)
    victim = t.submit(QUIET_JOB, "-N1", "-n1", "-w", VICTIM_NODE, f"-o{out}/%j.out", user=bob)
    await wait_job(t.h.sched, victim, JobState.RUNNING, timeout=60)
    # The attacker's job claims to be the victim's resubmission, before the fault.
    attacker = t.submit(
        QUIET_JOB, "-N1", "-n1", "-w", ATTACKER_NODE, comment=f"relaunch_parent={victim}"
    )
    await t.running(attacker, printed="ready on")

    incident = await t.inject_until_detected(VICTIM_NODE, victim)
    status = await t.h.wait_stage(incident, {Stage.DONE}, timeout=150)
    t.say("3", status)

    # Verify judged a job of the victim's, not the attacker's: the victim's script submitted
    # again, as the victim, off the failed node.
    verified = [v.data["job_id"] for v in await t.h.events(incident, "verify")]
    assert len(verified) == 1 and verified[0] != attacker, (verified, attacker)
    child = str(verified[0])
    t.h.jobs.append(child)
    job = await t.h.sched.get_job(child)
    assert child != victim and (job.user, job.user_id) == (OTHER_USER, bob.pw_uid), job
    assert VICTIM_NODE not in job.nodes and job.state is JobState.RUNNING, job
    # It is the child the audit trail recorded, and no action touched the attacker's job.
    rows = await t.h.events(incident, "lineage")
    assert [(r.data["parent"], r.data["child"]) for r in rows] == [(victim, child)], rows
    actions = await t.h.events(incident, "action")
    assert not any(attacker in (e.data.get("target"), e.data.get("new_job_id")) for e in actions)

    # The attacker's job was neither cancelled nor adopted: it still runs, as its user.
    theirs = await t.h.sched.get_job(attacker)
    assert theirs.state is JobState.RUNNING and theirs.user == t.user.pw_name, theirs

    # Lineage, as planning and the console read it: the real child only.
    cluster = t.h.config.name
    assert await t.h.audit.lineage(cluster, child) == [child, victim]
    assert await t.h.audit.lineage(cluster, attacker) == [attacker]
    auth = {"authorization": f"Bearer {t.token}"}
    page = t.console.get(f"/jobs/{victim}?cluster={cluster}", headers=auth)
    assert page.status_code == 200, page.text[:500]
    assert _lineage_on_page(page.text) == [victim, child], page.text[:3000]

    # What squeue shows: exactly one job of the victim's user names the victim as its parent
    # besides the attacker's claim (the comment is for people; nothing trusts it).
    queue = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i|%u|%k"],
        env=t.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    claims = sorted(
        line.split("|")[0] for line in queue.splitlines() if f"relaunch_parent={victim}" in line
    )
    assert claims == sorted([child, attacker]), queue

    # The genuine fault was caught and drained its node, and no healthy node was drained.
    assert set(t.drained()) == {VICTIM_NODE}, t.drained()
    assert incident in t.drained()[VICTIM_NODE]
    t.alive()
