"""The sbatch command line that resubmits a job from its Slurm record."""

from pathlib import Path

import pytest

from relaunch.connectors.slurm import cli, parse
from relaunch.models.errors import InvalidNameError
from relaunch.models.scheduler import Job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
OUT = "/tmp/tmp.Bnn9VVdLgi/train-%j.out"


def recorded(fixture: str, job_id: str) -> Job:
    text = (FIXTURES / f"{fixture}.json").read_text()
    return next(job for job in parse.jobs_from_json(text) if job.job_id == job_id)


def test_running_job_argv() -> None:
    assert cli.resubmit_argv(recorded("squeue_running", "1"), []) == [
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
    ]


def test_requeued_job_argv_merges_exclusions() -> None:
    # After the requeue Slurm reports no time limit and n1 excluded.
    assert cli.resubmit_argv(recorded("squeue_requeued", "1"), ["n1", "n3"]) == [
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
    ]


def test_lineage_replaces_an_earlier_parent_and_keeps_user_fields() -> None:
    job = Job(job_id="9", comment="relaunch=on,relaunch_parent=1,team=nlp")
    assert cli.resubmit_argv(job, []) == [
        "sbatch",
        "--parsable",
        "--comment=relaunch=on,team=nlp,relaunch_parent=9",
        "--open-mode=append",
    ]


def test_exclusions_are_not_repeated() -> None:
    job = Job(job_id="9", excluded_nodes=["n1", "n2"])
    argv = cli.resubmit_argv(job, ["n2", "n1", "n4"])
    assert [a for a in argv if a.startswith("--exclude")] == ["--exclude=n1,n2,n4"]


def test_exclusions_given_twice_are_listed_once() -> None:
    argv = cli.resubmit_argv(Job(job_id="9", excluded_nodes=["n1"]), ["n4", "n4", "n1"])
    assert argv[-1] == "--exclude=n1,n4"


def test_unvalidated_partition_never_reaches_sbatch() -> None:
    job = recorded("squeue_running", "1").model_copy(update={"partition": "p;rm"})
    with pytest.raises(InvalidNameError, match="partition"):
        cli.resubmit_argv(job, [])


def test_unsafe_comment_is_refused() -> None:
    job = Job(job_id="9", comment="relaunch=on,note=a\nb")
    with pytest.raises(InvalidNameError, match="comment"):
        cli.resubmit_argv(job, [])


def test_root_resubmits_as_the_job_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(job_id="9", user="alice")
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    assert cli.resubmit_argv(job, [])[-1] == "--uid=alice"
    assert not any(
        a.startswith("--uid")
        for a in cli.resubmit_argv(job.model_copy(update={"user": "root"}), [])
    )
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert not any(a.startswith("--uid") for a in cli.resubmit_argv(job, []))


def test_root_refuses_an_unsafe_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    with pytest.raises(InvalidNameError, match="user name"):
        cli.resubmit_argv(Job(job_id="9", user="-alice"), [])
