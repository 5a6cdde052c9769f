"""One acting watcher per cluster: a lease on a PostgreSQL session advisory lock.

`relaunch watch` takes the cluster's lease (relaunch/connectors/lease.py) before it polls or
hands anything over. Several watchers of one cluster may run; one leads, the others wait:

- **Standby**: the lock is held by another session. Said once (naming the holder as its
  session names itself: ``relaunch-watch <cluster> on <host> pid <pid>``), then tried again
  every ``retry_s``; nothing is polled, read or handed over.
- **Leader**: the lock is ours. The watcher runs as a freshly started one would (its start-up
  reconciliation: the first poll sees every listed job, ended ones included; the catch-up from
  accounting reads what ended while nobody acted). The lease is confirmed every ``check_s``
  (this session alive and still holding the lock, answered within ``timeout_s``), and before
  each act: an act waits for a confirmation that began after it asked (one round trip, shared
  by the acts that ask together) and sent less than ``valid_s`` ago.
- **Lost**: a confirmation that fails or does not come in time ends the term at once: every
  act from then on is refused (:class:`LeaseLostError`), the watcher stops without handing over
  what it still held, and the process goes back to standby (a fresh connection; its first try
  two ``retry_s`` later, so that a standby already waiting takes over first).

A leader that dies frees the lock with its connection (PostgreSQL does, at once, on SIGKILL);
the standby takes it at its next try. A leader cut off from the database stops acting after
``valid_s`` without a confirmation, before the server drops its silent session
(connectors/lease.py: ``SERVER_SILENCE_S``) and lets another take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import ParamSpec, TypeVar

import psycopg
from pydantic import BaseModel

from relaunch.connectors.lease import (
    AdvisoryLease,
    LeaseLostError,
    advisory_key,
    application_name,
)

logger = logging.getLogger("relaunch.watch")

PURPOSE = "relaunch-watch"
RETRY_S = 1.0  # a standby tries the lock this often
CHECK_S = 1.0  # the leader confirms its lease this often
TIMEOUT_S = 2.0  # a confirmation (or a try) that takes longer has failed
VALID_S = 3.0  # an act needs a confirmation younger than this

P = ParamSpec("P")
R = TypeVar("R")


def watch_lease_key(cluster: str) -> int:
    """The advisory-lock key of ``cluster``'s watcher lease (signed 64-bit; distinct from the
    notifier's ``relaunch-notify`` and the drain guard's ``relaunch-drain`` keys)."""
    return advisory_key(PURPOSE, cluster)


class LeaseRole(StrEnum):
    STANDBY = "standby"
    LEADER = "leader"


class LeaseStatus(BaseModel):
    """What the watcher says of its lease (for its status and health)."""

    cluster: str
    role: LeaseRole
    since: datetime  # when it took this role
    holder: str | None = None  # a standby: who holds the lease, as far as it knows
    terms: int = 0  # how often this process has led
    last_lost: str | None = None  # why its last term ended, if one did
    last_seen_at: datetime | None = None  # its last confirmation (leader) or try (standby)


@dataclass
class LeaseState:
    """The pure part: the role, what was said, and whether an act may go ahead now (clock
    values are ``time.monotonic()`` seconds)."""

    cluster: str
    valid_s: float = VALID_S
    role: LeaseRole = LeaseRole.STANDBY
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    confirmed_at: float = float("-inf")
    holder: str | None = None
    terms: int = 0
    last_lost: str | None = None
    last_seen_at: datetime | None = None
    _said_standby: bool = False
    _said_unreachable: bool = False

    def acquired(self, clock: float, wall: datetime) -> None:
        self.role, self.since = LeaseRole.LEADER, wall
        self.confirmed_at, self.last_seen_at = clock, wall
        self.holder, self.terms = None, self.terms + 1
        self._said_standby = self._said_unreachable = False

    def confirmed(self, clock: float, wall: datetime) -> None:
        if self.role is LeaseRole.LEADER:
            self.confirmed_at, self.last_seen_at = clock, wall

    def lost(self, why: str, wall: datetime) -> bool:
        """The term ended; True when it was a term (say it), False when already standby."""
        if self.role is not LeaseRole.LEADER:
            return False
        self.role, self.since, self.last_lost = LeaseRole.STANDBY, wall, why
        self.confirmed_at = float("-inf")
        return True

    def refused(self, holder: str | None, wall: datetime) -> bool:
        """Another session holds the lock; True when that is to be said (once per standby
        period, and again when the holder changes)."""
        self.last_seen_at = wall
        say = not self._said_standby or (holder is not None and holder != self.holder)
        self.holder = holder if holder is not None else self.holder
        self._said_standby, self._said_unreachable = True, False
        return say

    def unreachable(self) -> bool:
        """The database could not be asked; True when that is to be said (once an outage)."""
        say, self._said_unreachable = not self._said_unreachable, True
        return say

    def acting(self, clock: float) -> bool:
        """Whether an act may go ahead: leader, confirmed within ``valid_s``."""
        return self.role is LeaseRole.LEADER and clock - self.confirmed_at <= self.valid_s

    def status(self) -> LeaseStatus:
        return LeaseStatus(
            cluster=self.cluster,
            role=self.role,
            since=self.since,
            holder=self.holder if self.role is LeaseRole.STANDBY else None,
            terms=self.terms,
            last_lost=self.last_lost,
            last_seen_at=self.last_seen_at,
        )


Term = Callable[[asyncio.Event], Awaitable[None]]


class WatchLease:
    """The cluster's watcher lease: :meth:`run` waits as a standby, runs ``term`` while it
    leads (its event set when the term must end), and goes back to standby when the lease is
    lost. :meth:`guard` wraps every act of the watcher."""

    def __init__(
        self,
        cluster: str,
        database_url: str,
        *,
        retry_s: float = RETRY_S,
        check_s: float = CHECK_S,
        timeout_s: float = TIMEOUT_S,
        valid_s: float = VALID_S,
    ) -> None:
        self.cluster = cluster
        self.retry_s, self.check_s, self.timeout_s = retry_s, check_s, timeout_s
        self.state = LeaseState(cluster, valid_s=valid_s)
        self._lease = AdvisoryLease(
            database_url, watch_lease_key(cluster), name=application_name(PURPOSE, cluster)
        )
        self._confirming = asyncio.Lock()
        self._term_end: asyncio.Event | None = None
        self._beat = time.monotonic()

    @property
    def role(self) -> LeaseRole:
        return self.state.role

    def status(self) -> LeaseStatus:
        return self.state.status()

    def loop_age_s(self, clock: float | None = None) -> float:
        """Seconds since the lease's loop last did its work: a try (standby, whatever its
        outcome) or a confirmation (leader). A health check's measure for a standby, which
        does not poll: it stays under a few seconds while the loop runs."""
        return (time.monotonic() if clock is None else clock) - self._beat

    # ------------------------------------------------------------------ acts

    async def ensure(self) -> None:
        """Return when an act may go ahead now: this watcher leads, and a confirmation that
        began after the act asked has come back (acts that ask together share one). Raise
        :class:`LeaseLostError` otherwise (the term then ends)."""
        asked = time.monotonic()
        if self.state.role is not LeaseRole.LEADER:
            raise LeaseLostError(f"this watcher is a standby for cluster {self.cluster}")
        await self._confirm(asked)
        if not self.state.acting(time.monotonic()):
            self._lost("no confirmation of the lease in time")
            raise LeaseLostError(f"this watcher no longer leads cluster {self.cluster}")

    def guard(self, act: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        """``act``, run only while this watcher leads (:meth:`ensure` first)."""

        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            await self.ensure()
            return await act(*args, **kwargs)

        return guarded

    async def _confirm(self, asked: float) -> None:
        """A confirmation sent at or after ``asked`` (monotonic), this one or one just made."""
        async with self._confirming:
            if self.state.confirmed_at >= asked:
                return  # sent after the caller asked: it answers for it too
            if self.state.role is not LeaseRole.LEADER:
                raise LeaseLostError(f"this watcher is a standby for cluster {self.cluster}")
            sent = time.monotonic()
            try:
                await self._lease.confirm(self.timeout_s)
            except LeaseLostError as exc:
                self._lost(str(exc))
                raise
            self._beat = time.monotonic()
            self.state.confirmed(sent, datetime.now(UTC))

    def _lost(self, why: str) -> None:
        if self.state.lost(why, datetime.now(UTC)):
            logger.error(
                "lost the lease of cluster %s (%s): stopped acting, standby now",
                self.cluster,
                why,
                extra={"cluster": self.cluster, "role": LeaseRole.STANDBY.value, "why": why},
            )
        if self._term_end is not None:
            self._term_end.set()

    # ------------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event, term: Term) -> None:
        """Until ``stop``: standby until the lease is ours, lead (``term``) until it is lost or
        ``stop`` is set, and again. A term that raises ends the run (the lease let go)."""
        try:
            while not stop.is_set():
                if not await self._acquire(stop):
                    return
                await self._lead(stop, term)
                if self.state.role is LeaseRole.STANDBY:
                    # Lost: the standbys (trying every retry_s) may take it first.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=2 * self.retry_s)
        finally:
            await self._lease.release()

    async def _acquire(self, stop: asyncio.Event) -> bool:
        """Standby until the lock is taken (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            self._beat = time.monotonic()
            try:
                took = await self._lease.try_acquire(self.timeout_s)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if self.state.unreachable():
                    logger.warning(
                        "standby for cluster %s: the database does not answer (%s); trying again"
                        " every %.0fs",
                        self.cluster,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc),
                        self.retry_s,
                        extra={"cluster": self.cluster, "role": LeaseRole.STANDBY.value},
                    )
            else:
                if took:
                    self.state.acquired(time.monotonic(), datetime.now(UTC))
                    logger.info(
                        "leader for cluster %s: this watcher holds the cluster's lease and acts",
                        self.cluster,
                        extra={"cluster": self.cluster, "role": LeaseRole.LEADER.value},
                    )
                    return True
                holder = await self._lease.holder(self.timeout_s)
                if self.state.refused(holder, datetime.now(UTC)):
                    logger.info(
                        "standby for cluster %s: another watcher holds the cluster (%s); "
                        "taking over when it stops, trying every %.0fs",
                        self.cluster,
                        holder or "its session is not visible to this role",
                        self.retry_s,
                        extra={
                            "cluster": self.cluster,
                            "role": LeaseRole.STANDBY.value,
                            "holder": holder,
                        },
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.retry_s)
        return False

    async def _lead(self, stop: asyncio.Event, term: Term) -> None:
        """One term: ``term`` runs until ``stop`` or a lost lease ends it."""
        end = self._term_end = asyncio.Event()
        checking = asyncio.create_task(self._keep(stop, end))
        try:
            await term(end)
        finally:
            end.set()
            # Not cancelled: a confirmation under way ends within timeout_s, and one cut off
            # would leave the connection mid-statement.
            await checking
            self._term_end = None
            if self.state.role is LeaseRole.STANDBY:
                await self._lease.close()  # a fresh connection for the next try

    async def _keep(self, stop: asyncio.Event, end: asyncio.Event) -> None:
        """Confirm the lease every ``check_s``; end the term on ``stop`` or on a failure."""
        waits = {asyncio.create_task(stop.wait()), asyncio.create_task(end.wait())}
        try:
            while not end.is_set():
                await asyncio.wait(waits, timeout=self.check_s, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    end.set()  # a clean stop: the term hands over what it holds, then lets go
                    return
                if end.is_set():
                    return
                with contextlib.suppress(LeaseLostError):
                    await self._confirm(time.monotonic())
        finally:
            for task in waits:
                task.cancel()
