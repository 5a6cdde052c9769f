"""``GET /metrics``: Prometheus metrics counted from the audit trail.

Counts come from the trail, so they survive restarts and agree with the console's pages. The
console reads the whole trail once (the first scrape), then at each scrape only the rows
appended since (``AuditCounters``): a scrape costs O(new rows), not O(trail). ``full_snapshot``
is the same numbers recounted by SQL aggregates, at O(trail) per call; the tests and
bench/audit_scale.py compare the two. A token limited to some clusters scrapes the series of
those clusters' incidents only. The scorecard's series are in scorecard_metrics.py.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from psycopg.rows import dict_row
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from relaunch.console.auth import ConsoleRole
from relaunch.console.paused import paused_series
from relaunch.console.queries import ConsoleDb
from relaunch.console.scorecard_metrics import ScorecardCollector, scorecards
from relaunch.console.web import authenticate, console, require
from relaunch.models.config import ClusterConfig
from relaunch.models.search_attributes import TERMINAL_STAGES, Stage

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TO_ACTION_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)


def _histogram_sql(values: str, buckets: Sequence[float]) -> str:
    # Bucket bounds are constants of this module, never input.
    counts = ", ".join(f"count(*) filter (where v <= {b!r})" for b in buckets)
    return f"(select jsonb_build_array(count(*), coalesce(sum(v), 0), {counts}) from ({values}) h)"


_DETECTIONS = """
    with det as (select incident_id, coalesce(data->>'source', 'unknown') as source
                 from audit_events where kind = 'detection'),
         verdict as (select distinct on (incident_id) incident_id, data->>'category' as category
                     from audit_events where kind = 'verdict' order by incident_id, id desc)
    select d.source, coalesce(v.category, 'unknown') as category, count(*) as n
    from det d left join verdict v using (incident_id) group by 1, 2
"""

_LATENCIES = """
    select (data->>'detection_latency_s')::float as v from audit_events
    where kind = 'detection' and jsonb_typeof(data->'detection_latency_s') = 'number'
"""

_TO_ACTION = """
    select extract(epoch from min(at) filter (where kind = 'action')
                   - min(at) filter (where kind = 'detection'))::float as v
    from audit_events where kind in ('detection', 'action')
    group by incident_id
    having min(at) filter (where kind = 'action') is not null
       and min(at) filter (where kind = 'detection') is not null
"""

_ACTIONS = """
    select coalesce(data->>'step', 'unknown') as step,
           case when coalesce((data->>'changed')::boolean, false) then 'done' else 'unchanged'
           end as result, count(*) as n
    from audit_events where kind = 'action' group by 1, 2
"""

_PENDING = f"""
    select count(*) from audit_events a
    where a.kind = 'stage' and a.stage = '{Stage.AWAITING_APPROVAL.value}'
      and not exists (select 1 from audit_events l where l.incident_id = a.incident_id
                      and l.kind in ('stage', 'approval', 'rejection') and l.id > a.id)
"""

_REFUSALS = """
    select coalesce(data->>'guard', 'unknown') as guard, count(*) as n from audit_events
    where kind = 'guard' and not coalesce((data->>'allowed')::boolean, true) group by 1
"""


def _agg(sql: str) -> str:
    return f"(select coalesce(jsonb_agg(to_jsonb(x)), '[]'::jsonb) from ({sql}) x)"


SNAPSHOT_SQL = f"""
    select {_agg(_DETECTIONS)} as detections,
           {_histogram_sql(_LATENCIES, LATENCY_BUCKETS)} as latency,
           {_histogram_sql(_TO_ACTION, TO_ACTION_BUCKETS)} as to_action,
           {_agg(_ACTIONS)} as actions,
           ({_PENDING}) as pending,
           {_agg(_REFUSALS)} as refusals
