"""The audit trail in PostgreSQL: incidents and an append-only log of what happened to each.

Every detection, evidence bundle, verdict, plan, guard decision, approval, action and stage
change is one row in ``audit_events`` (monthly partitions on ``at``). Rows are never updated,
and deleted only by `relaunch audit purge` (relaunch/connectors/retention.py; a trigger refuses
everyone else). Writers pass a ``dedupe_key`` so that a retried activity records its row once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import BaseModel, Field

from relaunch.connectors.audit_schema import MIGRATIONS
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import intake_incident
from relaunch.models.lineage import MAX_DEPTH
from relaunch.models.recovery import AuditRecord

ENSURED_MAX = 100_000


# The rows that say which job Relaunch submitted as a resubmission of which (the parent is the
# row's incident's job): ``lineage`` rows, and the restart ``action`` rows of a changed
# resubmission, which name the same child (an id sbatch answered to Relaunch itself), so that a
# trail holding either row finds it. Never a comment.
LINEAGE_ROW = (
    "((e.kind = 'lineage' and e.data->>'parent' = i.job_id)"
    " or (e.kind = 'action' and e.data->>'step' = 'restart'"
    " and e.data->>'action' = 'resubmit' and coalesce((e.data->>'changed')::boolean, false)))"
)
LINEAGE_CHILD = "coalesce(e.data->>'child', e.data->>'new_job_id')"

# Rows about a node that came from outside Relaunch (AuditStore.outside_events).
OUTSIDE_KINDS = ("health_event", "external_drain")


class AuditUnavailableError(RelaunchError):
    """The audit database does not answer."""

    retryable = True


_LOCK_ID = 0x52454C41  # "RELA": serialises migrations across processes

# The schema version this code needs: the last migration's.
SCHEMA_VERSION = MIGRATIONS[-1][0]

MIGRATE_COMMAND = "relaunch db migrate --config FILE"


class SchemaBehindError(RelaunchError):
    """The audit database's schema is older than this code needs: a person runs the
    migrations (`relaunch db migrate`, as the role that owns the database), then restarts."""

    def __init__(self, current: int) -> None:
        super().__init__(
            f"the audit database's schema is at version {current}, this Relaunch needs "
            f"{SCHEMA_VERSION}; processes do not migrate it",
            hint=f"run `{MIGRATE_COMMAND}` once, as the role that owns the database",
        )
        self.current = current


def drain_lock_key(cluster: str) -> int:
    """The advisory lock of a cluster's blast-radius guard (a signed 64-bit key)."""
    digest = hashlib.sha256(f"relaunch-drain:{cluster}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class IncidentRow(BaseModel):
    """One incident with its latest stage, verdict and plan, as `relaunch incidents` and the
    console list it (each query fills what it reads; the rest stays None)."""

    id: str
    cluster: str
    job_id: str
    attempt: int
    created_at: datetime
    last_at: datetime | None = None  # its latest row
    stage: str | None = None
    stage_at: datetime | None = None
    category: str | None = None
    confidence: float | None = None
    nodes: list[str] = Field(default_factory=list)
    action: str | None = None
    mode: str | None = None
    plan_summary: str | None = None


class NodeReputation(BaseModel):
    """A node's recent incident history (`relaunch nodes`)."""

    node: str
    incidents: int
    jobs: int
    last_at: datetime
    categories: list[str] = Field(default_factory=list)
    recent: list[str] = Field(default_factory=list, description="latest incident ids")


class NodeSuspicion(BaseModel):
    """A node that jobs named by their output alone (no trusted source confirming it): by
    whose jobs, how often, when last (cross-user corroboration, docs/trust.md)."""

    node: str
    users: list[str] = Field(default_factory=list)
    incidents: int
    last_at: datetime


class StoredEvent(AuditRecord):
    id: int


async def _insert(conn: AsyncConnection[Any], record: AuditRecord, dedupe_key: str | None) -> bool:
    """Insert one audit row; False when its dedupe key is already there. The key goes into
    ``audit_dedupe`` in the same statement (the partitioned table cannot hold a unique key
    without its partition key): a row is written only when its key is new."""
    cur = await conn.execute(
        "with k as (insert into audit_dedupe (dedupe_key, incident_id, at)"
        " select %(key)s, %(incident)s, %(at)s where %(key)s::text is not null"
        " on conflict (dedupe_key) do nothing returning 1)"
        " insert into audit_events"
        " (incident_id, kind, at, actor, stage, nodes, summary, data, dedupe_key)"
        " select %(incident)s, %(kind)s, %(at)s, %(actor)s, %(stage)s, %(nodes)s, %(summary)s,"
        " %(data)s, %(key)s where %(key)s::text is null or exists (select 1 from k)",
        {
            "incident": record.incident_id,
            "kind": record.kind,
            "at": record.at,
            "actor": record.actor,
            "stage": record.stage,
            "nodes": list(record.nodes),
            "summary": record.summary,
            "data": Jsonb(json.loads(json.dumps(record.data, default=str))),
            "key": dedupe_key,
        },
    )
    return bool(cur.rowcount == 1)


async def schema_version(conn: AsyncConnection[Any]) -> int:
    """The version the database's schema is at (0: never migrated). Reads only."""
    cur = await conn.execute("select to_regclass('schema_migrations') is not null")
    row = await cur.fetchone()
    if not (row and row[0]):
        return 0
    cur = await conn.execute("select coalesce(max(version), 0) from schema_migrations")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def check_schema(conn: AsyncConnection[Any]) -> int:
    """The schema's version; SchemaBehindError when it is older than this code needs (a newer
    one is accepted: migrations only add, so the previous release runs on it)."""
    try:
        current = await schema_version(conn)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise RelaunchError(
            f"this role may not read the audit schema's version: {exc.diag.message_primary}",
            hint="grant the services' role its rights: `relaunch setup db --print-grants ROLE`",
        ) from exc
    if current < SCHEMA_VERSION:
        raise SchemaBehindError(current)
    return current


async def refuse_behind_schema(database_url: str, timeout_s: int = 5) -> None:
    """At a process's start: SchemaBehindError when the database answers with an older
    schema. A database that does not answer is left to the code that uses it (the watcher
    runs without it, the console answers 503 until it is back)."""
    try:
        conn = await AsyncConnection.connect(
            database_url, autocommit=True, connect_timeout=timeout_s
        )
    except psycopg.OperationalError:
        return
    try:
        await check_schema(conn)
    finally:
        await conn.close()


async def migrate(conn: AsyncConnection[Any]) -> int:
    """Apply pending migrations; returns the schema version."""
    async with conn.transaction():
        await conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_ID,))
        await conn.execute(
            "create table if not exists schema_migrations ("
            " version integer primary key, applied_at timestamptz not null default now())"
        )
        cur = await conn.execute("select coalesce(max(version), 0) from schema_migrations")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        for version, sql in MIGRATIONS:
            if version > current:
                await conn.execute(sql)
                await conn.execute(
                    "insert into schema_migrations (version) values (%s)", (version,)
                )
                current = version
    return current


