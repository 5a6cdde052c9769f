"""The console's read side over the audit trail: one pool, one query per question.

Written for a trail of tens of thousands of incidents: every list starts from an index (newest
incidents, terminal stages, kind+time, actor, incident+id) and only then looks at each picked
incident's rows through the (incident_id, id) index.

Lists take ``clusters``: None reads every cluster (the same SQL as a console of one cluster),
a list limits the answer to those clusters' incidents (a token's scope, a ``?cluster=`` filter).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import BaseModel

from relaunch.connectors.audit import (
    LINEAGE_CHILD,
    LINEAGE_ROW,
    AuditStore,
    AuditUnavailableError,
    IncidentRow,
    NodeReputation,
    SchemaBehindError,
    StoredEvent,
    check_schema,
)
from relaunch.console.kpis import IncidentTimes
from relaunch.models.search_attributes import TERMINAL_STAGES, Stage

T = TypeVar("T")

TERMINAL = sorted(s.value for s in TERMINAL_STAGES)


class ClusterSummary(BaseModel):
    name: str
    incidents: int
    last_at: datetime | None = None


class NodeDrain(BaseModel):
    """The latest drain/fence/resume Relaunch (or a console user) recorded for a node."""

    node: str
    step: str
    at: datetime
    actor: str
    incident_id: str
    summary: str


class JobSummary(BaseModel):
    cluster: str
    job_id: str
    incidents: int
    attempts: int
    first_at: datetime
    last_at: datetime


class PendingRow(IncidentRow):
    """An incident waiting for a decision, with what its latest stage row says (a node
    lifecycle's pending step has no plan: this is its recommendation)."""

    stage_summary: str | None = None


class AttemptRow(IncidentRow):
    checkpoint_step: int | None = None
    restarts: int = 0
    new_job_id: str | None = None
    fault_at: datetime | None = None
    running_at: datetime | None = None
    closed: bool = False


class AuditFilter(BaseModel):
    """Filters of the audit search (all optional, combined with AND)."""

    cluster: str | None = None
    job: str | None = None
    node: str | None = None
    category: str | None = None
    kind: str | None = None
    action: str | None = None
    actor: str | None = None
    incident: str | None = None
    since: datetime | None = None
    until: datetime | None = None


class DatabaseUnavailableError(AuditUnavailableError):
    """The console cannot reach the audit database right now."""


Clusters = list[str] | None


def _where_cluster(clusters: Clusters, column: str = "cluster", keyword: str = "where") -> str:
    """The SQL that limits rows to ``clusters`` (bound as ``%(clusters)s``), or nothing."""
    return "" if clusters is None else f" {keyword} {column} = any(%(clusters)s)"


def _events_in(clusters: Clusters, alias: str = "") -> str:
    """An ``and`` limiting audit rows to the incidents of ``clusters``, or nothing."""
    if clusters is None:
        return ""
    col = f"{alias}.incident_id" if alias else "incident_id"
    return f" and {col} in (select id from incidents where cluster = any(%(clusters)s))"


_SUMMARY_SQL = """
    select i.id, i.cluster, i.job_id, i.attempt, i.created_at,
           s.stage, s.at as stage_at, s.stage_summary, v.category, v.confidence,
           coalesce(v.nodes, '{}') as nodes, p.action, p.mode, p.summary as plan_summary
    from picked i
    left join lateral (
        select e.id as stage_id, e.stage, e.at, e.summary as stage_summary from audit_events e
        where e.incident_id = i.id and e.kind = 'stage' order by e.id desc limit 1) s on true
    left join lateral (
        select e.data->>'category' as category, (e.data->>'confidence')::float as confidence,
               e.nodes from audit_events e
        where e.incident_id = i.id and e.kind = 'verdict' order by e.id desc limit 1) v on true
    left join lateral (
        select e.data->>'action' as action, e.data->>'mode' as mode, e.summary
        from audit_events e
        where e.incident_id = i.id and e.kind = 'plan' order by e.id desc limit 1) p on true
"""

# An incident's stage rows come after it was made: the bound on `at` (a day of slack for
# clocks) lets each probe skip the months before it (audit rows are partitioned by `at`).
_OPEN = """
    select * from recoveries i where not exists (
        select 1 from audit_events t where t.incident_id = i.id and t.kind = 'stage'
        and t.stage = any(%(terminal)s) and t.at >= i.created_at - interval '1 day')
"""


class ConsoleDb:
    """A small pool for the console; every failure to reach PostgreSQL is one typed error."""

    def __init__(self, database_url: str, *, max_size: int = 8, timeout: float = 3.0) -> None:
        self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=timeout,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout))},
        )
        self._schema_checked = False
        self._lock = asyncio.Lock()
        self._cache: dict[Hashable, tuple[float, Any]] = {}
        self.store = AuditStore(self._pool)

    async def start(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._answering(), self._pool.connection() as conn:
            if not self._schema_checked:
                async with self._lock:
                    if not self._schema_checked:
                        await self._check_schema(conn)
                        self._schema_checked = True
            yield conn

    @staticmethod
    async def _check_schema(conn: AsyncConnection[Any]) -> None:
        """The schema current, or a 503 that says so and names the command (checked again at
        the next request: the console recovers once someone runs the migrations)."""
        try:
            await check_schema(conn)
        except SchemaBehindError as exc:
            raise DatabaseUnavailableError(exc.message, hint=exc.hint) from exc

    @asynccontextmanager
    async def _answering(self) -> AsyncIterator[None]:
        """Every failure to reach PostgreSQL inside, as one typed error."""
        try:
            yield
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise DatabaseUnavailableError(
                "the audit database does not answer",
                hint="is PostgreSQL running (`relaunch dev status`)?",
            ) from exc

    async def from_store(self, query: Callable[[AuditStore], Awaitable[T]]) -> T:
        """One of the audit store's queries, on this pool: the schema checked first, and a
        database that does not answer is the typed DatabaseUnavailableError (a 503)."""
        if not self._schema_checked:
            async with self.connection():
                pass
        async with self._answering():
            return await query(self.store)

    async def cached(self, key: Hashable, ttl_s: float, factory: Callable[[], Awaitable[T]]) -> T:
        """``factory()``'s result, reused for ``ttl_s`` seconds (window-wide aggregates only:
        what a page shows live is never cached)."""
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < ttl_s:
            value: T = hit[1]
            return value
        value = await factory()
        self._cache[key] = (now, value)
        return value

    def forget(self, key: Hashable) -> None:
        """Drop one cached value (what was just changed here must show at once)."""
        self._cache.pop(key, None)

    async def _rows(self, sql: str, args: Any = None) -> list[dict[str, Any]]:
        async with self.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, args)
            return list(await cur.fetchall())

    async def _one(self, sql: str, args: Any = None) -> dict[str, Any] | None:
        rows = await self._rows(sql, args)
        return rows[0] if rows else None

    # ------------------------------------------------------------------ overview

    async def clusters(self, clusters: Clusters = None) -> list[ClusterSummary]:
        rows = await self._rows(
            "select cluster as name, count(*) as incidents, max(created_at) as last_at"
            f" from recoveries{_where_cluster(clusters)} group by cluster order by cluster",
            {"clusters": clusters},
        )
        return [ClusterSummary.model_validate(r) for r in rows]

    async def recent_incidents(
        self, limit: int = 20, clusters: Clusters = None
    ) -> list[IncidentRow]:
        sql = (
            f"with picked as (select * from recoveries{_where_cluster(clusters)}"
            " order by created_at desc limit %(limit)s)"
            + _SUMMARY_SQL
            + " order by i.created_at desc"
        )
        rows = await self._rows(sql, {"limit": limit, "clusters": clusters})
        return [IncidentRow.model_validate(r) for r in rows]

    async def open_incidents(
        self, limit: int = 100, clusters: Clusters = None
    ) -> list[IncidentRow]:
        sql = (
            f"with picked as ({_OPEN}{_where_cluster(clusters, 'i.cluster', 'and')}"
            " order by i.created_at desc limit %(limit)s)"
            + _SUMMARY_SQL
            + " order by i.created_at desc"
        )
        rows = await self._rows(sql, {"terminal": TERMINAL, "limit": limit, "clusters": clusters})
        return [IncidentRow.model_validate(r) for r in rows]

    async def pending_approvals(self, clusters: Clusters = None) -> list[PendingRow]:
        sql = (
            f"with picked as ({_OPEN}{_where_cluster(clusters, 'i.cluster', 'and')})"
            + _SUMMARY_SQL
            + " where s.stage = %(awaiting)s"
            # Decided, and not yet on to its next stage (a node lifecycle records no stage
            # between a decision and what it leads to): no longer pending.
            + " and not exists (select 1 from audit_events d where d.incident_id = i.id"
            " and d.kind in ('approval', 'rejection') and d.id > s.stage_id)"
            " order by s.at"
        )
        rows = await self._rows(
            sql,
            {
                "terminal": TERMINAL,
                "awaiting": Stage.AWAITING_APPROVAL.value,
                "clusters": clusters,
            },
        )
        return [PendingRow.model_validate(r) for r in rows]

    async def categories(self, since: datetime, clusters: Clusters = None) -> dict[str, int]:
        rows = await self._rows(
            "select coalesce(data->>'category', 'unknown') as category, count(*) as n"
            " from audit_events where kind = 'verdict' and at >= %(since)s"
            f"{_events_in(clusters)} group by 1",
            {"since": since, "clusters": clusters},
        )
        return {str(r["category"]): int(r["n"]) for r in rows}

    async def detection_latencies(self, since: datetime, clusters: Clusters = None) -> list[float]:
        rows = await self._rows(
            "select (data->>'detection_latency_s')::float as v from audit_events"
            " where kind = 'detection' and at >= %(since)s"
            " and jsonb_typeof(data->'detection_latency_s') = 'number'"
            f"{_events_in(clusters)}",
            {"since": since, "clusters": clusters},
        )
        return [float(r["v"]) for r in rows]

    async def incident_times(
        self, since: datetime, clusters: Clusters = None
    ) -> list[IncidentTimes]:
        """Milestones of every incident with rows in the window (from the kind+time index; the
        only stage rows read are the terminal ones)."""
        rows = await self._rows(
            """
            select e.incident_id,
                   min(case when e.kind = 'detection' then
                       coalesce((e.data->>'fault_time')::timestamptz, e.at) end) as fault_at,
                   min(e.at) filter (where e.kind = 'detection') as detected_at,
                   min(e.at) filter (where e.kind = 'action') as first_action_at,
                   min(e.at) filter (where e.kind = 'verify') as running_at,
                   bool_or(e.kind = 'stage') as closed
            from audit_events e
            where e.at >= %(since)s
              and (e.kind in ('detection', 'action', 'verify')
                   or (e.kind = 'stage' and e.stage = any(%(terminal)s)))"""
            + _events_in(clusters, "e")
            + """
            group by e.incident_id
            having min(e.at) filter (where e.kind = 'detection') is not null
            """,
            {"since": since, "terminal": TERMINAL, "clusters": clusters},
        )
        return [IncidentTimes.model_validate(r) for r in rows]

    async def restarts(self, since: datetime, clusters: Clusters = None) -> int:
        row = await self._one(
            "select count(*) as n from audit_events where kind = 'action' and at >= %(since)s"
            " and data->>'step' = 'restart' and coalesce((data->>'changed')::boolean, false)"
            f"{_events_in(clusters)}",
            {"since": since, "clusters": clusters},
        )
        return int(row["n"]) if row else 0

    async def incidents_over_time(
        self, since: datetime, bucket: str, clusters: Clusters = None
    ) -> list[tuple[datetime, int]]:
        rows = await self._rows(
            "select date_trunc(%(bucket)s, created_at) as b, count(*) as n from recoveries"
            f" where created_at >= %(since)s{_where_cluster(clusters, keyword='and')}"
            " group by 1 order by 1",
            {"bucket": bucket, "since": since, "clusters": clusters},
        )
        return [(r["b"], int(r["n"])) for r in rows]

    # ------------------------------------------------------------------ incident

    async def incident(self, incident_id: str) -> IncidentRow | None:
        rows = await self._rows(
            "with picked as (select * from recoveries where id = %(id)s)" + _SUMMARY_SQL,
            {"id": incident_id},
        )
        return IncidentRow.model_validate(rows[0]) if rows else None

    # ------------------------------------------------------------------ nodes

    async def node_drains(self, cluster: str) -> dict[str, NodeDrain]:
        rows = await self._rows(
            """
            select distinct on (n.node) n.node, e.data->>'step' as step, e.at, e.actor,
                   e.incident_id, e.summary
            from audit_events e
            join recoveries i on i.id = e.incident_id
            cross join lateral unnest(e.nodes) as n(node)
            where e.kind = 'action' and e.data->>'step' in ('drain', 'fence', 'resume')
              and coalesce((e.data->>'changed')::boolean, true) and i.cluster = %s
            order by n.node, e.id desc
            """,
            (cluster,),
        )
        return {str(r["node"]): NodeDrain.model_validate(r) for r in rows}

    async def node_stages(self, cluster: str) -> dict[str, StoredEvent]:
        """Each node's latest lifecycle stage row on ``cluster`` (AuditStore.node_stages)."""
        return await self.from_store(lambda store: store.node_stages(cluster))

    async def latest_rows(
        self, incidents: Sequence[str], kinds: Sequence[str]
    ) -> list[StoredEvent]:
        """The latest row of each of ``kinds`` in each of ``incidents`` (one statement, through
        the (incident_id, id) index: a lifecycle has tens of rows)."""
        if not incidents:
            return []
        rows = await self._rows(
            "select distinct on (incident_id, kind) id, incident_id, kind, at, actor, stage,"
            " nodes, summary, data from audit_events"
            " where incident_id = any(%s) and kind = any(%s)"
            " order by incident_id, kind, id desc",
            (list(incidents), list(kinds)),
        )
        return [StoredEvent.model_validate(r) for r in rows]

    async def reputation(self, cluster: str, since: datetime) -> list[NodeReputation]:
        return await self.from_store(lambda store: store.node_reputation(cluster, since))

    # ------------------------------------------------------------------ jobs

    async def jobs(self, limit: int = 200, clusters: Clusters = None) -> list[JobSummary]:
        rows = await self._rows(
            "select cluster, job_id, count(*) as incidents, max(attempt) + 1 as attempts,"
            f" min(created_at) as first_at, max(created_at) as last_at from recoveries"
            f"{_where_cluster(clusters)}"
            " group by cluster, job_id order by max(created_at) desc limit %(limit)s",
            {"limit": limit, "clusters": clusters},
        )
        return [JobSummary.model_validate(r) for r in rows]

    async def job_links(self, cluster: str, job_id: str) -> tuple[str | None, list[str]]:
        """(the job this one was resubmitted from, the jobs resubmitted from it), by the rows
        Relaunch recorded of its own submissions (AuditStore.resubmitted_from), never by a
        job's comment."""
        parent = await self._one(
            f"select i.job_id as parent from recoveries i"
            f" join audit_events e on e.incident_id = i.id"
            f" where i.cluster = %(c)s and {LINEAGE_ROW} and {LINEAGE_CHILD} = %(j)s"
            " order by e.id limit 1",
            {"c": cluster, "j": job_id},
        )
        children = await self._rows(
            f"select distinct {LINEAGE_CHILD} as child"
            " from recoveries i join audit_events e on e.incident_id = i.id"
            f" where i.cluster = %s and i.job_id = %s and {LINEAGE_ROW}"
            f" and {LINEAGE_CHILD} is not null and {LINEAGE_CHILD} <> i.job_id",
            (cluster, job_id),
        )
        return (
            str(parent["parent"]) if parent and parent["parent"] else None,
            sorted(str(r["child"]) for r in children),
        )

    async def lineage(self, cluster: str, job_id: str, depth: int = 20) -> list[str]:
        """Every job of this job's lineage, oldest first (requeues keep the id)."""
        root = job_id
        seen = {job_id}
        for _ in range(depth):
            parent, _children = await self.job_links(cluster, root)
            if parent is None or parent in seen:
                break
            seen.add(parent)
            root = parent
        chain, frontier = [root], [root]
        for _ in range(depth):
            nxt: list[str] = []
            for job in frontier:
                _, children = await self.job_links(cluster, job)
                nxt += [c for c in children if c not in chain]
            if not nxt:
                break
            chain += nxt
            frontier = nxt
        return chain

    async def attempts(self, cluster: str, job_ids: Sequence[str]) -> list[AttemptRow]:
        sql = (
            "with picked as (select * from recoveries"
            " where cluster = %(c)s and job_id = any(%(jobs)s))"
            + _SUMMARY_SQL.replace(
                "from picked i",
                """, x.checkpoint_step, x.restarts, x.new_job_id, x.fault_at, x.running_at,
                   x.closed
                from picked i
                left join lateral (
                    select max((e.data->'job'->>'last_checkpoint_step')::bigint)
                               filter (where e.kind = 'evidence') as checkpoint_step,
                           count(*) filter (where e.kind = 'action'
                               and e.data->>'step' = 'restart'
                               and coalesce((e.data->>'changed')::boolean, false)) as restarts,
                           max(e.data->>'new_job_id') filter (where e.kind = 'action'
                               and e.data->>'step' = 'restart'
                               and coalesce((e.data->>'changed')::boolean, false))
                               as new_job_id,
                           min(case when e.kind = 'detection' then coalesce(
                               (e.data->>'fault_time')::timestamptz, e.at) end) as fault_at,
                           min(e.at) filter (where e.kind = 'verify') as running_at,
                           coalesce(bool_or(e.kind = 'stage'
                               and e.stage = any(%(terminal)s)), false) as closed
                    from audit_events e where e.incident_id = i.id) x on true""",
                1,
            )
            + " order by i.created_at"
        )
        rows = await self._rows(sql, {"c": cluster, "jobs": list(job_ids), "terminal": TERMINAL})
        return [AttemptRow.model_validate(r) for r in rows]

    # ------------------------------------------------------------------ audit search

    async def search(
        self, f: AuditFilter, *, before: int | None, limit: int, clusters: Clusters = None
    ) -> tuple[list[StoredEvent], int | None]:
        """One page, newest first, and the id to pass as ``before`` for the next (or None)."""
        where: list[str] = ["true"]
        args: dict[str, Any] = {"limit": limit + 1}
        if before is not None:
            where.append("e.id < %(before)s")
            args["before"] = before
        if f.cluster or f.job or clusters is not None:
            sub = ["true"]
            if clusters is not None:
                sub.append("cluster = any(%(clusters)s)")
                args["clusters"] = list(clusters)
            if f.cluster:
                sub.append("cluster = %(cluster)s")
            if f.job:
                sub.append("job_id = %(job)s")
            where.append(f"e.incident_id in (select id from incidents where {' and '.join(sub)})")
        if f.node:
            where.append("%(node)s = any(e.nodes)")
        if f.category:
            where.append(
                "e.incident_id in (select v.incident_id from audit_events v"
                " where v.kind = 'verdict' and v.data->>'category' = %(category)s)"
            )
        if f.kind:
            where.append("e.kind = %(kind)s")
        if f.action:
            where.append(
                "((e.kind = 'action' and e.data->>'step' = %(action)s)"
                " or (e.kind = 'plan' and e.data->>'action' = %(action)s))"
            )
        if f.actor:
            where.append("e.actor = %(actor)s")
        if f.incident:
            where.append("e.incident_id = %(incident)s")
        if f.since:
            where.append("e.at >= %(since)s")
        if f.until:
            where.append("e.at < %(until)s")
        args.update({k: v for k, v in f.model_dump().items() if v is not None})
        rows = await self._rows(
            "select e.id, e.incident_id, e.kind, e.at, e.actor, e.stage, e.nodes, e.summary,"
            f" e.data from audit_events e where {' and '.join(where)}"
            " order by e.id desc limit %(limit)s",
            args,
        )
        events = [StoredEvent.model_validate(r) for r in rows[:limit]]
        return events, (events[-1].id if len(rows) > limit and events else None)

    # ------------------------------------------------------------------ live

    async def latest_id(self) -> int:
        row = await self._one("select coalesce(max(id), 0) as id from audit_events")
        return int(row["id"]) if row else 0

    async def events_after(self, last_id: int, limit: int = 500) -> list[dict[str, Any]]:
        """New audit rows, each with its incident's cluster (to show each viewer only theirs)."""
        return await self._rows(
            "select e.id, e.incident_id, i.cluster, e.kind, e.at, e.actor, e.stage, e.summary"
            " from audit_events e join incidents i on i.id = e.incident_id"
            " where e.id > %s order by e.id limit %s",
            (last_id, limit),
        )


def bucket_for(window: timedelta) -> str:
    return "hour" if window <= timedelta(days=2) else "day"
