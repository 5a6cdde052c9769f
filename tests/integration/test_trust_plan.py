"""The trust model through the real `gather_evidence`, `attribute` and `plan` activities (real
Slurm, real PostgreSQL audit trail): the bundle records whose job it is and when it was
submitted; a node that one user's job names by its output alone is excluded, not drained; when
a job of a second user names it too, the plan sends it to its lifecycle's checks, and still does
not drain it."""

from __future__ import annotations

import asyncio
import getpass
import uuid
from datetime import UTC, datetime
from pathlib import Path

from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.bundles import write_bundle
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack.stack import Stack
from relaunch.models.bundle import BundleJob
from relaunch.models.recovery import (
    Action,
    ActionPlan,
    AttributeInput,
    EvidenceSummary,
    GatherInput,
    JobSnapshot,
    PlanInput,
)
from tests.conftest import sbatch

NODES = ["n1", "n2"]
PRINTED = "0: step=3 loss=0.9\nsrun: error: Node failure on n2\n"


async def test_suspicion_of_two_users_sends_the_node_to_its_checks_and_drains_nothing(
    stack: Stack, scheduler: SlurmCli, tmp_path: Path
) -> None:
    config = stack.cluster_config()
    cluster = f"trust{uuid.uuid4().hex[:6]}"  # a trail of its own: other tests' suspects differ
    audit = await AuditStore.open(config.database_url)
    activities = EvidenceActivities(Deps(config=config, scheduler=scheduler, audit=audit))

    async def recover(job_id: str, user: str) -> ActionPlan:
        incident = f"relaunch-{cluster}-{job_id}-0"
        await audit.ensure_incident(incident, cluster, job_id, 0)
        job = BundleJob(
            cluster=cluster,
            job_id=job_id,
            state="FAILED",
            nodes=NODES,
            node_states=dict.fromkeys(NODES, "IDLE"),
            observed_at=datetime.now(UTC),
            user=user,
        )
        path = write_bundle(tmp_path / incident, job, PRINTED)
        verdict = await activities.attribute(
            AttributeInput(incident_id=incident, bundle_path=str(path))
        )
        assert verdict.action is Action.EXCLUDE_AND_RESTART and verdict.corroboration == {"n2": []}
        evidence = EvidenceSummary(
            incident_id=incident,
            bundle_path=str(path),
            job=JobSnapshot(job_id=job_id, nodes=NODES, user=user),
        )
        return await activities.plan(
            PlanInput(
                incident_id=incident,
                cluster=cluster,
                verdict=verdict,
                evidence=evidence,
                policy=config.policy,
            )
        )

    try:
        first = await recover("9001", "ana")
        assert first.action is Action.EXCLUDE_AND_RESTART and first.drain_nodes == []
        assert (first.exclude_nodes, first.suspect_nodes) == (["n2"], ["n2"])
        again = await recover("9002", "ana")  # the same user's second job: still one voice
        assert again.action is Action.EXCLUDE_AND_RESTART and again.drain_nodes == []
        second = await recover("9003", "bo")  # a second user: checked, still not drained
        assert second.action is Action.EXCLUDE_AND_RESTART and second.drain_nodes == []
        assert second.check_nodes == ["n2"]
        assert any("different users" in r for r in second.reasons)
        rows = await audit.events(f"relaunch-{cluster}-9003-0")
        verdict_row = next(r for r in rows if r.kind == "verdict")
        assert (verdict_row.data["suspects"], verdict_row.data["user"]) == (["n2"], "bo")
        assert verdict_row.data["implicated"] == []  # the job's word charges no reputation
        plan_row = next(r for r in rows if r.kind == "plan")
        assert plan_row.data["history"]["suspected_by"] == {"n2": ["ana", "bo"]}  # type: ignore[index]
    finally:
        await audit.close()


async def test_the_evidence_and_the_bundle_record_the_jobs_user_and_submit_time(
    stack: Stack, scheduler: SlurmCli, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    job_id = sbatch(
        slurm_env,
        f"--output={tmp_path}/out-%j.log",
        # Tagged with the stack's own cluster: the harnesses' watchers on this Slurm leave it.
        f"--comment=relaunch=on,relaunch_cluster={stack.config.cluster}",
        "--wrap=echo hello; exit 1",
    )
    for _ in range(200):
        job = await scheduler.get_job(job_id)
        if job.state.is_terminal:
            break
        await asyncio.sleep(0.3)
    assert job.state.is_terminal, job.state
    config = stack.cluster_config()
    audit = await AuditStore.open(config.database_url)
    incident = f"relaunch-{config.name}-{job_id}-0"
    try:
        await audit.ensure_incident(incident, config.name, job_id, 0)
        activities = EvidenceActivities(Deps(config=config, scheduler=scheduler, audit=audit))
        summary = await activities.gather_evidence(
            GatherInput(incident_id=incident, cluster=config.name, job_id=job_id, attempt=0)
        )
    finally:
        await audit.close()
    recorded = BundleJob.model_validate_json((Path(summary.bundle_path) / "job.json").read_text())
    assert recorded.user == getpass.getuser() and recorded.submit_time is not None
    # The plan reads whose job it is from the evidence itself, never back from the bundle: a
    # worker that plans need not see the directory the gathering worker wrote.
    assert summary.job.user == getpass.getuser()
    assert recorded.submit_time <= recorded.observed_at
