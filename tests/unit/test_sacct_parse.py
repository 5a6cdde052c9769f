"""sacct's JSON (22.05 and 24.11, recorded) as the watcher's catch-up reads it: ended jobs,
their end times and opt-in, bounded, and a job's own text never read as another row."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from relaunch.connectors.slurm.accounting import (
    AccountingDisabledError,
    ended_jobs,
    raise_disabled,
    sacct_argv,
)
from relaunch.models.scheduler import JobState, watched

FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm"
RELEASES = ("22.05", "24.11")
# The recorded job's end, as each release's slurmdbd stored it.
ENDS = {"22.05": 1796435538, "24.11": 1796435649}
WIDE = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


def _text(release: str) -> str:
    return (FIXTURES / f"sacct_{release}.json").read_text()


@pytest.mark.parametrize("release", RELEASES)
def test_recorded_failed_job_is_read_with_its_end_time(release: str) -> None:
    read = ended_jobs(_text(release), since=WIDE[0], until=WIDE[1])
    assert [j.job_id for j in read.jobs] == ["1"]
    job = read.jobs[0]
    assert job.state is JobState.FAILED
    assert job.end_time == datetime.fromtimestamp(ENDS[release], tz=UTC)
    assert job.nodes == ["n1"]
    assert job.partition == "debug"
    assert job.comment == "relaunch=on x|y"
    assert job.name == "evil|name"


@pytest.mark.parametrize("release", RELEASES)
def test_window_and_states_are_checked_again(release: str) -> None:
    end = datetime.fromtimestamp(ENDS[release], tz=UTC)
    after = ended_jobs(_text(release), since=end + timedelta(seconds=1), until=WIDE[1])
    assert after.jobs == []
    before = ended_jobs(_text(release), since=WIDE[0], until=end - timedelta(seconds=1))
    assert before.jobs == []
    edge = ended_jobs(_text(release), since=end, until=end)
    assert [j.job_id for j in edge.jobs] == ["1"]
    other = ended_jobs(_text(release), since=WIDE[0], until=WIDE[1], states=[JobState.TIMEOUT])
    assert other.jobs == []


@pytest.mark.parametrize("release", RELEASES)
def test_limit_keeps_the_oldest_and_counts_the_rest(release: str) -> None:
    data = json.loads(_text(release))
    template = data["jobs"][0]
    data["jobs"] = []
    for n in range(5):
        job = json.loads(json.dumps(template))
        job["job_id"] = 100 + n
        job["time"]["end"] = ENDS[release] - n
        data["jobs"].append(job)
    read = ended_jobs(json.dumps(data), since=WIDE[0], until=WIDE[1], limit=2)
    assert [j.job_id for j in read.jobs] == ["104", "103"]
    assert read.dropped == 3


@pytest.mark.parametrize("release", RELEASES)
def test_forged_name_and_comment_stay_the_jobs_own_text(release: str) -> None:
    """A user's comment and name that would forge rows of sacct's ``|``-separated text (a
    newline, then a whole row of another job, opted in, NODE_FAIL) are that job's text: one
    job, its own id, state and end; and the forged comment opts nothing in (a control
    character makes an option no option)."""
    data = json.loads(_text(release))
    job = data["jobs"][0]
    job["comment"]["job"] = "relaunch=on"
    (plain,) = ended_jobs(json.dumps(data), since=WIDE[0], until=WIDE[1]).jobs
    assert watched(plain, "acct", partitions=[], opt_in_comment=True)
    row = "99|NODE_FAIL|2026-12-05T01:00:00|relaunch=on"
    job["comment"]["job"] = f"x\n{row}"
    job["name"] = f"train\n{row}"
    read = ended_jobs(json.dumps(data), since=WIDE[0], until=WIDE[1])
    assert [(j.job_id, j.state) for j in read.jobs] == [("1", JobState.FAILED)]
    only = read.jobs[0]
    assert only.end_time == datetime.fromtimestamp(ENDS[release], tz=UTC)
    assert only.comment == f"x\n{row}"
    assert not watched(only, "acct", partitions=[], opt_in_comment=True)


def test_garbage_is_a_clear_error() -> None:
    from relaunch.models.errors import SchedulerError

    with pytest.raises(SchedulerError, match="sacct: not JSON"):
        ended_jobs("Slurm accounting storage is disabled", since=WIDE[0], until=WIDE[1])
    with pytest.raises(SchedulerError, match="no job list"):
        ended_jobs('{"jobs": 3}', since=WIDE[0], until=WIDE[1])
    odd = {"jobs": [{"job_id": "x"}, 7, {"job_id": 5, "state": {"current": "FAILED"}}]}
    assert ended_jobs(json.dumps(odd), since=WIDE[0], until=WIDE[1]).jobs == []


def test_accounting_off_is_said() -> None:
    with pytest.raises(AccountingDisabledError, match="no job accounting"):
        raise_disabled("Slurm accounting storage is disabled\n")
    raise_disabled("sacct: error: Problem talking to the database")  # another failure


def test_argv_is_bounded_and_zone_free() -> None:
    now = datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
    argv = sacct_argv(now - timedelta(hours=4), now)
    assert argv[:4] == ["sacct", "--json", "-X", "--allusers"]
    assert argv[argv.index("-S") + 1] == f"now-{4 * 3600 + 60}seconds"
    assert argv[argv.index("-E") + 1] == "now"
    states = argv[-1].removeprefix("--state=").split(",")
    assert {"FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY"} <= set(states)
    assert "COMPLETED" not in states