"""
assert Stage.AWAITING_APPROVAL not in TERMINAL_STAGES

# The same statement over some clusters' rows: a CTE that shadows the table (inside a
# non-recursive CTE's own body the name still means the table).
SCOPED_SNAPSHOT_SQL = (
    "with audit_events as (select * from audit_events where incident_id in"
    " (select id from incidents where cluster = any(%(clusters)s)))" + SNAPSHOT_SQL
)


def _histogram(
    name: str, doc: str, rows: dict[str, Sequence[float]], buckets: Sequence[float]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["cluster"])
    for cluster, (count, total, *cumulative) in rows.items():
        pairs = [(repr(float(b)), float(n)) for b, n in zip(buckets, cumulative, strict=True)]
        family.add_metric([cluster], [*pairs, ("+Inf", float(count))], float(total))
    return family


class AuditCollector(Collector):
    """The metric families of one snapshot of the audit trail per cluster (computed before
    the scrape renders: the registry's collect() is synchronous, the database is not). Every
    series carries the cluster (the dashboard's ``$cluster``)."""

    def __init__(self, snapshots: dict[str, dict[str, Any]]) -> None:
        self.snapshots = snapshots

    def collect(self) -> Iterable[Metric]:
        each = self.snapshots
        detections = CounterMetricFamily(
            "relaunch_detections",
            "Detections recorded, by source and by the incident's verdict category.",
            labels=["source", "category", "cluster"],
        )
        for cluster, s in each.items():
            for r in s["detections"]:
                detections.add_metric([r["source"], r["category"], cluster], float(r["n"]))
        yield detections
        yield _histogram(
            "relaunch_detection_latency_seconds",
            "From the fault's first trace to its detection.",
            {cluster: s["latency"] for cluster, s in each.items()},
            LATENCY_BUCKETS,
        )
        yield _histogram(
            "relaunch_detection_to_action_seconds",
            "From an incident's first detection to its first action.",
            {cluster: s["to_action"] for cluster, s in each.items()},
            TO_ACTION_BUCKETS,
        )
        actions = CounterMetricFamily(
            "relaunch_actions",
            "Scheduler actions recorded, by step and result (done: it changed something).",
            labels=["step", "result", "cluster"],
        )
        for cluster, s in each.items():
            for r in s["actions"]:
                actions.add_metric([r["step"], r["result"], cluster], float(r["n"]))
        yield actions
        pending = GaugeMetricFamily(
            "relaunch_approvals_pending",
            "Recoveries waiting for an operator's approval.",
            labels=["cluster"],
        )
        for cluster, s in each.items():
            pending.add_metric([cluster], float(s["pending"]))
        yield pending
        refusals = CounterMetricFamily(
            "relaunch_guard_refusals",
            "Plans a guard refused, by guard.",
            labels=["guard", "cluster"],
        )
        for cluster, s in each.items():
            for r in s["refusals"]:
                refusals.add_metric([r["guard"], cluster], float(r["n"]))
        yield refusals
        failed = CounterMetricFamily(
            "relaunch_recoveries_failed",
            "Recoveries that ended in the failed stage.",
            labels=["cluster"],
        )
        late = GaugeMetricFamily(
            "relaunch_approvals_waiting_past_half_expiry",
            "Recoveries waiting for an approval for more than half their approval timeout.",
            labels=["cluster"],
        )
        for cluster, s in each.items():
            if "failed" in s:
                failed.add_metric([cluster], float(s["failed"]))
                late.add_metric([cluster], float(s["past_half_expiry"]))
        yield failed
        yield late


async def full_snapshot(
    db: ConsoleDb, clusters: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Every series' numbers for each cluster of ``clusters`` that has incidents (None: every
    cluster), recounted from the whole trail by one statement per cluster (the reference the
    incremental counters must equal; the new series are left out)."""
    rows = await db._rows("select distinct cluster from incidents order by 1")  # noqa: SLF001
    names = [str(r["cluster"]) for r in rows if clusters is None or r["cluster"] in clusters]
    snapshots: dict[str, dict[str, Any]] = {}
    for name in names:
        row = await db._one(SCOPED_SNAPSHOT_SQL, {"clusters": [name]})  # noqa: SLF001
        assert row is not None
        snapshots[name] = row
    return snapshots


# The columns the counters read of each row (never the whole data document).
_FEED = """
    select e.id, e.incident_id, i.cluster, e.kind, e.at, e.stage,
           coalesce(e.data->>'source', 'unknown') as source,
           case when jsonb_typeof(e.data->'detection_latency_s') = 'number'
                then (e.data->>'detection_latency_s')::float end as latency,
           coalesce(e.data->>'category', 'unknown') as category,
           coalesce(e.data->>'step', 'unknown') as step,
           coalesce((e.data->>'changed')::boolean, false) as changed,
           coalesce(e.data->>'guard', 'unknown') as guard,
           coalesce((e.data->>'allowed')::boolean, true) as allowed
    from audit_events e join incidents i on i.id = e.incident_id
    where e.id > %(after)s
      and e.kind in ('detection', 'verdict', 'action', 'stage', 'approval', 'rejection', 'guard')
    order by e.id limit %(limit)s
"""
_KINDS = "('detection', 'verdict', 'action', 'stage', 'approval', 'rejection', 'guard')"

# The seed: the same state as feeding every row up to %(upto)s, aggregated by the server (one
# snapshot): each incident's state, its detections by source, each cluster's sums.
_SEED_INCIDENTS = f"""
    select e.incident_id, i.cluster,
           (array_agg(coalesce(e.data->>'category', 'unknown') order by e.id desc)
               filter (where e.kind = 'verdict'))[1] as category,
           min(e.at) filter (where e.kind = 'detection') as first_detection,
           min(e.at) filter (where e.kind = 'action') as first_action,
           (array_agg(case when e.kind = 'stage'
                            and e.stage = '{Stage.AWAITING_APPROVAL.value}' then e.at end
                      order by e.id desc)
               filter (where e.kind in ('stage', 'approval', 'rejection')))[1] as waiting_since,
           coalesce(bool_or(e.kind = 'stage' and e.stage = '{Stage.FAILED.value}'), false)
               as failed
    from audit_events e join incidents i on i.id = e.incident_id
    where e.id <= %(upto)s and e.kind in {_KINDS}
    group by e.incident_id, i.cluster
"""
_SEED_SOURCES = """
    select incident_id, coalesce(data->>'source', 'unknown') as source, count(*) as n
    from audit_events where kind = 'detection' and id <= %(upto)s group by 1, 2
"""
_SEED_LATENCY = """
    select i.cluster, (e.data->>'detection_latency_s')::float as v
    from audit_events e join incidents i on i.id = e.incident_id
    where e.kind = 'detection' and jsonb_typeof(e.data->'detection_latency_s') = 'number'
      and e.id <= %(upto)s
"""
_SEED_LATENCY_SQL = (
    "select cluster, count(*) as count, coalesce(sum(v), 0) as total, "
    + ", ".join(
        f"count(*) filter (where v <= {b!r}) as b{i}" for i, b in enumerate(LATENCY_BUCKETS)
    )
    + f" from ({_SEED_LATENCY}) h group by cluster"
)
_SEED_ACTIONS = """
    select i.cluster, coalesce(e.data->>'step', 'unknown') as step,
           coalesce((e.data->>'changed')::boolean, false) as changed, count(*) as n
    from audit_events e join incidents i on i.id = e.incident_id
    where e.kind = 'action' and e.id <= %(upto)s group by 1, 2, 3
"""
_SEED_REFUSALS = """
    select i.cluster, coalesce(e.data->>'guard', 'unknown') as guard, count(*) as n
    from audit_events e join incidents i on i.id = e.incident_id
    where e.kind = 'guard' and not coalesce((e.data->>'allowed')::boolean, true)
      and e.id <= %(upto)s group by 1, 2
"""
FEED_PAGE = 50_000
# Ids are taken when a row is written and become visible when its transaction commits, so a
# row may appear behind a higher id already read: each read looks this many ids back again
# (rows already counted are skipped).
LOOKBACK_IDS = 2_000
DEFAULT_APPROVAL_TIMEOUT_S = 1800.0

# The clusters with incidents, by a skip scan of incidents_job (cluster, job_id).
_CLUSTERS = """
    with recursive c as (
        select min(cluster) as cluster from incidents
        union all
        select (select min(cluster) from incidents where cluster > c.cluster) from c
        where c.cluster is not null)
    select cluster from c where cluster is not null
"""


class _Histogram:
    """Cumulative buckets of observations that can also be taken back."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = buckets
        self.count = 0
        self.total = 0.0
        self.cumulative = [0] * len(buckets)

    def add(self, value: float, sign: int = 1) -> None:
        self.count += sign
        self.total += sign * value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.cumulative[i] += sign

    def row(self) -> list[float]:
        return [self.count, self.total, *self.cumulative]


@dataclass
class _Incident:
    cluster: str
    category: str = "unknown"
    sources: Counter[str] = field(default_factory=Counter)
    first_detection: datetime | None = None
    first_action: datetime | None = None
    waiting_since: datetime | None = None
    failed: bool = False

    def to_action(self) -> float | None:
        if self.first_detection is None or self.first_action is None:
            return None
        return (self.first_action - self.first_detection).total_seconds()


@dataclass
class _Cluster:
    detections: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    to_action: _Histogram = field(default_factory=lambda: _Histogram(TO_ACTION_BUCKETS))
    actions: Counter[tuple[str, str]] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    failed: int = 0


class AuditCounters:
    """The console's series, kept in memory and brought up to date at each scrape from the
    rows appended since the last (the first scrape reads the whole trail once). The same
    numbers as ``full_snapshot``, at the cost of the new rows."""

    def __init__(self, db: ConsoleDb) -> None:
        self._db = db
        self._lock = asyncio.Lock()
        self._clusters: dict[str, _Cluster] = {}
        self._incidents: dict[str, _Incident] = {}
        self._after = 0  # rows at or below this id are counted (less the look-back)
        self._recent: set[int] = set()  # ids above _after - LOOKBACK_IDS already counted
        self.rows_read = 0  # rows taken from the database in all (a bench reads it)
        self._seeded = False
        self._task: asyncio.Task[int] | None = None

    async def _seed(self) -> int:
        """The state of every row so far, aggregated by the server in one snapshot (the
        console's first scrape); how many rows it covers."""
        async with self._db.connection() as conn, conn.transaction():
            await conn.execute("set transaction isolation level repeatable read, read only")
            async with conn.cursor(row_factory=dict_row) as cur:

                async def rows(sql: str, args: dict[str, Any]) -> list[dict[str, Any]]:
                    await cur.execute(sql, args)
                    return list(await cur.fetchall())

                top = await rows(
                    "select coalesce(max(id), 0) as upto, count(*) as n from audit_events", {}
                )
                upto, covered = int(top[0]["upto"]), int(top[0]["n"])
                at = {"upto": upto}
                incidents = await rows(_SEED_INCIDENTS, at)
                sources = await rows(_SEED_SOURCES, at)
                latency = await rows(_SEED_LATENCY_SQL, at)
                actions = await rows(_SEED_ACTIONS, at)
                refusals = await rows(_SEED_REFUSALS, at)
                recent = await rows(
                    "select id from audit_events where id > %(low)s and id <= %(upto)s",
                    {"low": upto - LOOKBACK_IDS, "upto": upto},
                )
        for r in incidents:
            self._incidents[r["incident_id"]] = _Incident(
                r["cluster"],
                category=r["category"] or "unknown",
                first_detection=r["first_detection"],
                first_action=r["first_action"],
                waiting_since=r["waiting_since"],
                failed=bool(r["failed"]),
            )
        for r in sources:
            incident = self._incidents.get(r["incident_id"])
            if incident is not None:
                incident.sources[r["source"]] += int(r["n"])
        for incident in self._incidents.values():
            cl = self._clusters.setdefault(incident.cluster, _Cluster())
            for source, n in incident.sources.items():
                cl.detections[(source, incident.category)] += n
            cl.failed += incident.failed
            to_action = incident.to_action()
            if to_action is not None:
                cl.to_action.add(to_action)
        for r in latency:
            h = self._clusters.setdefault(r["cluster"], _Cluster()).latency
            h.count, h.total = int(r["count"]), float(r["total"])
            h.cumulative = [int(r[f"b{i}"]) for i in range(len(LATENCY_BUCKETS))]
        for r in actions:
            result = "done" if r["changed"] else "unchanged"
            self._clusters.setdefault(r["cluster"], _Cluster()).actions[(r["step"], result)] += int(
                r["n"]
            )
        for r in refusals:
            self._clusters.setdefault(r["cluster"], _Cluster()).refusals[r["guard"]] += int(r["n"])
        self._after = upto
        self._recent = {int(r["id"]) for r in recent}
        self._seeded = True
        self.rows_read += len(incidents) + len(sources) + len(recent)
        return covered

    async def catch_up(self) -> int:
        """Count the rows appended since the last call; how many were new. One catch-up runs
        at a time, as a task of its own that concurrent scrapes share: a scrape that gives up
        (a client's timeout during the first, long one) does not cancel it."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._catch_up())
        return await asyncio.shield(self._task)

    async def _catch_up(self) -> int:
        async with self._lock:
            new = 0
            if not self._seeded:
                new += await self._seed()
            while True:
                floor = max(0, self._after - LOOKBACK_IDS)
                rows = await self._db._rows(  # noqa: SLF001
                    _FEED, {"after": floor, "limit": FEED_PAGE}
                )
                self.rows_read += len(rows)
                fresh = [r for r in rows if int(r["id"]) not in self._recent]
                for row in fresh:
                    self._count(row)
                    self._recent.add(int(row["id"]))
                new += len(fresh)
                if rows:
                    self._after = max(self._after, int(rows[-1]["id"]))
                low = self._after - LOOKBACK_IDS
                self._recent = {i for i in self._recent if i > low}
                if len(rows) < FEED_PAGE:
                    return new

    def _count(self, row: dict[str, Any]) -> None:
        incident = self._incidents.get(row["incident_id"])
        if incident is None:
            incident = self._incidents[row["incident_id"]] = _Incident(row["cluster"])
        cl = self._clusters.setdefault(incident.cluster, _Cluster())
        kind, at = row["kind"], row["at"]
        before = incident.to_action()
        if kind == "detection":
            cl.detections[(row["source"], incident.category)] += 1
            incident.sources[row["source"]] += 1
            if row["latency"] is not None:
                cl.latency.add(float(row["latency"]))
            if incident.first_detection is None or at < incident.first_detection:
                incident.first_detection = at
        elif kind == "verdict" and row["category"] != incident.category:
            for source, n in incident.sources.items():
                cl.detections[(source, incident.category)] -= n
                cl.detections[(source, row["category"])] += n
            cl.detections = +cl.detections  # a category no detection holds is no series
            incident.category = row["category"]
        elif kind == "action":
            cl.actions[(row["step"], "done" if row["changed"] else "unchanged")] += 1
            if incident.first_action is None or at < incident.first_action:
                incident.first_action = at
        elif kind == "guard" and not row["allowed"]:
            cl.refusals[row["guard"]] += 1
        if kind in ("stage", "approval", "rejection"):
            waiting = kind == "stage" and row["stage"] == Stage.AWAITING_APPROVAL.value
            incident.waiting_since = at if waiting else None
            if kind == "stage" and row["stage"] == Stage.FAILED.value and not incident.failed:
                incident.failed = True
                cl.failed += 1
        after = incident.to_action()
        if after != before:
            if before is not None:
                cl.to_action.add(before, -1)
            if after is not None:
                cl.to_action.add(after)

    async def snapshot(
        self, clusters: list[str] | None = None, timeouts: dict[str, float] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Brought up to date, the numbers of each cluster of ``clusters`` that has incidents
        (None: every one), in ``full_snapshot``'s shape plus ``failed`` and
        ``past_half_expiry`` (approvals waiting longer than half the cluster's
        ``approval_timeout_s`` in ``timeouts``)."""
        await self.catch_up()
        names = [str(r["cluster"]) for r in await self._db._rows(_CLUSTERS)]  # noqa: SLF001
        now = datetime.now(UTC)
        waiting: dict[str, list[datetime]] = {}
        for incident in self._incidents.values():
            if incident.waiting_since is not None:
                waiting.setdefault(incident.cluster, []).append(incident.waiting_since)
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            if clusters is not None and name not in clusters:
                continue
            cl = self._clusters.get(name, _Cluster())
            half = timedelta(seconds=(timeouts or {}).get(name, DEFAULT_APPROVAL_TIMEOUT_S) / 2)
            since = waiting.get(name, [])
            out[name] = {
                "detections": [
                    {"source": s, "category": c, "n": n}
                    for (s, c), n in sorted(cl.detections.items())
                ],
                "latency": cl.latency.row(),
                "to_action": cl.to_action.row(),
                "actions": [
                    {"step": s, "result": r, "n": n} for (s, r), n in sorted(cl.actions.items())
                ],
                "pending": len(since),
                "refusals": [{"guard": g, "n": n} for g, n in sorted(cl.refusals.items())],
                "failed": cl.failed,
                "past_half_expiry": sum(1 for at in since if now - at > half),
            }
        return out


_COUNTERS: weakref.WeakKeyDictionary[ConsoleDb, AuditCounters] = weakref.WeakKeyDictionary()


def counters_of(db: ConsoleDb) -> AuditCounters:
    """The console's counters (one per database handle, made at the first scrape)."""
    counters = _COUNTERS.get(db)
    if counters is None:
        counters = _COUNTERS[db] = AuditCounters(db)
    return counters


_PROCESS = CollectorRegistry(auto_describe=False)
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    _PROCESS.register(_collector)


SNAPSHOT_TTL_S = 5.0  # several scrapers (HA Prometheus pairs) share one query


async def render(
    db: ConsoleDb,
    clusters: list[str] | None = None,
    configs: Sequence[ClusterConfig] = (),
) -> bytes:
    """The audit trail's series for ``clusters`` (None: every cluster), and the scorecards of
    the served clusters in ``configs``."""
    key = ("metrics",) if clusters is None else ("metrics", tuple(clusters))
    registry = CollectorRegistry(auto_describe=False)
    counters = counters_of(db)
    timeouts = {cl.name: cl.policy.approval_timeout_s for cl in configs}
    registry.register(
        AuditCollector(
            await db.cached(key, SNAPSHOT_TTL_S, lambda: counters.snapshot(clusters, timeouts))
        )
    )
    registry.register(ScorecardCollector(await scorecards(db, configs)))
    return generate_latest(registry) + generate_latest(_PROCESS)


async def metrics(request: Request) -> Response:
    """Prometheus text format; a viewer token (``Authorization: Bearer``) is required."""
    if authenticate(request) is None:  # a scraper, not a person: no redirect to sign-in
        return PlainTextResponse(
            "a viewer token is required", 401, headers={"www-authenticate": "Bearer"}
        )
    auth = require(request, ConsoleRole.VIEWER)
    c = console(request)
    configs = [cl.config for cl in c.served_for(auth.user)]
    body = await render(c.db, auth.user.clusters, configs) + paused_series(configs, c.pauses)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def routes() -> list[Route]:
    return [Route("/metrics", metrics, methods=["GET"])]
