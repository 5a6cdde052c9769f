"""The overview (`/`) and its live fragment: clusters, watched jobs, open incidents, pending
approvals, and KPIs with charts over a chosen window; each over the clusters the user sees
(narrowed by ``?cluster=``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from relaunch.console import charts, kpis
from relaunch.console.queries import Clusters, PendingRow, bucket_for
from relaunch.console.web import (
    Auth,
    Cluster,
    Console,
    Problem,
    cluster_param,
    console,
    render,
    require,
    scope,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.scheduler import Job, watched

SCHEDULER_TIMEOUT_S = 3.0
# Window-wide KPIs over up to 30 days of rows; open incidents and approvals are always fresh.
KPI_TTL_S = 15.0


class Pending(BaseModel):
    """An incident waiting for a decision, with how long it has waited and when it expires."""

    incident: PendingRow
    age_s: float
    expires_at: datetime | None
    expires_in_s: float | None


class WatchedJob(BaseModel):
    """A job the watcher of a served cluster watches."""

    cluster: str
    job: Job


def pending_view(c: Console, rows: list[PendingRow], now: datetime) -> list[Pending]:
    out = []
    for row in rows:
        timeout = timedelta(seconds=c.config_of(row.cluster).policy.approval_timeout_s)
        since = row.stage_at or row.created_at
        expires = since + timeout
        out.append(
            Pending(
                incident=row,
                age_s=(now - since).total_seconds(),
                expires_at=expires,
                expires_in_s=(expires - now).total_seconds(),
            )
        )
    return out


async def _watched_on(cl: Cluster) -> tuple[list[WatchedJob], str | None]:
    sched = cl.services.scheduler
    if sched is None:
        return [], "no scheduler configured for the console"
    try:
        jobs = await asyncio.wait_for(sched.list_jobs(), SCHEDULER_TIMEOUT_S)
    except (RelaunchError, TimeoutError) as exc:
        return [], f"Slurm does not answer: {exc}"
    watch = cl.config.watch
    return [
        WatchedJob(cluster=cl.name, job=j)
        for j in jobs
        if watched(j, cl.name, partitions=watch.partitions, opt_in_comment=watch.opt_in_comment)
    ], None


def served_in(c: Console, clusters: Clusters) -> list[Cluster]:
    """The served clusters a list covers (all of them for None)."""
    return [cl for cl in c.clusters.values() if clusters is None or cl.name in clusters]


async def watched_jobs(
    c: Console, clusters: Clusters = None
) -> tuple[list[WatchedJob], str | None]:
    """The jobs the watchers of the served clusters in ``clusters`` would watch (opted in, or
    in a watched partition), or why not (each cluster's reason named when several are served)."""
    served = served_in(c, clusters)
    answers = await asyncio.gather(*(_watched_on(cl) for cl in served))
    jobs = [j for found, _ in answers for j in found]
    errors = [
        f"{cl.name}: {error}" if c.several else error
        for cl, (_, error) in zip(served, answers, strict=True)
        if error
    ]
    return jobs, "; ".join(errors) or None


def _buckets(
    counts: list[tuple[datetime, int]], since: datetime, now: datetime, bucket: str
) -> list[tuple[str, float]]:
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    start = since.replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        start = start.replace(hour=0)
    by = {b.astimezone(UTC).replace(tzinfo=None): n for b, n in counts}
    out: list[tuple[str, float]] = []
    t = start.astimezone(UTC).replace(tzinfo=None)
    end = now.astimezone(UTC).replace(tzinfo=None)
    fmt = "%m-%d %H:00" if bucket == "hour" else "%Y-%m-%d"
    while t <= end:
        out.append((t.strftime(fmt), float(by.get(t, 0))))
        t += step
    return out


async def live_context(c: Console, now: datetime, clusters: Clusters = None) -> dict[str, Any]:
    open_, pending = await asyncio.gather(
        c.db.open_incidents(clusters=clusters), c.db.pending_approvals(clusters)
    )
    return {"open_incidents": open_, "pending": pending_view(c, pending, now), "now": now}


async def window_kpis(
    c: Console, window: str, since: datetime, bucket: str, clusters: Clusters = None
) -> tuple[kpis.Kpis, list[tuple[datetime, int]]]:
    categories, latencies, times, restarts, over_time = await asyncio.gather(
        c.db.categories(since, clusters),
        c.db.detection_latencies(since, clusters),
        c.db.incident_times(since, clusters),
        c.db.restarts(since, clusters),
        c.db.incidents_over_time(since, bucket, clusters),
    )
    summary = kpis.compute(
        window,
        by_category=categories,
        detection_latencies=latencies,
        times=times,
        restarts=restarts,
        now=datetime.now(UTC),
    )
    return summary, over_time


async def overview(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    try:
        window, span = kpis.parse_window(request.query_params.get("window"))
    except kpis.BadWindowError as exc:
        raise Problem(str(exc)) from exc
    wanted = cluster_param(request, auth)
    shown = [wanted] if wanted else auth.user.clusters
    now = datetime.now(UTC)
    since = now - span
    bucket = bucket_for(span)
    live, clusters, recent, (jobs, jobs_error) = await asyncio.gather(
        live_context(c, now, shown),
        c.db.clusters(shown),
        c.db.recent_incidents(15, shown),
        watched_jobs(c, shown),
    )
    summary, over_time = await c.db.cached(
        ("kpis", window, tuple(shown) if shown is not None else None),
        KPI_TTL_S,
        lambda: window_kpis(c, window, since, bucket, shown),
    )
    return render(
        request,
        "overview.html",
        auth,
        **live,
        window=window,
        windows=list(kpis.WINDOWS),
        cluster_filter=wanted or "",
        clusters=clusters,
        recent=recent,
        jobs=jobs,
        jobs_error=jobs_error,
        watched_clusters=[cl.name for cl in served_in(c, shown)],
        kpis=summary,
        category_chart=charts.hbar_chart(
            list(summary.by_category.items()),
            title=f"incidents by category, last {window}",
            test_id="chart-categories",
        ),
        time_chart=charts.column_chart(
            _buckets(over_time, since, now, bucket),
            title=f"incidents per {bucket}, last {window}",
            test_id="chart-incidents",
        ),
    )


async def incidents_fragment(request: Request) -> Response:
    auth: Auth = require(request)
    c = console(request)
    live = await live_context(c, datetime.now(UTC), scope(request, auth))
    return render(request, "_overview_live.html", auth, **live)
