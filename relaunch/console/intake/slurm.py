"""``POST /intake/slurm``: what deploy/hooks/relaunch-notify-slurm.sh posts from strigger or an
Epilog. Any intake token may post here, so an event becomes a ``scheduler`` detection only where
a fresh read of Slurm bears it out (docs/trust.md, "Intakes")."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relaunch.console.intake.common import (
    IntakeRefused,
    Target,
    addressed,
    already_delivered,
    candidates,
    cluster_jobs,
    deliver_all,
    limit,
    make_detection,
    parse_model,
    record_row,
    refusal_response,
    unavailable,
    undated_key,
)
from relaunch.console.web import Cluster
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import (
    SlurmEventKind,
    SlurmHookEvent,
)
from relaunch.models.intake import intake_incident as intake_incident  # where intake rows go
from relaunch.models.recovery import DetectionSource
from relaunch.models.scheduler import Job, JobState, NodeFlag

log = logging.getLogger("relaunch.console.intake.slurm")


async def slurm(request: Request) -> Response:
    try:
        c, user, cl, raw = await addressed(request)
        event: SlurmHookEvent = parse_model(SlurmHookEvent, raw)
        if event.event is SlurmEventKind.JOB_END and event.job_id is None:
            raise IntakeRefused(422, "a job_end event needs job_id", "job_id")
        if event.event is not SlurmEventKind.JOB_END and event.node is None:
            raise IntakeRefused(422, f"a {event.event.value} event needs node", "node")
        limit(request, c, user, 1)
    except IntakeRefused as exc:
        return refusal_response(exc)
    parts = [event.event.value, event.node or "-", event.job_id or "-", event.state or "-"]
    when = event.time.isoformat() if event.time else undated_key(event.model_dump_json())
    key = f"slurm:{':'.join(parts)}:{when}"
    summary = (
        f"slurm {event.event.value}"
        + (f" {event.node}" if event.node else "")
        + (f" job {event.job_id}" if event.job_id else "")
        + (f" {event.state}" if event.state else "")
    )
    entry: dict[str, object] = {"event": event.event.value}
    try:
        entry["recorded"] = await record_row(
            c,
            cl,
            summary,
            key,
            {"source": "slurm_hook", **event.model_dump(mode="json")},
            [event.node] if event.node else [],
        )
        if await already_delivered(c, cl, key):
            entry["note"] = "already delivered"
            return JSONResponse(entry)
        if event.event is SlurmEventKind.JOB_END:
            state = JobState.parse(event.state)
            if not state.is_abnormal_end:
                entry["note"] = f"job ended {event.state or 'without a state'}: recorded, no action"
                return JSONResponse(entry)
            kind = f"slurm_hook:job_end:{state.value}"
        else:
            kind = f"slurm_hook:{event.event.value}"
        jobs = await cluster_jobs(cl)
        doubt = await _not_borne_out(cl, event, jobs)
        if doubt is not None:
            # Any intake token may post here: what it says becomes a scheduler detection only
            # when Slurm's own fresh view says the same (docs/trust.md, "Intakes").
            log.info("intake from slurm not borne out by Slurm: %s", doubt)
            entry["note"] = f"not borne out by Slurm's own view ({doubt}): recorded, no action"
            return JSONResponse(entry)
        found = candidates(cl, jobs, event.node, event.job_id)
        targets = [
            Target(
                detection=make_detection(
                    cl,
                    job,
                    nodes if event.event is not SlurmEventKind.JOB_END else [],
                    DetectionSource.SCHEDULER,
                    kind,
                    summary,
                    event.time,
                ),
                source_key=key,
            )
            for job, nodes in found
        ]
        entry["detections"] = await deliver_all(c, cl, key, targets, summary)
    except RelaunchError as exc:
        log.warning("intake from slurm not delivered: %s", exc.message)
        return unavailable(f"not delivered, retry later: {exc.message}")
    except Exception as exc:
        log.warning("intake from slurm not delivered: %s", type(exc).__name__)
        return unavailable(f"not delivered, retry later: {type(exc).__name__}")
    return JSONResponse(entry)


async def _not_borne_out(cl: Cluster, event: SlurmHookEvent, jobs: list[Job]) -> str | None:
    """Why Slurm's own fresh view does not bear the hook's event out, or None when it does: a
    job that ended abnormally in Slurm's listing (not the state the sender claims), a node Slurm
    lists down, failed or not responding. The sender may be any intake token."""
    if event.event is SlurmEventKind.JOB_END:
        job = next((j for j in jobs if j.job_id == event.job_id), None)
        if job is None or job.state.is_abnormal_end:
            return None  # gone from the listing: no watched job to deliver to anyway
        return f"Slurm lists job {job.job_id} {job.state.value}"
    assert cl.services.scheduler is not None  # cluster_jobs checked it
    name = event.node or ""
    nodes = {n.name: n for n in await cl.services.scheduler.list_nodes()}
    node = nodes.get(name) or nodes.get(name.split(".")[0])
    if node is None:
        return f"Slurm lists no node {name}"
    if not node.responding or NodeFlag.FAIL in node.flags:
        return None
    return f"Slurm lists {node.name} {node.display_state}"
