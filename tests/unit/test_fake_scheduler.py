"""The tests' FakeScheduler behaves as SlurmCli where tests rely on it: the batch requeue."""

from __future__ import annotations

import pytest

from relaunch.models.errors import InvalidNameError
from relaunch.models.scheduler import Job, JobState
from tests.support.fake_scheduler import FakeScheduler


def rack() -> FakeScheduler:
    """Two running jobs, one pending, one running that may not be requeued, one requeued once,
    one cancelled (Slurm would requeue it: an ended batch job)."""
    return FakeScheduler(
        jobs=[
            Job(job_id="11", state=JobState.RUNNING, nodes=["n1"], requeue_allowed=True),
            Job(job_id="12", state=JobState.RUNNING, nodes=["n2"], requeue_allowed=True),
            Job(job_id="13", state=JobState.PENDING, requeue_allowed=True),
            Job(job_id="14", state=JobState.RUNNING, nodes=["n3"], requeue_allowed=False),
            Job(job_id="15", state=JobState.RUNNING, requeue_allowed=True, restart_count=1),
            Job(job_id="16", state=JobState.CANCELLED, requeue_allowed=True),
        ]
    )


async def test_a_batch_requeue_decides_each_job_as_requeue_job_would() -> None:
    sched = rack()
    asked = {"12": 0, "11": 0, "13": 0, "14": 0, "15": 0, "16": 0, "999999": 0}
    results = await sched.requeue_jobs(asked)
    assert list(results) == list(asked)
    assert {j: (r.changed, r.note) for j, r in results.items()} == {
        "12": (True, ""),
        "11": (True, ""),
        "13": (False, "already pending"),
        "14": (False, "does not allow requeue"),
        "15": (False, "already requeued"),
        # Someone cancelled it (a user, a clean-up) while a decision's batch was under way.
        "16": (False, "cancelled: someone's decision, not undone by a requeue"),
        "999999": (False, "not found"),
    }
    assert sched.requeues == ["12", "11"]
    assert sched.calls == [("requeue_jobs", ["11", "12", "13", "14", "15", "16", "999999"])]
    assert sched.jobs["11"].state is JobState.PENDING and sched.jobs["11"].restart_count == 1


async def test_a_retried_batch_requeues_nothing_twice() -> None:
    sched = rack()
    await sched.requeue_jobs({"11": 0, "12": 0})
    again = await sched.requeue_jobs({"11": 0, "12": 0})
    assert [(r.changed, r.note) for r in again.values()] == [(False, "already requeued")] * 2
    assert sched.requeues == ["11", "12"]


async def test_a_bad_id_stops_the_batch_before_anything_is_requeued() -> None:
    sched = rack()
    with pytest.raises(InvalidNameError):
        await sched.requeue_jobs({"11": 0, "12;rm": 0})
    assert sched.requeues == [] and sched.calls == []
