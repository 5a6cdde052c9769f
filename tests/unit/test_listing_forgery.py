"""Slurm's brief text listing cannot be forged from a job's comment (issue 29, row 2), on what
the real Slurm 22.05 prints (tests/fixtures/slurm/forged/, recorded by
tests/support/record_listing_forgery.py); and the other places a user's text reaches: the
identity a job file is read as, the output path patterns, the comment's options, the CLI.

The recording: relaunch-mallory's job 1 on n1, its comment the one of
tests/support/listing_forgery.py. ``brief_plain.txt`` is squeue's answer to the listing's
fields without the closing job id (what Relaunch asked before): job 1's row ends with uid 0 and
``/etc/relaunch/env`` as its output, then a RUNNING job 99999 of relaunch-bob (uid 1003) on n2
and a job 99998 that Slurm never had. ``brief_closed.txt`` is the same job with the fields asked
now; ``*_adapted`` the same after the user rewrote the comment (``scontrol update``, allowed to
a job's own user) to close every forged row with an id.
"""

from __future__ import annotations

import json
import pwd
from collections.abc import Sequence
from pathlib import Path

import pytest

from relaunch.cli import exits
from relaunch.cli.main import _job_line
from relaunch.connectors.joboutput import job_identity
from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.models.errors import JobNotFoundError, ResubmitIdentityError
from relaunch.models.scheduler import Job, watched

FORGED = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "forged"


class RecordedSlurm:
    """squeue as recorded: the JSON listing, or the text listing for the fields asked for
    (with or without the closing job id)."""

    def __init__(self, suffix: str) -> None:
        self.suffix, self.argvs = suffix, list[tuple[str, ...]]()

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        self.argvs.append(tuple(argv))
        if "--json" in argv:
            name = f"squeue{self.suffix}.json"
        else:
            fmt = next(a for a in argv if a.startswith("--Format="))
            fields = [item.split(":")[0] for item in fmt.removeprefix("--Format=").split(",")]
            closed = fields.count("JobID") == 2  # the job id opens and closes each row
            name = f"brief_{'closed' if closed else 'plain'}{self.suffix}.txt"
        return CommandResult(tuple(argv), 0, (FORGED / name).read_text(), "", 0.0)


def _json_job(suffix: str) -> Job:
    (raw,) = json.loads((FORGED / f"squeue{suffix}.json").read_text())["jobs"]
    return parse.job_from_json(raw)


@pytest.mark.parametrize("suffix", ["", "_adapted"])
async def test_a_forging_comment_gives_no_made_up_job_and_no_forged_identity(
    suffix: str,
) -> None:
    """What the watcher polls and the evidence reads: Slurm's one job, with Slurm's uid,
    output path and start time; the made-up jobs are not found."""
    real = _json_job(suffix)
    assert (real.job_id, real.user, real.user_id) == ("1", "relaunch-mallory", 1002)
    slurm = SlurmCli(runner=RecordedSlurm(suffix))
    listed = await slurm.list_jobs_brief()
    assert [j.job_id for j in listed] == ["1"]
    for job in (listed[0], await slurm.get_job_brief("1")):
        assert (job.user, job.user_id, job.group_id) == ("relaunch-mallory", 1002, 1002)
        assert job.stdout_path == real.stdout_path != "/etc/relaunch/env"
        assert job.start_time == real.start_time and job.submit_time == real.submit_time
    for made_up in ("99999", "99998"):
        with pytest.raises(JobNotFoundError):
            await SlurmCli(runner=RecordedSlurm(suffix)).get_job_brief(made_up)
    assert await SlurmCli(runner=RecordedSlurm(suffix))._jobs_brief(["1", "99999"]) == {
        "1": listed[0],
        "99999": None,
    }


def test_a_forged_text_listing_is_refused_whole_and_says_where() -> None:
    for name in ("brief_closed.txt", "brief_closed_adapted.txt"):
        listing = parse.BriefListing((FORGED / name).read_text())
        assert not listing.valid and listing.all() is None, name
        assert listing.why.startswith("line "), listing.why  # no user text in the reason
    assert "mallory" not in parse.BriefListing((FORGED / "brief_closed.txt").read_text()).why


