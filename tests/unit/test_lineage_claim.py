"""Issue 29 row 3: which job is a resubmission's child. Only a job Relaunch itself submitted
counts: recorded in the audit trail (intent and nonce before ``sbatch``, child id right after)
before anything takes it for the child, and running as the parent's uid. A comment that says
``relaunch_parent=<id>`` proves nothing; a retry after a worker died between ``sbatch`` and its
record still finds the one real child.

The rule (relaunch/models/lineage.py), the restart step against the in-memory cluster, and the
readers (planning's lineage, the console's job links, the scorecard) on an embedded
PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relaunch.connectors.audit import AuditStore
from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import InvalidNameError
from relaunch.models.lineage import (
    NONCE_KEY,
    checked_nonce,
    new_nonce,
    nonce_digest,
    submitted_earlier,
)
from relaunch.models.recovery import AuditRecord, Policy, RestartMethod
from relaunch.models.rollout import ActionKind, Outcome, RolloutSettings
from relaunch.models.scheduler import Job, JobState
from relaunch.rollout.scorecard import load_scorecard
from tests.support.audit_trail import Trail
from tests.support.postgres import embedded_postgres
from tests.unit.test_activities import MemoryAudit, act, activities, cluster, run, running_job

BOB, MALLORY = 1002, 1003
NOW = datetime.now(UTC)


def bobs(job_id: str = "42", **changes: Any) -> Job:
    return running_job(job_id=job_id, user="relaunch-bob", user_id=BOB, **changes)


def mallorys(job_id: str, comment: str) -> Job:
    return Job(
        job_id=job_id,
        user="relaunch-mallory",
        user_id=MALLORY,
        state=JobState.RUNNING,
        nodes=["n3"],
        comment=comment,
    )


# ---------------------------------------------------------------- the rule


def test_only_a_recorded_nonce_of_the_parent_s_user_finds_a_child() -> None:
    parent, nonce = bobs(state=JobState.CANCELLED), new_nonce()
    recorded = {nonce_digest(nonce)}
    child = bobs("50", comment=f"relaunch_parent=42,{NONCE_KEY}={nonce}")
    # Recorded before it is matched: a nonce the audit trail does not hold finds nothing.
    assert submitted_earlier(parent, [parent, child], set()) is None
    assert submitted_earlier(parent, [parent, child], {nonce_digest(new_nonce())}) is None
    assert submitted_earlier(parent, [parent, child], recorded) == child
    # The claim in a comment alone is nothing; another user's copy of the nonce is nothing,
    # even listed first; the parent's own user's copy comes later than the real child.
    claim = mallorys("49", "relaunch_parent=42")
    stolen = mallorys("48", f"relaunch_parent=42,{NONCE_KEY}={nonce}")
    copy = bobs("51", comment=f"relaunch_parent=42,{NONCE_KEY}={nonce}")
    assert submitted_earlier(parent, [copy, stolen, claim, child, parent], recorded) == child
    assert submitted_earlier(parent, [stolen, claim, parent], recorded) is None
    # A nonce is checked before it reaches a command line.
    for bad in ("", "x" * 24, nonce + ",relaunch=on", nonce.upper()):
        with pytest.raises(InvalidNameError):
            checked_nonce(bad)


# ---------------------------------------------------------------- the restart step


async def test_a_comment_claiming_the_parent_is_not_taken_for_the_resubmission() -> None:
    sched, audit = cluster(bobs(), mallorys("43", "relaunch=on,relaunch_parent=42")), MemoryAudit()
    outcome = await run(
        activities(sched, audit).restart, act(restart_method=RestartMethod.RESUBMIT)
    )
    # The victim's script was submitted again, as the victim; the attacker's job is untouched.
    assert outcome.changed and outcome.new_job_id == "44" and sched.submissions == ["44"]
    assert sched.cancels == ["42"] and sched.jobs["43"].state is JobState.RUNNING
    assert sched.jobs["44"].user_id == BOB
    # The intent (with the digest of the child's nonce) was recorded before the child's id.
    kinds = [r.kind for r in audit.rows if r.kind in ("resubmit_intent", "lineage")]
    assert kinds == ["resubmit_intent", "lineage"]
    intent, lineage = audit.kinds("resubmit_intent")[0], audit.kinds("lineage")[0]
    nonce = sched.jobs["44"].comment_fields[NONCE_KEY]
    assert intent.data["nonce_digest"] == nonce_digest(nonce) and nonce not in str(intent)
    assert (lineage.data["parent"], lineage.data["child"]) == ("42", "44")


class CrashingAudit(MemoryAudit):
    """The worker dies right after ``sbatch`` answered: the child's row is never written."""

    crashes = 1

    async def record(self, record: AuditRecord, *, dedupe_key: str | None = None) -> bool:
        if record.kind == "lineage" and self.crashes:
            self.crashes -= 1
            raise ConnectionError("worker killed")
        return await super().record(record, dedupe_key=dedupe_key)


