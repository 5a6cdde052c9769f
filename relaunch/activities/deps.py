"""What activities need, built once per worker process and injected."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import wraps
from typing import ParamSpec, TypeVar

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.liveness import Prober, SharedProber
from relaunch.connectors.logstores import LogStore
from relaunch.connectors.pause import unless_paused
from relaunch.connectors.slurm.base import Scheduler
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.pause import ClusterPausedError
from relaunch.models.recovery import AuditRecord, GuardDecision, Policy
from relaunch.rollout.policy import PolicyCache

log = logging.getLogger("relaunch.activities")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Deps:
    config: ClusterConfig
    scheduler: Scheduler
    audit: AuditStore
    log_store: LogStore | None = None  # None: job and kernel logs are read from files
    # The worker's Temporal client: a job recovery joins its culprits' node decisions with it
    # (signal-with-start; a workflow cannot signal-with-start another).
    temporal: Client | None = None
    _prober: Prober | None = field(default=None, init=False, repr=False)
    _policies: PolicyCache | None = field(default=None, init=False, repr=False)

    async def policy(self, base: Policy) -> Policy:
        """The policy to plan by: ``base`` (the recovery's, from the configuration) with the
        cluster's audited mode changes over it (promotions, demotions: `relaunch rollout`)."""
        if self._policies is None:
            self._policies = PolicyCache(self.audit, self.config.name)
        return await self._policies.apply(base)

    def prober(self) -> Prober:
        """The node liveness prober (made on first use: a raw socket, or the SSH host's). One
        the configuration asks for but this process cannot have (``syn`` without CAP_NET_RAW)
        is said once and replaced by a connect prober: the evidence step's single probe per
        recovery is worth a line in slurmd's log."""
        if self._prober is None:
            try:
                inner = self.scheduler.prober(self.config.watch.probe_method)
            except (RelaunchError, ValueError) as exc:
                log.warning("evidence probes use TCP connects: %s", exc)
                inner = self.scheduler.prober("connect")
            # The recoveries of one rack failure probe the same nodes at once: one probe each.
            self._prober = SharedProber(inner)
        return self._prober

    async def unless_paused(self, incident_id: str, step: str) -> None:
        """The kill switch's gate, called first by every activity that changes the cluster:
        while the cluster is paused (`relaunch pause`), say once per pause in the incident's
        trail that ``step`` waits, and raise ClusterPausedError (retried, then waited out by
        the workflow). Read fresh each time: an unpause takes effect at the next attempt."""
        try:
            await unless_paused(self.audit, self.config.name)
        except ClusterPausedError as exc:
            at = exc.state.at.isoformat() if exc.state.at else ""
            await self.audit_row(
                incident_id,
                "paused",
                f"{step} waits: {exc.state.describe()}"[:500],
                dedupe=f"paused:{step}:{at}",
                data={"step": step, "by": exc.state.by, "reason": exc.state.reason},
            )
            raise

    async def close(self) -> None:
        if self._prober is not None:
            await self._prober.close()
            self._prober = None

    async def audit_row(
        self,
        incident_id: str,
        kind: str,
        summary: str,
        *,
        dedupe: str | None,
        nodes: list[str] | None = None,
        stage: str | None = None,
        actor: str = "relaunch",
        data: dict[str, object] | None = None,
    ) -> bool:
        return await self.audit.record(
            AuditRecord(
                incident_id=incident_id,
                kind=kind,
                at=datetime.now(UTC),
                actor=actor,
                stage=stage,
                nodes=nodes or [],
                summary=summary,
                data=data or {},
            ),
            dedupe_key=f"{incident_id}:{dedupe}" if dedupe else None,
        )

    async def audit_guards(self, incident_id: str, guards: Sequence[GuardDecision]) -> None:
        """One audit row per guard a plan was checked against (a job's plan or a node's)."""
        for guard in guards:
            await self.audit_row(
                incident_id,
                "guard",
                f"{guard.guard}: {'allowed' if guard.allowed else 'REFUSED'} — {guard.detail}",
                dedupe=f"guard:{guard.guard}",
                data=guard.model_dump(mode="json"),
            )


def typed_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Map Relaunch's typed errors to Temporal ApplicationErrors at the activity boundary:
    the class name becomes the error type, and only retryable errors are retried."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except RelaunchError as exc:
            raise ApplicationError(
                str(exc), type=type(exc).__name__, non_retryable=not exc.retryable
            ) from exc

    return wrapper


# What a long action last said it was doing; the heartbeater repeats it.
_doing: ContextVar[list[str] | None] = ContextVar("relaunch_activity_doing", default=None)
HEARTBEAT_EVERY_S = 3.0


def beat(doing: str) -> None:
    """Heartbeat now with what the activity is doing (and remember it for the heartbeater)."""
    said = _doing.get()
    if said is not None:
        said[0] = doing
    activity.heartbeat(doing)


def keeps_heartbeating(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Heartbeat every few seconds for as long as the activity runs, not only between steps.

    A step can wait longer than the heartbeat timeout on a loaded cluster (a requeue waiting
    out COMPLETING, a read queued behind hundreds of others in a burst); without heartbeats
    then, Temporal times the attempt out and starts another while the first is still acting.
    The heartbeater lives in the worker process, so a worker that dies still stops beating and
    the action is retried elsewhere within the heartbeat timeout."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        said = [""]  # shared with beat() in this activity, and with the heartbeater's task
        token = _doing.set(said)

        async def keep_beating() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_EVERY_S)
                try:
                    activity.heartbeat(said[0])
                except Exception:  # never let the heartbeater fail the action itself
                    log.warning("heartbeat failed", exc_info=True)

        beater = asyncio.create_task(keep_beating())
        try:
            return await fn(*args, **kwargs)
        finally:
            _doing.reset(token)
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater

    return wrapper
