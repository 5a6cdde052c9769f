"""`relaunch db migrate` / `relaunch setup db`: the audit schema's migrations, run once by a
person as the role that owns the database (the services only check the version, see
``AuditStore.open``), and the grants of the role the services run under: read and append,
never change the schema, never delete."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from relaunch.connectors.audit import SCHEMA_VERSION, migrate, schema_version
from relaunch.models.errors import RelaunchError

CONNECT_TIMEOUT_S = 10


class DatabaseSetupError(RelaunchError):
    """The migrations or the grants cannot be done; a person must act."""


@dataclass(frozen=True)
class Migrated:
    """What `relaunch db migrate` found and did."""

    before: int
    after: int
    user: str
    database: str

    def line(self) -> str:
        if self.before == self.after:
            return (
                f"database {self.database}: schema already at version {self.after} "
                f"(this Relaunch needs {SCHEMA_VERSION}); nothing to do"
            )
        return (
            f"database {self.database}: schema migrated from version {self.before} to "
            f"{self.after} as role {self.user}"
        )


async def connect_database(database_url: str) -> AsyncConnection[Any]:
    try:
        return await AsyncConnection.connect(
            database_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
        )
    except psycopg.OperationalError as exc:
        raise DatabaseSetupError(
            "cannot reach the audit database",
            hint="is PostgreSQL running, and is the DSN right (host, user, password)?",
        ) from exc


async def migrate_database(database_url: str) -> Migrated:
    """Apply the pending migrations (serialised by an advisory lock); report before/after."""
    conn = await connect_database(database_url)
    try:
        cur = await conn.execute("select current_user, current_database()")
        row = await cur.fetchone()
        user, database = (str(row[0]), str(row[1])) if row else ("?", "?")
        try:
            before = await schema_version(conn)
            after = before if before >= SCHEMA_VERSION else await migrate(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise DatabaseSetupError(
                f"role {user} may not change the schema of {database}: "
                f"{exc.diag.message_primary or exc}",
                hint="run the migrations as the role that owns the database (the services' "
                "role only reads and appends)",
            ) from exc
        return Migrated(before=before, after=after, user=user, database=database)
    finally:
        await conn.close()


async def read_version(database_url: str) -> int:
    """The schema's version (`relaunch db status`); a role without the grants is told so."""
    conn = await connect_database(database_url)
    try:
        return await schema_version(conn)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise DatabaseSetupError(
            f"this role may not read the schema's version: {exc.diag.message_primary or exc}",
            hint="grant it the services' rights: `relaunch setup db --print-grants ROLE`",
        ) from exc
    finally:
        await conn.close()


def migrate_now(database_url: str) -> Migrated:
    """``migrate_database`` from synchronous code (the dev stack, tests), whether or not an
    event loop runs in this thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, migrate_database(database_url)).result()


# A role the grants name: an unquoted PostgreSQL identifier (it is quoted in the SQL anyway).
ROLE_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


# The purge role (`relaunch audit purge|maintain`): reads, deletes the trail's rows (the
# append-only trigger lets it through only when it says so for its transaction), records its
# purges, and runs the owner's partition functions; never updates, truncates or alters.
PURGE_DELETES = ("audit_events", "audit_dedupe", "incidents")
PURGE_FUNCTIONS = (
    "audit_ensure_partitions(integer)",
    "audit_drop_partition(text, timestamptz, text)",
)


async def grant_statements(database_url: str, role: str, *, purge: bool = False) -> list[str]:
    """The GRANTs that let ``role`` run the services on this (migrated) database: CONNECT,
    USAGE on the schema, SELECT and INSERT on each table, SELECT on each view, USAGE on each
    sequence; only SELECT on ``schema_migrations``; and the same on what the tables' owner
    creates later (default privileges), so that an upgrade's new table needs no new grant. No
    UPDATE, DELETE, TRUNCATE or ownership: the role cannot alter the schema nor drop the
    append-only trigger. With ``purge``: the grants of the purge role instead (see
    PURGE_DELETES)."""
    conn = await connect_database(database_url)
    try:
        version = await schema_version(conn)
        if version < SCHEMA_VERSION:
            raise DatabaseSetupError(
                f"the schema is at version {version}, not {SCHEMA_VERSION}: the grants name "
                "its tables",
                hint="run `relaunch db migrate` first",
            )
        cur = await conn.execute(
            "select c.relname, c.relkind from pg_class c"
            " join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = current_schema() and c.relkind in ('r', 'p', 'v', 'S')"
            " and not c.relispartition"  # a partition is reached through its table
            " order by c.relkind, c.relname"
        )
        relations = [(str(name), str(kind)) for name, kind in await cur.fetchall()]
        cur = await conn.execute(
            "select current_database(), current_schema(), (select tableowner from pg_tables"
            " where tablename = 'audit_events' and schemaname = current_schema())"
        )
        row = await cur.fetchone()
        database, schema = (str(row[0]), str(row[1])) if row else ("", "public")
        owner = str(row[2]) if row and row[2] else None
        who = sql.Identifier(role)
        statements = [
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {};").format(sql.Identifier(database), who),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {};").format(sql.Identifier(schema), who),
        ]
        if purge:
            statements += _purge_grants(schema, relations, who)
            return [s.as_string(conn) for s in statements]
        for name, kind in relations:
            rel = sql.Identifier(schema, name)
            if kind == "S":
                stmt = sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {};")
            elif kind == "v" or name in ("schema_migrations", "audit_purges"):
                stmt = sql.SQL("GRANT SELECT ON {} TO {};")
            else:
                stmt = sql.SQL("GRANT SELECT, INSERT ON {} TO {};")
            statements.append(stmt.format(rel, who))
        if owner:  # what later migrations (run by the owner) create, granted the same way
            ahead = sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT {} TO {};")
            for what in ("SELECT, INSERT ON TABLES", "USAGE, SELECT ON SEQUENCES"):
                statements.append(
                    ahead.format(sql.Identifier(owner), sql.Identifier(schema), sql.SQL(what), who)
                )
        return [s.as_string(conn) for s in statements]
    finally:
        await conn.close()


def _purge_grants(schema: str, relations: list[tuple[str, str]], who: sql.Identifier) -> list[Any]:
    statements: list[Any] = []
    for name, kind in relations:
        rel = sql.Identifier(schema, name)
        if kind == "S":
            if name == "audit_purges_id_seq":
                statements.append(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {};").format(rel, who))
        elif name in PURGE_DELETES:
            statements.append(sql.SQL("GRANT SELECT, DELETE ON {} TO {};").format(rel, who))
        elif name == "audit_purges":
            statements.append(sql.SQL("GRANT SELECT, INSERT ON {} TO {};").format(rel, who))
        else:
            statements.append(sql.SQL("GRANT SELECT ON {} TO {};").format(rel, who))
    for function in PURGE_FUNCTIONS:
        name, args = function.split("(", 1)
        statements.append(
            sql.SQL("GRANT EXECUTE ON FUNCTION {}(" + args + " TO {};").format(
                sql.Identifier(schema, name), who
            )
        )
    return statements
