"""The restart step refuses a resubmission that would not run as the job's own user, before it
cancels anything, and says why in the audit trail."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    AuditRecord,
    Mode,
    RestartMethod,
)
from relaunch.models.scheduler import ActionResult, Job, JobState


class Cluster(SlurmCli):
    """Slurm's record of one running job of alice; actions are recorded, never run."""

    def __init__(self, submit_as: str) -> None:
        super().__init__(submit_as=submit_as)
        self.job = Job(
            job_id="9", user="alice", user_id=1001, group_id=1002, state=JobState.RUNNING
        )
        self.done: list[str] = []

    async def get_job(self, job_id: str) -> Job:
        return self.job

    async def cancel_job(self, job_id: str) -> ActionResult:
        self.done.append("cancel")
        return ActionResult(action="cancel", target=job_id, changed=True)

    async def resubmit_job(
        self, job_id: str, *, exclude: Sequence[str] = (), nonce: str | None = None
    ) -> ActionResult:
        self.done.append(f"resubmit {self.resubmit_identity(self.job)}")
        return ActionResult(action="resubmit", target=job_id, changed=True, new_job_id="10")


class Audit:
    def __init__(self) -> None:
        self.rows: list[AuditRecord] = []

    async def record(self, row: AuditRecord, dedupe_key: str | None = None) -> bool:
        self.rows.append(row)
        return True

    async def events(self, incident_id: str) -> list[Any]:
        return []


def restart(cluster: Cluster, audit: Audit) -> Any:
    config = ClusterConfig(name="dev", database_url="postgresql://x", bundle_dir="/tmp")
    deps = Deps(config=config, scheduler=cluster, audit=cast(AuditStore, audit))
    plan = ActionPlan(
        request_id="i/plan",
        action=Action.ISOLATE_AND_RESTART,
        mode=Mode.AUTONOMOUS,
        restart_method=RestartMethod.RESUBMIT,
        job_id="9",
        expected_restart_count=0,
    )
    act = ActInput(incident_id="relaunch-dev-9-0", cluster="dev", plan=plan)
    return ActivityEnvironment().run(ActionActivities(deps).restart, act)


async def test_a_non_root_ssh_account_refuses_to_resubmit_another_users_job() -> None:
    cluster, audit = Cluster(submit_as="relaunch"), Audit()
    with pytest.raises(ApplicationError) as failed:
        await restart(cluster, audit)
    assert failed.value.type == "ResubmitIdentityError" and failed.value.non_retryable
    assert cluster.done == []  # the running job was not cancelled
    (row,) = audit.rows
    assert "REFUSED" in row.summary and "--uid" in row.summary


async def test_root_resubmits_as_the_jobs_user() -> None:
    cluster, audit = Cluster(submit_as="root"), Audit()
    outcome = await restart(cluster, audit)
    assert outcome.new_job_id == "10"
    assert cluster.done == ["cancel", "resubmit ['--uid=1001', '--gid=1002']"]