def test_a_jobs_file_is_not_read_as_root_for_a_name_that_is_not_roots() -> None:
    """uid 0 with a user's name (what a forged row said) reads no file; a name this host
    gives another uid brings no groups of that user; agreeing ones read as before."""
    root = pwd.getpwuid(0).pw_name
    assert job_identity(Job(job_id="1", user="relaunch-mallory", user_id=0)) is None
    ident = job_identity(Job(job_id="1", user=root, user_id=0, group_id=0))
    assert ident is not None and ident.uid == 0
    # Slurm's "root" for uid 4242 (another passwd): uid and gid as Slurm says, not root's groups.
    other = job_identity(Job(job_id="1", user=root, user_id=4242, group_id=4243))
    assert other is not None and (other.uid, other.gids) == (4242, frozenset({4243}))
    unknown = job_identity(Job(job_id="1", user="nobody-here-xyz", user_id=2_000_000_001))
    assert unknown is not None and unknown.uid == 2_000_000_001  # unknown here: Slurm's uid


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        # What slurmstepd wrote for these patterns on Slurm 22.05 (job 3, name "nm").
        ("a-%20j.out", "/w/a-0000000003.out"),
        ("c-%99999999999999999999999j.out", "/w/c-0000000003.out"),
        ("d-%x.out", "/w/d-nm.out"),
        ("%x" * 3000, ""),  # past PATH_MAX: no path, not megabytes
    ],
)
def test_an_output_pattern_expands_as_slurm_does_and_bounded(pattern: str, path: str) -> None:
    job = Job(job_id="3", name="nm", work_dir="/w", user="u")
    assert parse.expand_output_pattern(pattern, job) == path


@pytest.mark.parametrize(
    "comment",
    ["relaunch=on\x1f", "relaunch=on\n", "relaunch=on\x1f/etc/shadow\x1f", "relaunch\x1e=on"],
)
def test_a_comment_option_holding_a_control_character_is_no_option(comment: str) -> None:
    assert "relaunch" not in Job(job_id="1", comment=comment).comment_fields
    assert Job(job_id="1", comment=f"{comment},relaunch_cluster=a").comment_fields == {
        "relaunch_cluster": "a"
    }


@pytest.mark.parametrize(
    "comment",
    [
        "relaunch=on,relaunch_cluster=a\x1fUserId=0",  # the forged listing's job
        "relaunch=on,\nrelaunch_cluster=a",
        "relaunch=on,RELAUNCH_cluster\x1e=a",
    ],
)
def test_a_garbled_relaunch_option_opts_the_job_out_of_every_deployment(comment: str) -> None:
    """Its `relaunch_cluster=` is no option, and the job is not then everyone's: it is no one's
    (before, every Relaunch on the Slurm cluster watched it, cluster "b" included)."""
    job = Job(job_id="1", comment=comment, partition="gpu")
    assert job.garbled_option
    for cluster in ("a", "b"):
        assert not watched(job, cluster, partitions=["gpu"], opt_in_comment=True)
    clean = Job(job_id="2", comment="relaunch=on,relaunch_cluster=a,note=x\x1fy")
    assert not clean.garbled_option and watched(clean, "a", partitions=[], opt_in_comment=True)


def test_a_users_escapes_never_reach_the_operators_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`relaunch slurm jobs` and an error quoting a job's user or name print no escape."""
    hostile = "x\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
    line = _job_line(Job(job_id="1", reason=hostile, partition="debug\x1b[31m"))
    assert "\x1b" not in line and "\x9b" not in line and "\u202e" not in line
    with pytest.raises(SystemExit):
        exits.fail(ResubmitIdentityError(f"job 1 belongs to {hostile}"))
    err = capsys.readouterr().err
    assert err.startswith("error: job 1 belongs to x") and "\x1b" not in err
    assert "\x9b" not in err


def test_json_for_the_terminal_escapes_what_the_encoder_leaves_raw() -> None:
    from relaunch.cli.terminal import json_text

    text = Job(job_id="1", name="a\x7f\x9b2J\u202eb\u2028").model_dump_json()
    safe = json_text(text)
    assert json.loads(safe) == json.loads(text)
    assert not any(c in safe for c in "\x7f\x9b\u202e\u2028")
