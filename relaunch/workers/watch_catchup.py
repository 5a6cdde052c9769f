"""Catch-up from accounting: job ends the watcher did not see while it (or the whole service,
or its view of slurmctld) was down.

The watcher sees a job end by listing the job in its FAILED (etc.) state; slurmctld forgets an
ended job MinJobAge seconds later (300 by default). After an outage longer than that, the end
is gone from every listing; only Slurm's accounting (slurmdbd, read through ``sacct``) still
has it. So, at the first good poll after the watcher starts, and at the first good poll after
a gap between good polls longer than ``gap_s``, the watcher asks accounting once for the jobs
that ended abnormally in the window it did not see:

- from its last good poll (kept in ``state_file``, written at most every ``PERSIST_S`` and
  never past a window not yet caught up), or ``window_s`` back when it has none,
- and never further back than ``window_s`` (0 turns the catch-up off),
- at most ``limit`` jobs (the rest are counted and said).

Of those, only the jobs the watcher watches (opted in by ``relaunch=on``, a watched partition:
the same rule as live) count. Each is then, once:

- still listed by slurmctld (the outage was shorter than MinJobAge): the poll that just ran
  saw it in its ended state and handed it to its recovery as a live end; the catch-up records
  that it was caught up (``recovered``);
- already handled (the audit trail has a recovery of that job started after it was submitted,
  by a watcher that saw it before its outage): nothing;
- otherwise ``missed``: Slurm no longer knows the job, so it can be neither requeued nor
  resubmitted; recorded as such.

Each outcome is one audit row of kind ``job_end_caught_up`` under ``intake-<cluster>``, with the
job's end time (from accounting) and the time it was seen, under a dedupe key of the cluster,
job id and end time: a restarted watcher records nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.slurm.accounting import AccountingDisabledError, EndedJobs
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import intake_incident
from relaunch.models.recovery import AuditRecord, recovery_workflow_id
from relaunch.models.scheduler import Job

logger = logging.getLogger(__name__)

CAUGHT_UP = "job_end_caught_up"
RECOVERED = "recovered"
MISSED = "missed"
PERSIST_S = 30.0  # the last good poll is written at most this often
RETRY_S = 30.0  # a catch-up that failed (sacct, the database) is tried again this much later

ReadEnded = Callable[[datetime, datetime, int], Awaitable[EndedJobs]]


def caught_up_key(cluster: str, job: Job) -> str:
    """One row per job end: the cluster, the job id and its end time."""
    ended = job.end_time.isoformat() if job.end_time else "-"
    return f"{intake_incident(cluster)}:{CAUGHT_UP}:{job.job_id}:{ended}"


class CaughtUp(BaseModel):
    """One job end found in accounting that no poll saw, and what became of it."""

    cluster: str
    job: Job
    outcome: str  # RECOVERED or MISSED
    seen_at: datetime

    @property
    def key(self) -> str:
        return caught_up_key(self.cluster, self.job)

    @property
    def recovery(self) -> str:
        return recovery_workflow_id(self.cluster, self.job.job_id, self.job.restart_count)

    def record(self) -> AuditRecord:
        job = self.job
        ended = f"{job.end_time:%Y-%m-%d %H:%M:%S} UTC" if job.end_time else "at an unknown time"
        if self.outcome == RECOVERED:
            what = f"still known to Slurm: handed to its recovery {self.recovery}"
        else:
            what = "no longer known to Slurm (past MinJobAge): missed, not restarted"
        return AuditRecord(
            incident_id=intake_incident(self.cluster),
            kind=CAUGHT_UP,
            at=self.seen_at,
            actor="relaunch",
            nodes=job.nodes,
            summary=(
                f"job {job.job_id} ended {job.state} at {ended} while the watcher did not "
                f"look; seen in accounting at {self.seen_at:%Y-%m-%d %H:%M:%S} UTC: {what}"
            ),
            data={
                "source": "sacct",
                "outcome": self.outcome,
                "job_id": job.job_id,
                "attempt": job.restart_count,
                "state": job.state.value,
                "ended_at": job.end_time.isoformat() if job.end_time else None,
                "submitted_at": job.submit_time.isoformat() if job.submit_time else None,
                "seen_at": self.seen_at.isoformat(),
                "partition": job.partition,
                "user": job.user,
                "exit_code": str(job.exit_code),
                "recovery": self.recovery if self.outcome == RECOVERED else None,
            },
        )


class Sink(Protocol):
    """Where caught-up job ends go (CatchUpSink: the audit trail)."""

    async def handled(self, cluster: str, job: Job) -> bool: ...

    async def record(self, caught: Sequence[CaughtUp]) -> int: ...


class CatchUpSink:
    """Where caught-up ends go: the audit trail (opened on first use, as the drains' store)."""

    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._store: AuditStore | None = None

    async def _open(self) -> AuditStore:
        if self._store is None:
            self._store = await AuditStore.open(self._database_url, max_size=1, timeout=5)
        return self._store

    async def handled(self, cluster: str, job: Job) -> bool:
        """Whether this job end was recorded before (a caught-up row) or a recovery of the job
        was started after its submission (a watcher saw it live before its outage)."""
        store = await self._open()
        since = (job.submit_time or job.end_time or datetime.now(UTC)) - timedelta(seconds=60)
        async with store.connection() as conn:
            cur = await conn.execute(
                "select 1 from incidents where cluster = %s and job_id = %s and created_at >= %s"
                " and id not like 'intake-%%' limit 1",
                (cluster, job.job_id, since),
            )
            if await cur.fetchone() is not None:
                return True
        return await store.has_dedupe_key(caught_up_key(cluster, job))

    async def record(self, caught: Sequence[CaughtUp]) -> int:
        store = await self._open()
        for cluster in sorted({c.cluster for c in caught}):
            await store.ensure_incident(intake_incident(cluster), cluster, "intake", 0)
        return await store.record_many([(c.record(), c.key) for c in caught])

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None


class CatchUp:
    """The watcher's part: told of each good poll, it asks accounting when the poll follows a
    gap (or is the first), in the background (a slow sacct never holds up a poll)."""

    def __init__(
        self,
        cluster: str,
        read_ended: ReadEnded,
        watches: Callable[[Job], bool],
        sink: Sink,
        *,
        window_s: float,
        gap_s: float,
        limit: int,
        state_file: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self._read = read_ended
        self._watches = watches
        self._sink = sink
        self.window_s = window_s
        self.gap_s = gap_s
        self.limit = limit
        self.state_file = state_file
        self.enabled = window_s > 0
        self._last_good: datetime | None = self._load()
        self._pending: datetime | None = None  # the start of a window not yet caught up
        self._retry_at = 0.0
        self._failing = False
        self._persisted_at = -1e18
        self._task: asyncio.Task[None] | None = None
        self.runs = 0
        self.found: list[CaughtUp] = []  # the last run's (for tests and status)

    def _load(self) -> datetime | None:
        if self.state_file is None:
            return None
        try:
            saved = json.loads(self.state_file.read_text())
            return datetime.fromisoformat(saved["last_good_poll"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring the watcher's state file %s: %s", self.state_file, exc)
            return None

    def _persist(self, clock: float, *, force: bool = False) -> None:
        """Write the last good poll (never past a window not caught up yet), at most every
        PERSIST_S, atomically."""
        if self.state_file is None or self._last_good is None:
            return
        if not force and clock < self._persisted_at + PERSIST_S:
            return
        self._persisted_at = clock
        mark = min(self._last_good, self._pending) if self._pending else self._last_good
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            saved = {"cluster": self.cluster, "last_good_poll": mark.isoformat()}
            tmp.write_text(json.dumps(saved))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            logger.warning("cannot write the watcher's state file %s: %s", self.state_file, exc)

    def after_poll(self, wall: datetime, listed: set[str], clock: float) -> None:
        """A poll that listed ``listed`` (every job slurmctld knows) succeeded at ``wall``."""
        if not self.enabled:
            return
        floor = wall - timedelta(seconds=self.window_s)
        previous = self._last_good
        first = self.runs == 0 and self._pending is None and self._task is None
        if first or (previous is not None and (wall - previous).total_seconds() > self.gap_s):
            since = previous if previous is not None else floor
            self._pending = max(min(since, self._pending or since), floor)
        self._last_good = wall
        if self._pending is not None and clock >= self._retry_at and not self.busy:
            self._task = asyncio.create_task(self._run(self._pending, wall, listed, clock))
        self._persist(clock)

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self, since: datetime, until: datetime, listed: set[str], clock: float) -> None:
        try:
            ended = await self._read(since, until, self.limit)
            caught = await self._sort(ended, listed, datetime.now(UTC))
            if caught:
                await self._sink.record(caught)
        except AccountingDisabledError as exc:
            self.enabled = False
            logger.warning(
                "catch-up from accounting is off: %s (%s)",
                exc,
                exc.hint or "",
                extra={"cluster": self.cluster},
            )
            return
        except (RelaunchError, OSError) as exc:
            self._retry_at = clock + RETRY_S
            # Said once per outage (sacct missing, slurmdbd or the database down), not every
            # RETRY_S.
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            logger.log(level, "catch-up from accounting failed (retrying): %s", exc)
            return
        except Exception:
            self._retry_at = clock + RETRY_S
            logger.exception("catch-up from accounting failed unexpectedly")
            return
        self._failing = False
        self.runs += 1
        self.found = caught
        if self._pending == since:
            self._pending = None
        self._persist(clock, force=True)
        if ended.dropped:
            logger.warning(
                "catch-up: %d more ended jobs than the limit of %d were not looked at",
                ended.dropped,
                self.limit,
            )
        for c in caught:
            logger.info(
                "caught up job %s (%s at %s): %s",
                c.job.job_id,
                c.job.state,
                c.job.end_time,
                c.outcome,
                extra={"job_id": c.job.job_id, "outcome": c.outcome},
            )
        logger.info(
            "caught up from accounting: %s to %s, %d ended jobs, %d watched and unseen",
            f"{since:%H:%M:%S}",
            f"{until:%H:%M:%S}",
            len(ended.jobs),
            len(caught),
        )

    async def _sort(self, ended: EndedJobs, listed: set[str], now: datetime) -> list[CaughtUp]:
        out: list[CaughtUp] = []
        for job in ended.jobs:
            if not self._watches(job):
                continue
            if job.job_id in listed:
                outcome = RECOVERED  # the poll saw it ended: the live path has it
            elif await self._sink.handled(self.cluster, job):
                continue
            else:
                outcome = MISSED
            out.append(CaughtUp(cluster=self.cluster, job=job, outcome=outcome, seen_at=now))
        return out

    async def wait(self, timeout: float) -> None:
        """Let a catch-up in flight finish (the watcher stops), and keep the last good poll."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout)
        self._persist(0.0, force=True)