class AuditStore:
    """Async access to the audit trail over a connection pool built once per process."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool
        # Incidents this process has made sure of (rows are never deleted): bounded, cleared
        # when full.
        self._ensured: set[str] = set()
        # Writes (rows, incidents) that failed, for the worker's metrics.
        self.write_failures = 0

    @classmethod
    async def open(
        cls,
        database_url: str,
        *,
        max_size: int = 4,
        timeout: float = 15.0,
        apply_migrations: bool = False,
    ) -> AuditStore:
        """The store, after checking that the schema is current (SchemaBehindError if not).
        Only ``relaunch db migrate`` (and the dev stack, tests) pass ``apply_migrations``:
        the services run under a role that may not change the schema."""
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            database_url, min_size=1, max_size=max_size, open=False, kwargs={"autocommit": True}
        )
        try:
            await pool.open(wait=True, timeout=timeout)
            async with pool.connection() as conn:
                if apply_migrations:
                    await migrate(conn)
                else:
                    await check_schema(conn)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            await pool.close()
            raise AuditUnavailableError(
                "cannot reach the audit database",
                hint="is PostgreSQL running (`relaunch dev status`), and is database_url right?",
            ) from exc
        except BaseException:
            await pool.close()
            raise
        return cls(pool)

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection for a read-side module that owns its SQL (the scorecard)."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise AuditUnavailableError("cannot reach the audit database") from exc

    async def ensure_incident(
        self, incident_id: str, cluster: str, job_id: str, attempt: int
    ) -> None:
        if incident_id in self._ensured:  # every row of a recovery asks; once is enough
            return
        async with self._counting_failures(), self._pool.connection() as conn:
            await conn.execute(
                "insert into incidents (id, cluster, job_id, attempt) values (%s, %s, %s, %s)"
                " on conflict (id) do nothing",
                (incident_id, cluster, job_id, attempt),
            )
        if len(self._ensured) >= ENSURED_MAX:
            self._ensured.clear()
        self._ensured.add(incident_id)

    async def record(self, record: AuditRecord, *, dedupe_key: str | None = None) -> bool:
        """Append one row; False when a row with the same dedupe_key is already there."""
        async with self._counting_failures(), self._pool.connection() as conn:
            return await _insert(conn, record, dedupe_key)

    async def record_many(self, rows: Sequence[tuple[AuditRecord, str | None]]) -> int:
        """Append several rows (each with its dedupe key) in one transaction; how many were new.
        A node decision's requeue batch records one row in each job's incident this way."""
        if not rows:
            return 0
        async with (
            self._counting_failures(),
            self._pool.connection() as conn,
            conn.transaction(),
        ):
            return sum([await _insert(conn, record, key) for record, key in rows])

    @contextlib.asynccontextmanager
    async def _counting_failures(self) -> AsyncIterator[None]:
        try:
            yield
        except Exception:
            self.write_failures += 1
            raise

    async def incident_info(self, incident_id: str) -> dict[str, Any] | None:
        """The incident's cluster, job_id and attempt (None if unknown)."""
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "select cluster, job_id, attempt from incidents where id = %s", (incident_id,)
            )
            row: dict[str, Any] | None = await cur.fetchone()
            return row

    async def has_dedupe_key(self, dedupe_key: str) -> bool:
        """Whether a row was recorded under this dedupe key (a step done before a retry)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "select 1 from audit_dedupe where dedupe_key = %s", (dedupe_key,)
            )
            return await cur.fetchone() is not None

    async def pending_notifications(
        self, cluster: str, since: datetime, limit: int = 500
    ) -> list[StoredEvent]:
        """The notification outbox: ``notification_queued`` rows of this cluster's incidents
        recorded since ``since`` with neither their sent row nor their given-up row (the keys
        named in their data), oldest first."""
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "select q.id, q.incident_id, q.kind, q.at, q.actor, q.stage, q.nodes, q.summary,"
                " q.data from audit_events q join incidents i on i.id = q.incident_id"
                " where q.kind = 'notification_queued' and i.cluster = %s and q.at >= %s"
                " and not exists (select 1 from audit_dedupe d where d.dedupe_key = any("
                "  array[q.data->>'sent_key', q.data->>'failed_key']))"
                " order by q.id limit %s",
                (cluster, since, limit),
            )
            return [StoredEvent.model_validate(row) for row in await cur.fetchall()]

    async def events_after(
        self, last_id: int, kinds: Sequence[str], limit: int = 500
    ) -> list[StoredEvent]:
        """Rows of these kinds recorded after row ``last_id``, oldest first (a follower's feed)."""
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "select id, incident_id, kind, at, actor, stage, nodes, summary, data"
                " from audit_events where id > %s and kind = any(%s) order by id limit %s",
                (last_id, list(kinds), limit),
            )
            return [StoredEvent.model_validate(row) for row in await cur.fetchall()]

    async def first_id_since(self, since: datetime, kinds: Sequence[str]) -> int:
        """The id just before the first row of these kinds at or after ``since`` (else the
        latest id): where a follower that looks back to ``since`` starts."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "select coalesce((select min(id) - 1 from audit_events"
                " where kind = any(%s) and at >= %s),"
                " (select coalesce(max(id), 0) from audit_events))",
                (list(kinds), since),
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    async def node_lifecycle_events(
        self, cluster: str, node: str, since: datetime, *, limit: int = 2000
    ) -> list[StoredEvent]:
        """The rows of ``node``'s lifecycles on ``cluster`` since ``since``, oldest first
        (``relaunch-<cluster>-lifecycle-<node>-<n>``: their faults, stages and checks)."""
        prefix = f"relaunch-{cluster}-lifecycle-{node}-"
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "select id, incident_id, kind, at, actor, stage, nodes, summary, data"
                " from audit_events where incident_id like %s and nodes @> array[%s]::text[]"
                " and at >= %s order by id limit %s",
                (pattern, node, since, limit),
            )
            return [StoredEvent.model_validate(row) for row in await cur.fetchall()]

    async def node_stages(self, cluster: str) -> dict[str, StoredEvent]:
        """Each node's latest lifecycle stage row on ``cluster`` (node → its `node_stage` row:
        the stage, the lifecycle's id, when, and what it said)."""
        sql = """
            select distinct on (e.nodes[1]) e.id, e.incident_id, e.kind, e.at, e.actor,
                   e.stage, e.nodes, e.summary, e.data
            from audit_events e join incidents i on i.id = e.incident_id
            where i.cluster = %s and e.kind = 'node_stage'
            order by e.nodes[1], e.id desc
        """
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, (cluster,))
            rows = [StoredEvent.model_validate(row) for row in await cur.fetchall()]
        return {row.nodes[0]: row for row in rows if row.nodes}

    async def events(self, incident_id: str) -> list[StoredEvent]:
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "select id, incident_id, kind, at, actor, stage, nodes, summary, data"
                " from audit_events where incident_id = %s order by at, id",
                (incident_id,),
            )
            return [StoredEvent.model_validate(row) for row in await cur.fetchall()]

    async def incidents(
        self,
        *,
        cluster: str | None = None,
        job_id: str | None = None,
        node: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[IncidentRow]:
        where: list[str] = ["true"]
        args: list[object] = []
        if cluster:
            where.append("i.cluster = %s")
            args.append(cluster)
        if job_id:
            where.append("i.job_id = %s")
            args.append(job_id)
        if node:
            where.append(
                "exists (select 1 from audit_events n where n.incident_id = i.id"
                " and %s = any(n.nodes))"
            )
            args.append(node)
        if since:
            where.append("i.created_at >= %s")
            args.append(since)
        # The page of incidents first, then each one's rows (a lateral join: the rows of a
        # hundred incidents, by index, whatever the trail's size or partitions).
        sql = f"""
            select i.id, i.cluster, i.job_id, i.attempt, i.created_at,
                   coalesce(a.last_at, i.created_at) as last_at, a.stage, a.category,
                   a.action, a.mode,
                   coalesce((select v.nodes from audit_events v where v.incident_id = i.id
                       and v.kind = 'verdict' order by v.id desc limit 1),
                       -- a node decision has no verdict: its node is its plan's
                       (select p.nodes from audit_events p where p.incident_id = i.id
                       and p.kind = 'plan' and i.job_id = '' order by p.id desc limit 1),
                       '{{}}') as nodes
            from (select * from recoveries i where {" and ".join(where)}
                  order by i.created_at desc limit %s) i
            left join lateral (
                select max(e.at) as last_at,
                   (array_agg(e.stage order by e.id desc) filter (where e.kind = 'stage'))[1]
                       as stage,
                   (array_agg(e.data->>'category' order by e.id desc)
                       filter (where e.kind = 'verdict'))[1] as category,
                   (array_agg(e.data->>'action' order by e.id desc)
                       filter (where e.kind = 'plan'))[1] as action,
                   (array_agg(e.data->>'mode' order by e.id desc)
                       filter (where e.kind = 'plan'))[1] as mode
                from audit_events e where e.incident_id = i.id) a on true
            order by i.created_at desc
        """
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, (*args, limit))
            return [IncidentRow.model_validate(row) for row in await cur.fetchall()]

    async def count_restarts(self, cluster: str, job_ids: Sequence[str], since: datetime) -> int:
        """Restarts Relaunch performed for these jobs (a lineage) since ``since``."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "select count(*) from audit_events e join incidents i on i.id = e.incident_id"
                " where i.cluster = %s and i.job_id = any(%s) and e.kind = 'action'"
                " and e.data->>'step' = 'restart' and (e.data->>'changed')::boolean"
                " and e.at >= %s",
                (cluster, list(job_ids), since),
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    async def resubmitted_from(self, cluster: str, job_id: str) -> str | None:
        """The job ``job_id`` is the resubmission of, by the audit trail alone: a ``lineage``
        row a recovery of the parent recorded right after its own ``sbatch`` (or, in a trail
        older than those rows, the parent's restart that submitted it). A job's comment never
        counts (docs/trust.md, "Resubmission lineage")."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"select i.job_id from audit_events e join incidents i on i.id = e.incident_id"
                f" where i.cluster = %s and {LINEAGE_ROW} and {LINEAGE_CHILD} = %s"
                " order by e.id limit 1",
                (cluster, job_id),
            )
            row = await cur.fetchone()
            return str(row[0]) if row else None

    async def lineage(self, cluster: str, job_id: str, depth: int = MAX_DEPTH) -> list[str]:
        """This job and the jobs it was resubmitted from, newest first (see
        :meth:`resubmitted_from`); ``depth`` generations at most."""
        chain = [job_id]
        for _ in range(depth):
            parent = await self.resubmitted_from(cluster, chain[-1])
            if parent is None or parent in chain:
                break
            chain.append(parent)
        return chain

    async def restarts_by_job(
        self, cluster: str, job_ids: Sequence[str], since: datetime
    ) -> dict[str, tuple[int, int]]:
        """For each of ``job_ids``: the restarts Relaunch performed for it ever, and since
        ``since`` (one query for a whole requeue batch; see ``count_restarts``)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "select i.job_id, count(*), count(*) filter (where e.at >= %s)"
                " from audit_events e join incidents i on i.id = e.incident_id"
                " where i.cluster = %s and i.job_id = any(%s) and e.kind = 'action'"
                " and e.data->>'step' = 'restart' and (e.data->>'changed')::boolean"
                " group by i.job_id",
                (since, cluster, list(job_ids)),
            )
            found = {str(r[0]): (int(r[1]), int(r[2])) for r in await cur.fetchall()}
        return {j: found.get(j, (0, 0)) for j in job_ids}

    async def covered_by(self, decision_id: str) -> list[str]:
        """The job recoveries that joined the node decision ``decision_id`` (their
        `node_decision` rows), oldest first."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "select distinct e.incident_id, min(e.id) from audit_events e"
                " where e.kind = 'node_decision' and exists (select 1 from"
                " jsonb_each_text(coalesce(e.data->'decisions', '{}'::jsonb)) d"
                " where d.value = %s) group by e.incident_id order by min(e.id)",
                (decision_id,),
            )
            return [str(r[0]) for r in await cur.fetchall()]

    async def drained_nodes(self, cluster: str, since: datetime) -> list[str]:
        """Nodes Relaunch drained on this cluster since ``since`` (the blast-radius window)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "select distinct unnest(e.nodes) from audit_events e"
                " join incidents i on i.id = e.incident_id"
                " where i.cluster = %s and e.kind = 'action' and e.data->>'step' = 'drain'"
                " and (e.data->>'changed')::boolean and e.at >= %s",
                (cluster, since),
            )
            return sorted(str(r[0]) for r in await cur.fetchall())

    @contextlib.asynccontextmanager
    async def drain_lock(self, cluster: str, *, hang_limit_s: float = 300.0) -> AsyncIterator[None]:
        """Hold the cluster's blast-radius lock for the body (waiting for it if another worker
        holds it): whoever drains reads past drains, re-checks the guard, drains and records the
        drain while no one else on this cluster can.

        The lock is a transaction-scoped advisory lock on a connection of its own, not the
        pool's: waiters must not starve the pool, and the holder records its drain through the
        pool before it lets go. It ends with the body; the server ends it when a crashed
        worker's connection drops, and ``hang_limit_s`` idle inside the transaction (a worker
        that hangs while holding it) ends the session and so the lock."""
        conninfo = self._pool.conninfo
        if not isinstance(conninfo, str):  # every pool here is built from a database URL
            raise TypeError("the drain lock needs a pool built from a database URL")
        try:
            conn = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, connect_timeout=15
            )
        except psycopg.OperationalError as exc:
            raise AuditUnavailableError("no audit database for the drain lock") from exc
        async with conn:
            try:
                await conn.execute(
                    "select set_config('idle_in_transaction_session_timeout', %s, false)",
                    (str(int(hang_limit_s * 1000)),),
                )
                await conn.execute("begin")
                await conn.execute("select pg_advisory_xact_lock(%s)", (drain_lock_key(cluster),))
            except psycopg.OperationalError as exc:
                raise AuditUnavailableError("lost the audit database for the drain lock") from exc
            try:
                yield
            finally:
                with contextlib.suppress(psycopg.Error):  # a dropped session has let go already
                    await conn.execute("rollback")

    async def suspicions(self, cluster: str, since: datetime) -> list[NodeSuspicion]:
        """Nodes that verdicts since ``since`` named on job-controlled evidence alone (their
        ``suspects``), with the distinct users whose jobs did (``user``; rows without a user
        do not count)."""
        sql = """
            select n.node, array_agg(distinct e.data->>'user' order by e.data->>'user')
                       as users,
                   count(distinct i.id) as incidents, max(e.at) as last_at
            from audit_events e
            join incidents i on i.id = e.incident_id
            cross join lateral jsonb_array_elements_text(
                case when jsonb_typeof(e.data->'suspects') = 'array'
                     then e.data->'suspects' else '[]'::jsonb end) as n(node)
            where i.cluster = %s and e.kind = 'verdict' and e.at >= %s
              and coalesce(e.data->>'user', '') <> ''
            group by n.node
            order by n.node
        """
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, (cluster, since))
            return [NodeSuspicion.model_validate(row) for row in await cur.fetchall()]

    async def node_reputation(self, cluster: str, since: datetime) -> list[NodeReputation]:
        """Each node's incidents since ``since`` that implicated it: those whose verdict
        records the node as ``implicated`` — trusted evidence on it (see ``implicated``). A
        node named only by a job's output or for its reputation does not count."""
        sql = """
            select n.node, count(distinct i.id) as incidents,
                   count(distinct i.job_id) as jobs, max(e.at) as last_at,
                   array_agg(distinct e.data->>'category') as categories,
                   (array_agg(i.id order by e.at desc))[1:5] as recent
            from audit_events e
            join incidents i on i.id = e.incident_id
            cross join lateral jsonb_array_elements_text(
                coalesce(e.data->'implicated', '[]'::jsonb)) as n(node)
            where i.cluster = %s and e.kind = 'verdict' and e.at >= %s
            group by n.node
            order by incidents desc, n.node
        """
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, (cluster, since))
            return [NodeReputation.model_validate(row) for row in await cur.fetchall()]

    async def outside_events(
        self,
        cluster: str,
        since: datetime,
        *,
        kinds: Sequence[str] = OUTSIDE_KINDS,
        nodes: Sequence[str] | None = None,
        limit: int = 500,
        trusted: bool | None = None,
    ) -> list[StoredEvent]:
        """What other systems said of ``cluster``'s nodes since ``since``, oldest first: health
        events pushed in (``health_event``) and Slurm drains Relaunch did not make
        (``external_drain``), recorded under ``intake-<cluster>``; only rows naming one of
        ``nodes`` when given, and only those whose sender was (``trusted=True``) or was not
        (``False``) trusted with them when given. The ``limit`` latest rows at most."""
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "select id, incident_id, kind, at, actor, stage, nodes, summary, data"
                " from audit_events where incident_id = %s and kind = any(%s) and at >= %s"
                " and (%s::text[] is null or nodes && %s::text[])"
                " and (%s::boolean is null"
                " or coalesce(data->>'trusted' = 'true', false) = %s::boolean)"
                " order by id desc limit %s",
                (
                    intake_incident(cluster),
                    list(kinds),
                    since,
                    nodes,
                    nodes,
                    trusted,
                    trusted,
                    limit,
                ),
            )
            rows = [StoredEvent.model_validate(row) for row in await cur.fetchall()]
        return rows[::-1]
