"""The watcher's catch-up from accounting (relaunch/workers/watch_catchup.py) without Slurm:
when it asks (first poll, a gap), which window, which jobs count and how, what it keeps."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from relaunch.connectors.slurm.accounting import AccountingDisabledError, EndedJobs
from relaunch.models.errors import SchedulerError
from relaunch.models.scheduler import Job, JobState, watched
from relaunch.workers.watch_catchup import MISSED, RECOVERED, CatchUp, CaughtUp

T0 = datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
HOUR = 3600.0


def _job(job_id: str, *, comment: str = "relaunch=on", ended: datetime = T0) -> Job:
    return Job(
        job_id=job_id,
        state=JobState.FAILED,
        comment=comment,
        nodes=["n1"],
        submit_time=ended - timedelta(minutes=5),
        end_time=ended,
    )


class Sink:
    def __init__(self, handled: set[str] | None = None) -> None:
        self.rows: dict[str, CaughtUp] = {}
        self._handled = handled or set()

    async def handled(self, cluster: str, job: Job) -> bool:
        return job.job_id in self._handled or any(
            c.job.job_id == job.job_id for c in self.rows.values()
        )

    async def record(self, caught: Sequence[CaughtUp]) -> int:
        new = [c for c in caught if c.key not in self.rows]
        self.rows.update({c.key: c for c in caught})
        return len(new)


class Accounting:
    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.asked: list[tuple[datetime, datetime]] = []
        self.fail: Exception | None = None

    async def __call__(self, since: datetime, until: datetime, limit: int) -> EndedJobs:
        self.asked.append((since, until))
        if self.fail is not None:
            raise self.fail
        inside = [j for j in self.jobs if j.end_time and since <= j.end_time <= until]
        return EndedJobs(jobs=inside[:limit], dropped=max(0, len(inside) - limit))


def _catch_up(acct: Accounting, sink: Sink, state: Path | None = None, **kw: float) -> CatchUp:
    return CatchUp(
        "dev",
        acct,
        lambda job: watched(job, "dev", partitions=[], opt_in_comment=True),
        sink,
        window_s=kw.get("window_s", 4 * HOUR),
        gap_s=kw.get("gap_s", 60.0),
        limit=int(kw.get("limit", 100)),
        state_file=state,
    )


async def _poll(
    c: CatchUp, wall: datetime, listed: frozenset[str] = frozenset(), clock: float = 0.0
) -> None:
    c.after_poll(wall, set(listed), clock)
    await c.wait(5)


async def test_first_poll_reads_the_window_back_and_records_missed_and_recovered() -> None:
    acct = Accounting(
        [
            _job("1", ended=T0 - timedelta(hours=1)),  # forgotten by slurmctld: missed
            _job("2", ended=T0 - timedelta(minutes=1)),  # still listed: the live path has it
            _job("3", comment="", ended=T0 - timedelta(minutes=2)),  # not opted in
            _job("4", comment="relaunch=off", ended=T0 - timedelta(minutes=3)),
            _job("5", ended=T0 - timedelta(hours=5)),  # older than the window
        ]
    )
    sink = Sink()
    c = _catch_up(acct, sink)
    await _poll(c, T0, frozenset({"2"}))
    assert acct.asked == [(T0 - timedelta(hours=4), T0)]
    outcomes = {c.job.job_id: c.outcome for c in sink.rows.values()}
    assert outcomes == {"1": MISSED, "2": RECOVERED}
    row = next(r for r in sink.rows.values() if r.job.job_id == "1").record()
    assert row.kind == "job_end_caught_up" and row.incident_id == "intake-dev"
    assert row.data["ended_at"] == (T0 - timedelta(hours=1)).isoformat()
    assert row.data["seen_at"] and row.data["outcome"] == MISSED
    assert "no longer known to Slurm" in row.summary


async def test_no_read_between_close_polls_and_one_after_a_gap() -> None:
    acct = Accounting([])
    c = _catch_up(acct, Sink(), gap_s=60)
    await _poll(c, T0)
    await _poll(c, T0 + timedelta(seconds=30))
    await _poll(c, T0 + timedelta(seconds=80))
    assert len(acct.asked) == 1
    await _poll(c, T0 + timedelta(seconds=300))  # 220 s without a good poll
    assert acct.asked[-1] == (T0 + timedelta(seconds=80), T0 + timedelta(seconds=300))


async def test_a_job_already_handled_is_not_recorded_and_nothing_twice() -> None:
    acct = Accounting([_job("1", ended=T0 - timedelta(minutes=10)), _job("7")])
    sink = Sink(handled={"7"})  # a recovery of job 7 was started by a watcher that saw it
    await _poll(_catch_up(acct, sink), T0)
    await _poll(_catch_up(acct, sink), T0 + timedelta(seconds=5))  # a restarted watcher
    assert [c.job.job_id for c in sink.rows.values()] == ["1"]


async def test_state_file_starts_the_next_window_and_is_bounded(tmp_path: Path) -> None:
    state = tmp_path / "watch-state.json"
    acct = Accounting([])
    c = _catch_up(acct, Sink(), state)
    await _poll(c, T0)
    assert json.loads(state.read_text())["last_good_poll"] == T0.isoformat()
    later = _catch_up(acct, Sink(), state)  # the watcher restarted 20 minutes later
    await _poll(later, T0 + timedelta(minutes=20))
    assert acct.asked[-1] == (T0, T0 + timedelta(minutes=20))
    much_later = _catch_up(acct, Sink(), state, window_s=HOUR)  # down for a day
    await _poll(much_later, T0 + timedelta(days=1))
    assert acct.asked[-1][0] == T0 + timedelta(days=1) - timedelta(hours=1)


async def test_a_failed_read_is_tried_again_and_never_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "watch-state.json"
    state.write_text(json.dumps({"last_good_poll": T0.isoformat()}))
    acct = Accounting([])
    acct.fail = SchedulerError("sacct: error: Problem talking to the database")
    c = _catch_up(acct, Sink(), state)
    await _poll(c, T0 + timedelta(minutes=10), clock=100.0)
    # What is kept is where the window not yet read starts, not the last good poll.
    assert json.loads(state.read_text())["last_good_poll"] == T0.isoformat()
    await _poll(c, T0 + timedelta(minutes=10, seconds=1), clock=101.0)
    assert len(acct.asked) == 1  # not at every poll: RETRY_S later
    assert any("failed" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="relaunch.workers.watch_catchup"):
        await _poll(c, T0 + timedelta(minutes=10, seconds=40), clock=140.0)
    assert len(acct.asked) == 2 and not caplog.records  # said once, at the first failure
    acct.fail = None
    await _poll(c, T0 + timedelta(minutes=11), clock=200.0)
    assert acct.asked[-1] == (T0, T0 + timedelta(minutes=11))
    assert (
        json.loads(state.read_text())["last_good_poll"] == (T0 + timedelta(minutes=11)).isoformat()
    )


async def test_without_accounting_it_says_so_once_and_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    acct = Accounting([])
    acct.fail = AccountingDisabledError("Slurm keeps no job accounting on this cluster")
    c = _catch_up(acct, Sink())
    with caplog.at_level(logging.WARNING, logger="relaunch.workers.watch_catchup"):
        await _poll(c, T0)
        await _poll(c, T0 + timedelta(hours=1))
    assert len(acct.asked) == 1 and not c.enabled
    said = [r.getMessage() for r in caplog.records if "catch-up" in r.getMessage()]
    assert len(said) == 1 and "off" in said[0] and "no job accounting" in said[0]


async def test_zero_window_turns_it_off() -> None:
    acct = Accounting([_job("1")])
    c = _catch_up(acct, Sink(), window_s=0)
    await _poll(c, T0)
    await asyncio.sleep(0)
    assert acct.asked == [] and not c.enabled
