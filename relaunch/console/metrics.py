"""``GET /metrics``: Prometheus metrics computed from the audit trail at scrape time.

Counts come from the trail, not from process memory, so they survive restarts and agree with
the console's pages. One SQL statement answers every series (aggregates only: the scrape's cost
grows with the trail's size, not with the number of series), plus the process's own metrics.
A token limited to some clusters scrapes the series of those clusters' incidents only.
The scorecard's series (each served cluster's, from its own query) are in scorecard_metrics.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


async def snapshot(db: ConsoleDb, clusters: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every series' numbers for each cluster of ``clusters`` that has incidents (None: every
    cluster), one statement per cluster."""
    rows = await db._rows("select distinct cluster from incidents order by 1")  # noqa: SLF001
    names = [str(r["cluster"]) for r in rows if clusters is None or r["cluster"] in clusters]
    snapshots: dict[str, dict[str, Any]] = {}
    for name in names:
        row = await db._one(SCOPED_SNAPSHOT_SQL, {"clusters": [name]})  # noqa: SLF001
        assert row is not None
        snapshots[name] = row
    return snapshots


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
    registry.register(
        AuditCollector(await db.cached(key, SNAPSHOT_TTL_S, lambda: snapshot(db, clusters)))
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
