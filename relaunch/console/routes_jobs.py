"""Jobs: every job with incidents, and one job's lineage of attempts with checkpoints,
restarts and training time lost."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from relaunch.console import kpis
from relaunch.console.routes_overview import watched_jobs
from relaunch.console.web import NotFound, console, render, require


async def jobs_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    jobs, (watched, jobs_error) = await asyncio.gather(c.db.jobs(), watched_jobs(c))
    return render(request, "jobs.html", auth, jobs=jobs, watched=watched, jobs_error=jobs_error)


async def job_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    job_id = request.path_params["job_id"]
    cluster = request.query_params.get("cluster") or c.config.name
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
