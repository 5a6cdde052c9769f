"""The watcher's lease (relaunch/workers/watch_lease.py): the key, the state machine, and two
leases of one cluster on a real (embedded) PostgreSQL: one leads, the other waits and names the
holder, takes over when the holder's connection closes, and a holder whose session is
terminated stops acting at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from relaunch.connectors.audit import drain_lock_key
from relaunch.connectors.lease import LeaseLostError, application_name, lock_parts
from relaunch.connectors.notify.notifier import lock_id
from relaunch.workers.watch_lease import LeaseRole, LeaseState, WatchLease, watch_lease_key
from tests.support.postgres import embedded_postgres

NOW = datetime(2026, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------------- pure parts


def test_key_is_a_stable_signed_64_bit_number_per_cluster() -> None:
    key = watch_lease_key("prod")
    assert key == watch_lease_key("prod")
    assert -(2**63) <= key < 2**63
    assert watch_lease_key("prod") != watch_lease_key("staging")
    # Not the notifier's lock, nor the drain guard's, of the same cluster.
    assert key not in {lock_id("prod"), drain_lock_key("prod")}


@pytest.mark.parametrize("key", [0, 1, -1, 2**63 - 1, -(2**63), 0x1234_5678_9ABC_DEF0])
def test_lock_parts_are_how_pg_locks_shows_the_key(key: int) -> None:
    high, low = lock_parts(key)
    assert 0 <= high < 2**32 and 0 <= low < 2**32
    assert int.from_bytes(((high << 32) | low).to_bytes(8, "big"), "big", signed=True) == key


def test_application_name_fits_postgres_and_names_the_cluster() -> None:
    name = application_name("relaunch-watch", "c" * 100)
    assert len(name.encode()) <= 63 and name.startswith("relaunch-watch ccc")


def test_standby_says_so_once_and_again_when_the_holder_changes() -> None:
    state = LeaseState("prod")
    assert state.role is LeaseRole.STANDBY and not state.acting(0.0)
    assert state.refused("relaunch-watch prod on a pid 1", NOW)
    assert not state.refused("relaunch-watch prod on a pid 1", NOW)
    assert not state.refused(None, NOW)  # the holder could not be read: nothing new
    assert state.refused("relaunch-watch prod on b pid 2", NOW)
    assert state.status().holder == "relaunch-watch prod on b pid 2"
    assert state.unreachable() and not state.unreachable()  # once an outage


def test_leader_acts_only_while_its_confirmation_is_young() -> None:
    state = LeaseState("prod", valid_s=3.0)
    state.acquired(100.0, NOW)
    assert state.role is LeaseRole.LEADER and state.terms == 1
    assert state.acting(102.9) and not state.acting(103.1)
    state.confirmed(103.0, NOW)
    assert state.acting(105.9)
    status = state.status()
    assert status.role is LeaseRole.LEADER and status.holder is None


def test_a_lost_lease_is_standby_at_once_and_said_once() -> None:
    state = LeaseState("prod")
    state.refused("other", NOW)
    state.acquired(0.0, NOW)
    assert state.lost("the connection failed", NOW)
    assert not state.lost("again", NOW)  # one term, one loss
    assert state.role is LeaseRole.STANDBY and not state.acting(0.0)
    assert state.status().last_lost == "the connection failed"
    assert state.refused("other", NOW)  # a new standby period is said again
    state.confirmed(1.0, NOW)  # a late confirmation does not make a standby act
    assert not state.acting(1.0)


# ---------------------------------------------------------------------- real PostgreSQL


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with embedded_postgres("relaunch-watch-lease-") as url:
        yield url


class Terms:
    """A stand-in for the watcher's term: records when it ran and acts every 0.1 s through
    the lease's guard, as the watcher's handlers do."""

    def __init__(self, lease: WatchLease) -> None:
        self.lease = lease
        self.started = asyncio.Event()
        self.ended = asyncio.Event()
        self.acts: list[float] = []
        self.refused = 0

    async def __call__(self, end: asyncio.Event) -> None:
        self.started.set()
        act = self.lease.guard(self._act)
        while not end.is_set():
            try:
                await act()
            except LeaseLostError:
                self.refused += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(end.wait(), 0.1)
        self.ended.set()

    async def _act(self) -> None:
        self.acts.append(time.monotonic())


async def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.05)


def _lease(url: str, cluster: str) -> WatchLease:
    return WatchLease(cluster, url, retry_s=0.2, check_s=0.2, timeout_s=2.0)


async def test_one_leads_the_other_waits_then_takes_over(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relaunch.watch")
    a, b = _lease(database_url, "one"), _lease(database_url, "one")
    other = _lease(database_url, "two")  # another cluster's lease is its own
    ta, tb, tother = Terms(a), Terms(b), Terms(other)
    stop_a, stop_b, stop_other = asyncio.Event(), asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a, ta))
    await asyncio.wait_for(ta.started.wait(), 10)
    run_b = asyncio.create_task(b.run(stop_b, tb))
    run_other = asyncio.create_task(other.run(stop_other, tother))
    await asyncio.wait_for(tother.started.wait(), 10)
    await _until(lambda: b.status().holder is not None)
    await asyncio.sleep(1.0)  # b keeps trying: never leads meanwhile
    assert b.loop_age_s() < 1.0 and a.loop_age_s() < 1.0  # each loop alive, standby included
    assert a.role is LeaseRole.LEADER and b.role is LeaseRole.STANDBY
    assert not tb.started.is_set()
    holder = b.status().holder or ""
    assert holder.startswith("relaunch-watch one on "), holder
    standby_lines = [r for r in caplog.records if "standby for cluster one" in r.getMessage()]
    assert len(standby_lines) == 1, [r.getMessage() for r in standby_lines]
    assert "another watcher holds the cluster" in standby_lines[0].getMessage()

    # a stops cleanly (it lets go): b takes over within its retry.
    stop_a.set()
    await asyncio.wait_for(run_a, 10)
    began = time.monotonic()
    await asyncio.wait_for(tb.started.wait(), 10)
    assert time.monotonic() - began < 2.0
    assert b.status().role is LeaseRole.LEADER and b.status().terms == 1
    stop_b.set()
    stop_other.set()
    await asyncio.gather(run_b, run_other)
    assert ta.acts and tb.acts and not ta.refused


async def test_a_terminated_session_stops_the_leader_at_once_and_the_standby_leads(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relaunch.watch")
    a, b = _lease(database_url, "three"), _lease(database_url, "three")
    ta, tb = Terms(a), Terms(b)
    stop = asyncio.Event()
    run_a = asyncio.create_task(a.run(stop, ta))
    await asyncio.wait_for(ta.started.wait(), 10)
    run_b = asyncio.create_task(b.run(stop, tb))
    await _until(lambda: b.status().holder is not None)
    # The database drops the leader's session (a restart, a failover, an administrator).
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "select pg_terminate_backend(pid) from pg_locks where locktype = 'advisory'"
            " and classid = %s and objid = %s",
            lock_parts(watch_lease_key("three")),
        )
    killed = time.monotonic()
    await asyncio.wait_for(ta.ended.wait(), 5)
    # The leader stopped acting as soon as it noticed: within its check interval.
    assert time.monotonic() - killed < 1.5
    assert not [t for t in ta.acts if t > killed + 0.1]
    await asyncio.wait_for(tb.started.wait(), 5)
    await _until(lambda: a.role is LeaseRole.STANDBY and a.status().holder is not None)
    assert a.status().last_lost and b.role is LeaseRole.LEADER
    lost = [r for r in caplog.records if "lost the lease of cluster three" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.ERROR
    # Never two acting: no act of a's after b's first.
    assert not [t for t in ta.acts if t >= min(tb.acts, default=float("inf"))]
    stop.set()
    await asyncio.gather(run_a, run_b)


async def test_a_standby_never_acts(database_url: str) -> None:
    lease = _lease(database_url, "four")
    with pytest.raises(LeaseLostError, match="standby"):
        await lease.ensure()


async def test_an_unreachable_database_is_a_standby_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="relaunch.watch")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nothing listens there once closed
    lease = _lease(f"postgresql://relaunch@127.0.0.1:{port}/relaunch", "five")
    terms = Terms(lease)
    stop = asyncio.Event()
    running = asyncio.create_task(lease.run(stop, terms))
    await asyncio.sleep(1.5)  # several tries
    stop.set()
    await asyncio.wait_for(running, 10)
    assert not terms.started.is_set() and lease.role is LeaseRole.STANDBY
    said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("standby for cluster five"), said


async def test_an_act_after_the_session_ended_is_refused_before_any_periodic_check(
    database_url: str,
) -> None:
    # Checks every 60 s: only the act's own confirmation can notice.
    lease = WatchLease("six", database_url, retry_s=0.2, check_s=60.0, timeout_s=2.0)
    started, acts = asyncio.Event(), list[str]()
    allowed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def term(end: asyncio.Event) -> None:
        started.set()
        act = lease.guard(_record(acts))
        await act()
        await allowed
        try:
            await act()
        except LeaseLostError:
            acts.append("refused")
        await end.wait()

    stop = asyncio.Event()
    running = asyncio.create_task(lease.run(stop, term))
    await asyncio.wait_for(started.wait(), 10)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "select pg_terminate_backend(pid) from pg_locks where locktype = 'advisory'"
            " and classid = %s and objid = %s",
            lock_parts(watch_lease_key("six")),
        )
    allowed.set_result(None)
    await _until(lambda: len(acts) == 2, 5)
    assert acts == ["acted", "refused"]
    assert lease.role is LeaseRole.STANDBY
    stop.set()
    await asyncio.wait_for(running, 10)


def _record(acts: list[str]) -> Callable[[], Awaitable[None]]:
    async def act() -> None:
        acts.append("acted")

    return act
