"""A lease held as a PostgreSQL session advisory lock, on a connection of its own.

PostgreSQL keeps a session advisory lock exactly as long as the session that took it: a process
that dies (SIGKILL included) closes its connection, and the server frees the lock at once; a
host that vanishes without closing is found dead by the session's TCP keepalives (set here:
about ``SERVER_SILENCE_S``), and its lock freed then. The holder confirms its lease by asking
the server whether *its own backend* still holds the lock (which also catches a pooler that
runs statements on another backend), with a timeout: an answer that does not come is a lost
lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket

import psycopg

from relaunch.models.errors import RelaunchError

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
# The server side of the lease connection: a holder silent this long (no packet, keepalive
# unanswered) is dropped by the server, and its lock freed. Longer than the holder's own limit
# (it stops acting once it has had no confirmation for its ``valid_s``), so that a holder cut
# off from the database has stopped before another may take over.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 2
KEEPALIVE_COUNT = 3
SERVER_SILENCE_S = 10
_SESSION_SETTINGS = (
    ("tcp_keepalives_idle", str(KEEPALIVE_IDLE_S)),
    ("tcp_keepalives_interval", str(KEEPALIVE_INTERVAL_S)),
    ("tcp_keepalives_count", str(KEEPALIVE_COUNT)),
    ("tcp_user_timeout", str(SERVER_SILENCE_S * 1000)),
)
_HOLDS = (
    "select exists (select 1 from pg_locks where locktype = 'advisory' and granted"
    " and pid = pg_backend_pid() and classid = %s and objid = %s and objsubid = 1)"
)
_HOLDER = (
    "select a.application_name, host(a.client_addr), a.backend_start"
    " from pg_locks l left join pg_stat_activity a on a.pid = l.pid"
    " where l.locktype = 'advisory' and l.granted and l.classid = %s and l.objid = %s"
    " and l.objsubid = 1 limit 1"
)


class LeaseLostError(RelaunchError):
    """This process does not hold the lease (any more): it must not act."""

    retryable = True


def advisory_key(purpose: str, name: str) -> int:
    """The signed 64-bit advisory-lock key of ``purpose`` (e.g. ``relaunch-watch``) for
    ``name`` (a cluster), as the notifier's and the drain guard's keys are derived."""
    digest = hashlib.sha256(f"{purpose}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_parts(key: int) -> tuple[int, int]:
    """How ``pg_locks`` shows a 64-bit advisory key: (classid, objid), its high and low 32
    bits as unsigned numbers (objsubid is 1 for a one-key lock)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def application_name(purpose: str, cluster: str) -> str:
    """What the lease's session calls itself (PostgreSQL keeps 63 bytes): a standby names the
    holder by it."""
    name = f"{purpose} {cluster} on {socket.gethostname()} pid {os.getpid()}"
    return name.encode()[:63].decode(errors="ignore")


class AdvisoryLease:
    """One session advisory lock on a connection of its own: :meth:`try_acquire` (connecting
    when needed), :meth:`confirm`, :meth:`holder`, :meth:`release`."""

    def __init__(self, database_url: str, key: int, *, name: str) -> None:
        self._database_url = database_url
        self.key = key
        self.name = name
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self.held = False

    async def _connection(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._database_url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name=self.name,
            )
            for setting, value in _SESSION_SETTINGS:
                # Settable by any role; a server that lacks one (tcp_user_timeout before 12)
                # keeps its default.
                with contextlib.suppress(psycopg.Error):
                    await self._conn.execute("select set_config(%s, %s, false)", (setting, value))
        return self._conn

    async def try_acquire(self, timeout_s: float) -> bool:
        """Take the lock if no other session holds it. Raises psycopg's errors (or
        TimeoutError) when the database cannot be asked; the connection is dropped then."""
        try:
            async with asyncio.timeout(timeout_s):
                conn = await self._connection()
                cur = await conn.execute("select pg_try_advisory_lock(%s)", (self.key,))
                row = await cur.fetchone()
        except BaseException:
            await self.close()
            raise
        self.held = bool(row and row[0])
        return self.held

    async def confirm(self, timeout_s: float) -> None:
        """Check, within ``timeout_s``, that this session is alive and still holds the lock;
        raises :class:`LeaseLostError` (the connection dropped) otherwise."""
        if not self.held or self._conn is None or self._conn.closed:
            self.held = False
            raise LeaseLostError("the lease's connection is closed")
        try:
            async with asyncio.timeout(timeout_s):
                cur = await self._conn.execute(_HOLDS, lock_parts(self.key))
                row = await cur.fetchone()
        except TimeoutError:
            await self.close()
            raise LeaseLostError(
                f"the database did not confirm the lease within {timeout_s:.0f}s"
            ) from None
        except psycopg.Error as exc:
            await self.close()
            raise LeaseLostError(f"the lease's connection failed: {_one_line(exc)}") from exc
        if not (row and row[0]):
            await self.close()
            raise LeaseLostError("the lease's session no longer holds the lock")

    async def holder(self, timeout_s: float) -> str | None:
        """Who holds the lock now, as its session names itself (None: unknown, or nobody)."""
        try:
            async with asyncio.timeout(timeout_s):
                conn = await self._connection()
                cur = await conn.execute(_HOLDER, lock_parts(self.key))
                row = await cur.fetchone()
        except (TimeoutError, psycopg.Error):
            await self.close()  # perhaps cut off mid-statement: the next try reconnects
            return None
        if row is None:
            return None
        app, addr, since = row
        who = str(app) if app else "a session"
        if addr:
            who += f" from {addr}"
        if since is not None:
            who += f", connected since {since:%Y-%m-%d %H:%M:%S %Z}".rstrip()
        return who

    async def release(self) -> None:
        """Let the lock go (a clean stop: the standby takes over at its next try)."""
        if self.held and self._conn is not None and not self._conn.closed:
            with contextlib.suppress(psycopg.Error, TimeoutError):
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await self._conn.execute("select pg_advisory_unlock(%s)", (self.key,))
        await self.close()

    async def close(self) -> None:
        """Close the connection (the server frees a lock it held)."""
        self.held = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await conn.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