async def test_a_retry_after_a_crash_between_sbatch_and_its_record_finds_the_real_child() -> None:
    sched, audit = cluster(bobs()), CrashingAudit()
    acts, plan = activities(sched, audit), act(restart_method=RestartMethod.RESUBMIT)
    with pytest.raises(Exception, match="worker killed"):
        await run(acts.restart, plan)
    assert sched.submissions == ["43"] and audit.kinds("lineage") == []
    # Meanwhile others read the child's comment: the attacker copies its nonce and its claim,
    # the victim's own later job too.
    nonce = sched.jobs["43"].comment_fields[NONCE_KEY]
    for job in (
        mallorys("44", f"relaunch_parent=42,{NONCE_KEY}={nonce}"),
        bobs("45", comment=f"relaunch_parent=42,{NONCE_KEY}={nonce}"),
    ):
        sched.jobs[job.job_id] = job
    again = await run(acts.restart, plan)
    assert again.new_job_id == "43" and sched.submissions == ["43"]  # one sbatch in all
    assert [r.data["child"] for r in audit.kinds("lineage")] == ["43"]
    # The restart counts once, as done (the earlier attempt did it but could not say so).
    restarts = [r for r in audit.kinds("action") if r.data.get("step") == "restart"]
    assert [(r.data["changed"], r.data["new_job_id"]) for r in restarts] == [(True, "43")]
    # A third try reads the recorded child and submits nothing.
    third = await run(acts.restart, plan)
    assert third.new_job_id == "43" and not third.changed and sched.submissions == ["43"]


async def test_a_child_recorded_before_a_crash_is_counted_once_on_retry() -> None:
    """The worker dies after the child's lineage row, before the restart's own row."""

    class Dies(MemoryAudit):
        crashes = 1

        async def record(self, record: AuditRecord, *, dedupe_key: str | None = None) -> bool:
            if record.kind == "action" and record.data.get("step") == "restart" and self.crashes:
                self.crashes -= 1
                raise ConnectionError("worker killed")
            return await super().record(record, dedupe_key=dedupe_key)

    sched, audit = cluster(bobs(), mallorys("43", "relaunch_parent=42")), Dies()
    acts, plan = activities(sched, audit), act(restart_method=RestartMethod.RESUBMIT)
    with pytest.raises(Exception, match="worker killed"):
        await run(acts.restart, plan)
    again = await run(acts.restart, plan)
    assert again.new_job_id == "44" and sched.submissions == ["44"]
    restarts = [r for r in audit.kinds("action") if r.data.get("step") == "restart"]
    assert [(r.data["changed"], r.data["new_job_id"]) for r in restarts] == [(True, "44")]


# ---------------------------------------------------------------- the readers


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-lineage-") as url:
        yield url


