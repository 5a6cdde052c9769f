"""Jobs: every job with incidents (of the clusters the user sees), and one job's lineage of
attempts with checkpoints, restarts and training time lost (on its own cluster)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from relaunch.console import kpis
from relaunch.console.routes_overview import served_in, watched_jobs
from relaunch.console.web import (
    NotFound,
    check_cluster,
    cluster_param,
    console,
    default_cluster,
    render,
    require,
    scope,
)


async def jobs_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    shown = scope(request, auth)
    jobs, (watched, jobs_error) = await asyncio.gather(
        c.db.jobs(clusters=shown), watched_jobs(c, shown)
    )
    return render(
        request,
        "jobs.html",
        auth,
        jobs=jobs,
        watched=watched,
        jobs_error=jobs_error,
        watched_clusters=[cl.name for cl in served_in(c, shown)],
    )


async def job_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    job_id = request.path_params["job_id"]
    cluster = cluster_param(request, auth) or default_cluster(c, auth)
    check_cluster(auth, cluster)
    chain = await c.db.lineage(cluster, job_id)
    attempts = await c.db.attempts(cluster, chain)
    if not attempts:
        raise NotFound(f"no incidents for job {job_id!r} on cluster {cluster!r}")
    now = datetime.now(UTC)
    times = [
        kpis.IncidentTimes(
            incident_id=a.id,
            fault_at=a.fault_at,
            detected_at=a.fault_at,
            running_at=a.running_at,
            closed=a.closed,
        )
        for a in attempts
    ]
    return render(
        request,
        "job.html",
        auth,
        job_id=job_id,
        cluster=cluster,
        lineage=chain,
        attempts=attempts,
        restarts=sum(a.restarts for a in attempts),
        time_lost_s=kpis.time_lost(times, now),
        checkpoints=[a.checkpoint_step for a in attempts if a.checkpoint_step is not None],
    )
