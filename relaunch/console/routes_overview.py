"""The overview (`/`) and its live fragment: clusters, watched jobs, open incidents, pending
approvals, and KPIs with charts over a chosen window."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from relaunch.connectors.audit import IncidentRow
from relaunch.console import charts, kpis
from relaunch.console.queries import bucket_for
from relaunch.console.web import Auth, Console, Problem, console, render, require
from relaunch.models.errors import RelaunchError
from relaunch.models.scheduler import Job, watched

SCHEDULER_TIMEOUT_S = 3.0
# Window-wide KPIs over up to 30 days of rows; open incidents and approvals are always fresh.
KPI_TTL_S = 15.0


class Pending(BaseModel):
    """An incident waiting for a decision, with how long it has waited and when it expires."""

    incident: IncidentRow
    age_s: float
    expires_at: datetime | None
    expires_in_s: float | None


def pending_view(c: Console, rows: list[IncidentRow], now: datetime) -> list[Pending]:
    timeout = timedelta(seconds=c.config.policy.approval_timeout_s)
    out = []
    for row in rows:
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


async def watched_jobs(c: Console) -> tuple[list[Job], str | None]:
    """The jobs the watcher would watch (opted in, or in a watched partition), or why not."""
    sched = c.services.scheduler
    if sched is None:
        return [], "no scheduler configured for the console"
    try:
        jobs = await asyncio.wait_for(sched.list_jobs(), SCHEDULER_TIMEOUT_S)
    except (RelaunchError, TimeoutError) as exc:
        return [], f"Slurm does not answer: {exc}"
    watch = c.config.watch
    return [
        j
        for j in jobs
        if watched(
            j, c.config.name, partitions=watch.partitions, opt_in_comment=watch.opt_in_comment
        )
    ], None


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


async def live_context(c: Console, now: datetime) -> dict[str, Any]:
    open_, pending = await asyncio.gather(c.db.open_incidents(), c.db.pending_approvals())
    return {"open_incidents": open_, "pending": pending_view(c, pending, now), "now": now}


async def window_kpis(
    c: Console, window: str, since: datetime, bucket: str
) -> tuple[kpis.Kpis, list[tuple[datetime, int]]]:
    categories, latencies, times, restarts, over_time = await asyncio.gather(
        c.db.categories(since),
        c.db.detection_latencies(since),
        c.db.incident_times(since),
        c.db.restarts(since),
        c.db.incidents_over_time(since, bucket),
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
    now = datetime.now(UTC)
    since = now - span
    bucket = bucket_for(span)
    live, clusters, recent, (jobs, jobs_error) = await asyncio.gather(
        live_context(c, now), c.db.clusters(), c.db.recent_incidents(15), watched_jobs(c)
    )
    summary, over_time = await c.db.cached(
        ("kpis", window), KPI_TTL_S, lambda: window_kpis(c, window, since, bucket)
    )
    return render(
        request,
        "overview.html",
        auth,
        **live,
        window=window,
        windows=list(kpis.WINDOWS),
        clusters=clusters,
        recent=recent,
        jobs=jobs,
        jobs_error=jobs_error,
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
    return render(request, "_overview_live.html", auth, **await live_context(c, datetime.now(UTC)))
