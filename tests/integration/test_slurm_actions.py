"""The adapter's actions against the real local Slurm: drain, requeue with exclusion,
resubmission, hold/release, cancel — each idempotent and verified."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.commands import LINEAGE_KEY, SlurmCli
from relaunch.models.lineage import NONCE_KEY, new_nonce, nonce_digest, submitted_earlier
from relaunch.models.scheduler import Job, JobState
from tests.conftest import sbatch
from tests.integration.helpers import TRAIN_SCRIPT, wait_job


async def test_drain_requeue_exclude_runs_on_other_nodes(
    scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    job_id = sbatch(
        slurm_env,
        "-N",
        "2",
        "-J",
        "train",
        f"--output={workdir}/train-%j.out",
        "--comment=relaunch=on,max_restarts=2,relaunch_cluster=slurm-actions",
        script=TRAIN_SCRIPT,
    )
    try:
        job = await wait_job(scheduler, job_id, JobState.RUNNING)
        assert len(job.nodes) == 2
        culprit = job.nodes[1]
        assert job.stdout_path == f"{workdir}/train-{job_id}.out"

        drained = await scheduler.drain_node(culprit, f"relaunch incident test-{job_id}")
        assert drained.changed
        node = await scheduler.get_node(culprit)
        assert node.drain_flag and node.reason == f"relaunch incident test-{job_id}"
        again = await scheduler.drain_node(culprit, "second attempt")
        assert not again.changed and "already" in again.note
        assert (await scheduler.get_node(culprit)).reason == f"relaunch incident test-{job_id}"

        requeued = await scheduler.requeue_job(job_id, expected_restart_count=0)
        assert requeued.changed
        pending = await scheduler.get_job(job_id)
        # Requeued: briefly COMPLETING while its processes end, then PENDING.
        assert pending.restart_count == 1
        assert pending.state in {JobState.PENDING, JobState.COMPLETING}
        # A retried requeue (same expected count) must not requeue a second time.
        retried = await scheduler.requeue_job(job_id, expected_restart_count=0)
        assert not retried.changed
        assert (await scheduler.get_job(job_id)).restart_count == 1

        excluded = await scheduler.exclude_nodes(job_id, [culprit])
        assert excluded.changed
        assert culprit in (await scheduler.get_job(job_id)).excluded_nodes

        restarted = await wait_job(scheduler, job_id, JobState.RUNNING, timeout=90)
        assert culprit not in restarted.nodes and len(restarted.nodes) == 2
        # JobFileAppend=1: the first attempt's output survives the requeue.
        await wait_job_output(Path(job.stdout_path), min_lines_from=set(restarted.nodes))
        assert culprit in Path(job.stdout_path).read_text()
    finally:
        await scheduler.cancel_job(job_id)
        for n in await scheduler.list_nodes():
            if n.drain_flag:
                await scheduler.resume_node(n.name)


async def wait_job_output(path: Path, min_lines_from: set[str], timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if all(f"node {n}" in text for n in min_lines_from):
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"no progress from {sorted(min_lines_from)} in {path}")


async def test_resubmit_keeps_lineage_and_avoids_nodes(
    scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    job_id = sbatch(
        slurm_env,
        "-N",
        "2",
        "-J",
        "resub",
        f"--output={workdir}/resub-%j.out",
        "--comment=relaunch=on,relaunch_cluster=slurm-actions",
        script=TRAIN_SCRIPT,
    )
    child_id = None
    try:
        job = await wait_job(scheduler, job_id, JobState.RUNNING)
        avoid = job.nodes[0]
        await scheduler.cancel_job(job_id)
        nonce = new_nonce()
        result = await scheduler.resubmit_job(job_id, exclude=[avoid], nonce=nonce)
        assert result.changed and result.new_job_id and result.new_job_id != job_id
        child_id = result.new_job_id
        child = await wait_job(scheduler, child_id, JobState.RUNNING)
        assert avoid not in child.nodes and len(child.nodes) == 2
        assert child.comment_fields == {
            "relaunch": "on",
            "relaunch_cluster": "slurm-actions",
            LINEAGE_KEY: job_id,
            NONCE_KEY: nonce,
        }
        assert child.name == "resub" and child.stdout_path == f"{workdir}/resub-{child_id}.out"
        # A retry that lost the child's id finds it by the nonce it recorded before sbatch.
        jobs = await scheduler.list_jobs()
        parent = next(j for j in jobs if j.job_id == job_id)
        found = submitted_earlier(parent, jobs, {nonce_digest(nonce)})
        assert found is not None and found.job_id == child_id
    finally:
        await scheduler.cancel_job(job_id)
        if child_id:
            await scheduler.cancel_job(child_id)


async def test_hold_release_cancel_are_idempotent(
    scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    job_id = sbatch(
        slurm_env, "--hold", "-N", "1", f"--output={workdir}/h-%j.out", "--wrap=sleep 60"
    )
    job = await scheduler.get_job(job_id)
    assert job.held
    assert not (await scheduler.hold_job(job_id)).changed
    released = await scheduler.release_job(job_id)
    assert released.changed
    assert not (await scheduler.get_job(job_id)).held
    cancelled = await scheduler.cancel_job(job_id)
    assert cancelled.changed and cancelled.after.startswith("CANCELLED")
    assert (await scheduler.get_job(job_id)).state is JobState.CANCELLED
    assert not (await scheduler.cancel_job(job_id)).changed


async def test_cancel_during_a_requeue_ends_the_job_for_good(
    scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    """A requeued job is COMPLETING on its way back to PENDING: a cancel then must not take
    COMPLETING for an end, or the job runs again."""
    job_id = sbatch(
        slurm_env, "-N", "1", "--requeue", f"--output={workdir}/q-%j.out", "--wrap=sleep 60"
    )
    await wait_job(scheduler, job_id, JobState.RUNNING)
    subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True, timeout=30)
    cancelled = await scheduler.cancel_job(job_id)
    assert cancelled.changed and cancelled.after.startswith("CANCELLED")
    await asyncio.sleep(3)  # it stays ended
    assert (await scheduler.get_job(job_id)).state is JobState.CANCELLED


async def test_a_batch_requeue_requeues_each_running_job_once(
    scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    """One `scontrol requeue` for a rack's jobs: the running ones are requeued once each, the
    others are reported with why, and a retry with the same counts requeues nothing."""
    out = f"--output={workdir}/rq-%j.out"
    running = [sbatch(slurm_env, "-N", "1", "--requeue", out, "--wrap=sleep 300") for _ in range(5)]
    fixed = sbatch(slurm_env, "-N", "1", "--no-requeue", out, "--wrap=sleep 300")
    pending = sbatch(slurm_env, "--hold", "-N", "1", "--requeue", out, "--wrap=sleep 300")
    try:
        for job_id in [*running, fixed]:
            await wait_job(scheduler, job_id, JobState.RUNNING)
        asked = {job_id: 0 for job_id in [*running, fixed, pending, "999999"]}

        results = await scheduler.requeue_jobs(asked)
        assert list(results) == list(asked)
        notes = {job_id: (r.changed, r.note) for job_id, r in results.items()}
        assert notes == {
            **{job_id: (True, "") for job_id in running},
            fixed: (False, "does not allow requeue"),
            pending: (False, "already pending"),
            "999999": (False, "not found"),
        }
        counts = {j.job_id: j.restart_count for j in await scheduler.list_jobs()}
        assert {job_id: counts[job_id] for job_id in [*running, fixed, pending]} == {
            **{job_id: 1 for job_id in running},
            fixed: 0,
            pending: 0,
        }
        assert (await scheduler.get_job(fixed)).state is JobState.RUNNING

        retried = await scheduler.requeue_jobs(asked)  # the same expected counts
        assert not any(r.changed for r in retried.values())
        assert all(retried[job_id].note == "already requeued" for job_id in running)
        counts = {j.job_id: j.restart_count for j in await scheduler.list_jobs()}
        assert all(counts[job_id] == 1 for job_id in running)
    finally:
        for job_id in [*running, fixed, pending]:
            await scheduler.cancel_job(job_id)


BRIEF_SAME = [
    "job_id",
    "name",
    "user",
    "user_id",
    "group_id",
    "state",
    "reason",
    "exit_code",
    "partition",
    "nodes",
    "node_count",
    "batch_host",
    "restart_count",
    "requeue_allowed",
    "comment",
    "stdout_path",
    "stderr_path",
    "work_dir",
    "command",
    "num_tasks",
    "time_limit_minutes",
    "submit_time",
    "end_time",
]


async def test_the_watchers_brief_listing_equals_the_json_listing(
    scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    """The watcher polls with squeue's text format (far cheaper at 10,000 jobs); for every field
    it carries, it must say what `squeue --json` says — running, failed, held, array jobs, and a
    comment full of characters a shell or a parser could trip on."""
    out = f"--output={workdir}/b-%j-%x.out"
    ids = [
        sbatch(slurm_env, "-N", "1", out, "--requeue", "--time=1-02:03:00", "--wrap=sleep 30"),
        sbatch(slurm_env, "-N", "1", out, "--wrap=exit 3"),
        sbatch(
            slurm_env,
            "--hold",
            "-J",
            "odd name",
            out,
            "--comment=relaunch=on,relaunch_cluster=slurm-actions,x=a b|c;$(d)",
            "--wrap=true",
        ),
        sbatch(slurm_env, "--hold", "--array=1-2", "-J", "arr", "--wrap=true"),
    ]
    # The job that exits 3 is FAILED, and the first one is RUNNING, before comparing.
    for _ in range(120):
        states = {j.job_id: j.state for j in await scheduler.list_jobs()}
        if states.get(ids[1]) is JobState.FAILED and states.get(ids[0]) is JobState.RUNNING:
            break
        await asyncio.sleep(0.25)
    text = subprocess.run(
        [
            "squeue",
            "--states=all",
            "--noheader",
            f"--jobs={','.join(ids)}",
            f"--Format={parse.BRIEF_FORMAT}",
        ],
        env={**slurm_env, "SLURM_TIME_FORMAT": "%s"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Read as text, not through the fallback. This test's jobs only: another test's hostile job
    # (a newline in its comment) rightly sends the whole listing to the JSON fallback.
    assert parse.jobs_from_brief(text) is not None

    # This test's jobs only: other tests share the session's cluster, and their jobs start and
    # end between the two reads (and squeue prints the submitting host as an srun job's
    # BatchHost, where the JSON has its first node: no batch host the watcher reads).
    def mine(jobs: list[Job]) -> dict[str, Job]:
        return {j.job_id: j for j in jobs if j.job_id in ids or j.name == "arr"}

    brief = mine(await scheduler.list_jobs_brief())
    full = mine(await scheduler.list_jobs())
    # The active listing (the watcher's between full ones): no pending job, every ended one.
    active = mine(await scheduler.list_jobs_active())
    assert all(job.state is not JobState.PENDING for job in active.values()), active
    ended = {j for j, job in brief.items() if job.state.is_abnormal_end}
    assert ids[1] in ended and ended <= active.keys(), (ended, active.keys())
    assert brief.keys() == full.keys()
    assert {ids[0], ids[1], ids[2]} <= brief.keys()
    assert brief[ids[1]].exit_code.code == 3 and brief[ids[0]].time_limit_minutes == 1563
    assert brief[ids[2]].comment == "relaunch=on,relaunch_cluster=slurm-actions,x=a b|c;$(d)"
    for job_id, job in full.items():
        assert {k: getattr(brief[job_id], k) for k in BRIEF_SAME} == {
            k: getattr(job, k) for k in BRIEF_SAME
        }, job_id
        one = await scheduler.get_job_brief(job_id)  # what polls of one job read
        assert {k: getattr(one, k) for k in BRIEF_SAME} == {
            k: getattr(job, k) for k in BRIEF_SAME
        }, job_id
    for job_id in ids:
        await scheduler.cancel_job(job_id)