async def _claimed_trail(t: Trail) -> None:
    """Job 42 (the victim) resubmitted by Relaunch as 44 (its lineage row); job 43 (the
    attacker's) has an incident of its own whose evidence shows its comment's claim, and a
    row as the comment lookup of old wrote it ("already resubmitted as 43", unchanged)."""
    at = NOW - timedelta(minutes=30)
    victim = f"relaunch-{t.cluster}-42-0"
    await t.row(victim, "evidence", at, job_id="42", job={"comment": "relaunch=on"})
    await t.row(victim, "verdict", at, job_id="42", category="gpu_hardware")
    await t.row(
        victim,
        "plan",
        at,
        job_id="42",
        mode="autonomous",
        action="isolate_and_restart",
        category="gpu_hardware",
    )
    await t.row(
        victim,
        "action",
        at,
        job_id="42",
        step="restart",
        action="resubmit",
        target="42",
        changed=False,
        new_job_id="43",
        note="already resubmitted as 43",
    )
    await t.row(victim, "lineage", at, job_id="42", parent="42", child="44")
    await t.row(victim, "verify", at + timedelta(seconds=5), job_id="42")
    attacker = f"relaunch-{t.cluster}-43-0"
    await t.row(
        attacker, "evidence", at, job_id="43", job={"comment": "relaunch=on,relaunch_parent=42"}
    )
    # The real child failed the same way soon after.
    child = f"relaunch-{t.cluster}-44-0"
    await t.row(
        child,
        "evidence",
        at + timedelta(minutes=2),
        job_id="44",
        job={"comment": "relaunch=on,relaunch_parent=42"},
    )
    await t.row(child, "verdict", at + timedelta(minutes=2), job_id="44", category="gpu_hardware")


async def test_planning_and_the_console_read_lineage_from_the_audit_trail(pg_url: str) -> None:
    store = await AuditStore.open(pg_url)
    db = ConsoleDb(pg_url)
    await db.start()
    try:
        await _claimed_trail(Trail(store, "claims"))
        # The console's job page: the victim's child is the recorded one, and the attacker's
        # job is nobody's child.
        assert await db.job_links("claims", "42") == (None, ["44"])
        assert await db.job_links("claims", "43") == (None, [])
        assert await db.lineage("claims", "43") == ["43"]
        assert await db.lineage("claims", "44") == ["42", "44"]
        # Planning's lineage (the restart budget and earlier unknown causes count over it).
        assert await store.lineage("claims", "44") == ["44", "42"]
        assert await store.lineage("claims", "43") == ["43"]
        assert await store.resubmitted_from("claims", "43") is None
    finally:
        await db.close()
        await store.close()


async def test_the_scorecard_judges_the_recorded_child(pg_url: str) -> None:
    store = await AuditStore.open(pg_url)
    cfg = ClusterConfig(
        name="claimscore",
        database_url="postgresql://unused",
        bundle_dir="/tmp",
        policy=Policy(),
        rollout=RolloutSettings(restart_ok_after_s=600.0),
    )
    try:
        await _claimed_trail(Trail(store, cfg.name))
        await Trail(store, cfg.name).row(
            f"relaunch-{cfg.name}-42-0",
            "action",
            NOW - timedelta(minutes=30),
            job_id="42",
            step="restart",
            action="resubmit",
            target="42",
            changed=True,
            new_job_id="44",
        )
        card = await load_scorecard(store, cfg, since=NOW - timedelta(days=1), now=NOW)
    finally:
        await store.close()
    restarts = [j for j in card.judged if j.action is ActionKind.RESTART]
    # The child Relaunch submitted failed the same way within the window: a wrong restart.
    assert [(j.incident_id, j.outcome) for j in restarts] == [
        (f"relaunch-{cfg.name}-42-0", Outcome.WRONG)
    ], restarts
    assert restarts[0].why == f"relaunch-{cfg.name}-44-0: gpu_hardware again"
