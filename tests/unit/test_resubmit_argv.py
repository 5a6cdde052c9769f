"""The sbatch command line that resubmits a job from its Slurm record."""

from pathlib import Path

import pytest

from relaunch.connectors.slurm import commands, parse
from relaunch.models.errors import InvalidNameError, ResubmitIdentityError
from relaunch.models.scheduler import Job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
OUT = "/tmp/tmp.Bnn9VVdLgi/train-%j.out"
ROOT = commands.Submitter(uid=0)
ALICE = commands.Submitter(name="alice")  # e.g. the SSH account is the job's own user


def recorded(fixture: str, job_id: str) -> Job:
    text = (FIXTURES / f"{fixture}.json").read_text()
    return next(job for job in parse.jobs_from_json(text) if job.job_id == job_id)


def test_running_job_argv() -> None:
    assert commands.resubmit_argv(recorded("squeue_running", "1"), [], submitter=ROOT) == [
        "sbatch",
        "--parsable",
        "--comment=relaunch=on,max_restarts=2,relaunch_parent=1",
        "--open-mode=append",
        "--job-name=train",
        "--partition=debug",
        "--nodes=2",
        "--ntasks=2",
        "--time=525600",
        "--chdir=/work/main",
        f"--output={OUT}",
        f"--error={OUT}",
        "--requeue",
        "--uid=0",
        "--gid=0",
    ]


def test_requeued_job_argv_merges_exclusions() -> None:
    # After the requeue Slurm reports no time limit and n1 excluded.
    assert commands.resubmit_argv(
        recorded("squeue_requeued", "1"), ["n1", "n3"], submitter=ROOT
    ) == [
        "sbatch",
        "--parsable",
        "--comment=relaunch=on,max_restarts=2,relaunch_parent=1",
        "--open-mode=append",
        "--job-name=train",
        "--partition=debug",
        "--nodes=2",
        "--ntasks=2",
        "--chdir=/work/main",
        f"--output={OUT}",
        f"--error={OUT}",
        "--requeue",
        "--exclude=n1,n3",
        "--uid=0",
        "--gid=0",
    ]


def test_lineage_replaces_an_earlier_parent_and_keeps_user_fields() -> None:
    job = Job(job_id="9", user="alice", comment="relaunch=on,relaunch_parent=1,team=nlp")
    assert commands.resubmit_argv(job, [], submitter=ALICE) == [
        "sbatch",
        "--parsable",
        "--comment=relaunch=on,team=nlp,relaunch_parent=9",
        "--open-mode=append",
    ]


def test_exclusions_are_not_repeated() -> None:
    job = Job(job_id="9", user="alice", excluded_nodes=["n1", "n2"])
    argv = commands.resubmit_argv(job, ["n2", "n1", "n4"], submitter=ALICE)
    assert [a for a in argv if a.startswith("--exclude")] == ["--exclude=n1,n2,n4"]


def test_exclusions_given_twice_are_listed_once() -> None:
    job = Job(job_id="9", user="alice", excluded_nodes=["n1"])
    argv = commands.resubmit_argv(job, ["n4", "n4", "n1"], submitter=ALICE)
    assert argv[-1] == "--exclude=n1,n4"


def test_unvalidated_partition_never_reaches_sbatch() -> None:
    job = recorded("squeue_running", "1").model_copy(update={"partition": "p;rm"})
    with pytest.raises(InvalidNameError, match="partition"):
        commands.resubmit_argv(job, [], submitter=ROOT)


def test_a_comment_option_with_a_newline_is_not_carried_to_the_resubmission() -> None:
    # A newline is no part of an option (Job.comment_fields): the resubmission's comment
    # carries the job's other options and the lineage only.
    job = Job(job_id="9", user="alice", comment="relaunch=on,note=a\nb")
    argv = commands.resubmit_argv(job, [], submitter=ALICE)
    assert "--comment=relaunch=on,relaunch_parent=9" in argv


def test_root_resubmits_as_the_job_owner_with_uid_and_gid() -> None:
    job = Job(job_id="9", user="alice", user_id=1001, group_id=1002)
    assert commands.resubmit_argv(job, [], submitter=ROOT)[-2:] == ["--uid=1001", "--gid=1002"]
    # Over SSH as root, too; and without a uid in the record, by name.
    ssh_root = commands.Submitter(name="root")
    assert commands.resubmit_argv(job, [], submitter=ssh_root)[-2:] == ["--uid=1001", "--gid=1002"]
    by_name = Job(job_id="9", user="alice")
    assert commands.resubmit_argv(by_name, [], submitter=ROOT)[-1] == "--uid=alice"


def test_the_jobs_own_user_resubmits_without_uid() -> None:
    job = Job(job_id="9", user="alice", user_id=1001, group_id=1002)
    for me in (commands.Submitter(uid=1001), ALICE):
        assert not any(
            a.startswith(("--uid", "--gid")) for a in commands.resubmit_argv(job, [], submitter=me)
        )


@pytest.mark.parametrize(
    "submitter",
    [commands.Submitter(name="relaunch"), commands.Submitter(uid=1000)],
    ids=["ssh-account", "local-non-root"],
)
def test_another_identity_refuses_to_resubmit(submitter: commands.Submitter) -> None:
    # Without --uid the user's batch script would run as the submitting account.
    job = Job(job_id="9", user="alice", user_id=1001, group_id=1002)
    with pytest.raises(ResubmitIdentityError, match="not resubmitted") as refused:
        commands.resubmit_argv(job, [], submitter=submitter)
    assert not refused.value.retryable and refused.value.hint


def test_root_refuses_a_job_with_no_known_owner() -> None:
    with pytest.raises(ResubmitIdentityError, match="no user"):
        commands.resubmit_argv(Job(job_id="9"), [], submitter=ROOT)


def test_the_scheduler_knows_its_submitting_identity() -> None:
    assert commands.SlurmCli(submit_as="relaunch").submitter == commands.Submitter(name="relaunch")
    job = Job(job_id="9", user="alice", user_id=1001)
    with pytest.raises(ResubmitIdentityError):
        commands.SlurmCli(submit_as="relaunch").resubmit_identity(job)
    assert commands.SlurmCli(submit_as="root").resubmit_identity(job) == ["--uid=1001"]


def test_root_refuses_an_unsafe_owner() -> None:
    with pytest.raises(InvalidNameError, match="user name"):
        commands.resubmit_argv(Job(job_id="9", user="-alice"), [], submitter=ROOT)
