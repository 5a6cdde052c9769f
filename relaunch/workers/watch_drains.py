"""Slurm drains made by others on the nodes of watched jobs: read back and recorded.

A node may be drained by something other than Relaunch: Slurm's HealthCheckProgram (NHC), a
site script, an admin's ``scontrol update nodename=n3 state=drain reason=...``. Relaunch's own
drains carry ``relaunch incident <id>`` or ``relaunch: ...`` (``RELAUNCH_REASONS``); any other
drain of a node a watched job is allocated is recorded once in the audit trail, as a row of kind
``external_drain`` under ``intake-<cluster>`` (what came from outside Relaunch), naming the
node, with the reason, the node's state, who set the reason and when (as Slurm says) and the
watched jobs on the node. The node's history shows it (``relaunch nodes history``, the
console's nodes page).

Cost: nothing more is asked of Slurm. The watcher's poll already lists the nodes while a
watched job runs; this looks at that listing, only at the nodes of the watched jobs, at most
once every ``CHECK_INTERVAL_S``, and writes only drains not recorded before (one write in
flight at a time; a drain is known by node, reason and Slurm's reason time, which the row's
dedupe key repeats, so a restarted watcher records nothing twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from relaunch.connectors.audit import AuditStore
from relaunch.models.intake import intake_incident
from relaunch.models.recovery import RELAUNCH_REASONS, AuditRecord
from relaunch.models.scheduler import Job, JobState, Node

logger = logging.getLogger(__name__)

EXTERNAL_DRAIN = "external_drain"
CHECK_INTERVAL_S = 5.0
MAX_KNOWN = 10_000  # drains remembered as recorded (then forgotten: the dedupe key still holds)
_ALLOCATED = frozenset({JobState.RUNNING, JobState.COMPLETING})


class ExternalDrain(BaseModel):
    """A drain of a watched job's node that Relaunch did not make."""

    cluster: str
    node: str
    reason: str
    state: str = Field(description="the node's state and flags, e.g. MIXED+DRAIN")
    user: str = Field(default="", description="who set the reason, as Slurm says")
    reason_time: datetime | None = Field(default=None, description="when, as Slurm says")
    jobs: list[str] = Field(description="the watched jobs allocated the node")
    seen_at: datetime

    @property
    def key(self) -> str:
        """One row per drain: the node, the reason and Slurm's time of the reason."""
        when = self.reason_time.isoformat() if self.reason_time else "-"
        reason = hashlib.sha256(self.reason.encode()).hexdigest()[:16]
        return f"{intake_incident(self.cluster)}:{EXTERNAL_DRAIN}:{self.node}:{when}:{reason}"

    def record(self) -> AuditRecord:
        by = f" by {self.user}" if self.user else ""
        at = f" at {self.reason_time:%Y-%m-%d %H:%M:%S}" if self.reason_time else ""
        return AuditRecord(
            incident_id=intake_incident(self.cluster),
            kind=EXTERNAL_DRAIN,
            at=self.seen_at,
            actor=self.user or "slurm",
            nodes=[self.node],
            summary=(
                f"{self.node} drained outside Relaunch{by}{at}: {self.reason[:200]} "
                f"({self.state}; watched job(s) {', '.join(self.jobs)})"
            ),
            data={
                "source": "slurm",
                "node": self.node,
                "reason": self.reason,
                "state": self.state,
                "user": self.user,
                "reason_time": self.reason_time.isoformat() if self.reason_time else None,
                "jobs": self.jobs,
            },
        )


def external_drains(
    cluster: str, jobs: Sequence[Job], nodes: Mapping[str, Node], now: datetime
) -> list[ExternalDrain]:
    """The drains of the nodes allocated to ``jobs`` (the watched ones) that are not
    Relaunch's, from one listing of the nodes."""
    on: dict[str, list[str]] = {}
    for job in jobs:
        if job.state in _ALLOCATED:
            for name in job.nodes:
                on.setdefault(name, []).append(job.job_id)
    out: list[ExternalDrain] = []
    for name, job_ids in sorted(on.items()):
        node = nodes.get(name)
        if node is None or not node.drain_flag or node.reason.startswith(RELAUNCH_REASONS):
            continue
        out.append(
            ExternalDrain(
                cluster=cluster,
                node=name,
                reason=node.reason,
                state=node.display_state,
                user=node.reason_user,
                reason_time=node.reason_time,
                jobs=sorted(set(job_ids)),
                seen_at=now,
            )
        )
    return out


DrainRecorder = Callable[[list[ExternalDrain]], Awaitable[None]]


class ExternalDrains:
    """The watcher's part: looks at a poll's listing now and then, and records what is new in
    the background (a slow database never holds up a poll)."""

    def __init__(
        self,
        cluster: str,
        record: DrainRecorder | None,
        *,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self._cluster = cluster
        self._record = record
        self._interval_s = interval_s
        self._next = 0.0
        self._known: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def observe(
        self, jobs: Sequence[Job], nodes: Mapping[str, Node], now: datetime, clock: float
    ) -> None:
        """Look at one poll's listing (at most every ``interval_s``); record new drains."""
        if self._record is None or not nodes or clock < self._next:
            return
        if self._task is not None and not self._task.done():
            return
        self._next = clock + self._interval_s
        new = [
            d for d in external_drains(self._cluster, jobs, nodes, now) if d.key not in self._known
        ]
        if new:
            self._task = asyncio.create_task(self._write(new))

    async def _write(self, drains: list[ExternalDrain]) -> None:
        assert self._record is not None
        try:
            await self._record(drains)
        except Exception as exc:  # the database is down: the next look tries again
            if not self._failing:
                logger.warning("recording external drains failed: %s", exc)
            self._failing = True
            return
        self._failing = False
        if len(self._known) + len(drains) > MAX_KNOWN:
            self._known.clear()
        self._known.update(d.key for d in drains)
        for d in drains:
            logger.info("external drain of %s: %s", d.node, d.reason, extra={"node": d.node})

    async def wait(self, timeout: float) -> None:
        """Let a recording in flight finish (the watcher stops)."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout)


class AuditDrainRecorder:
    """Records external drains in the audit trail. The watcher needs no database otherwise, so
    the store is opened on first use (tried again at the next drain if that fails)."""

    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._store: AuditStore | None = None

    async def __call__(self, drains: list[ExternalDrain]) -> None:
        if self._store is None:
            self._store = await AuditStore.open(self._database_url, max_size=1, timeout=5)
        store = self._store
        for cluster in sorted({d.cluster for d in drains}):
            await store.ensure_incident(intake_incident(cluster), cluster, "intake", 0)
        for drain in drains:
            await store.record(drain.record(), dedupe_key=drain.key)

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None
