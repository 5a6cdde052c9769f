"""Node-health events pushed in: ``POST /intake/health``.

Takes NVSentinel's ``HealthEvent`` as protojson writes it (one event, or ``HealthEvents`` with
``events``) and a generic shape for any other health checker (relaunch/models/intake.py). It
follows the other intake routes (intake.py): an intake token, one cluster per request, the
request checked whole (body, fields, the sender's rate) before each event is recorded (an
audit row of kind ``health_event`` under ``intake-<cluster>``, with its sender and whether the
sender's token is trusted with health events), then delivered by signal-with-start to the
recovery of every watched job running on the event's node; 503 when Slurm or Temporal does not
answer, so the sender retries, and a retry of the same event (same sender, node, content and
time; without a time, the same content within ten minutes) is recorded and delivered once.

Only a fatal, unhealthy event starts anything; a healthy or non-fatal one, or one NVSentinel
marks ``STORE_ONLY``, is recorded only. Whether the event convicts its node is the token's
``trusted_health`` (relaunch/console/auth.py): a trusted sender's event is a detection of source
``health_event`` and trusted evidence in the recovery's bundle (``health.jsonl``); any other
sender's points at the node and never convicts it (``health-untrusted.jsonl``; docs/trust.md).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relaunch.console.auth import User
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
    record_row,
    refusal_response,
    refused,
    trim,
    unavailable,
    undated_key,
)
from relaunch.console.web import Cluster, Console
from relaunch.detection.health_events import xid_codes
from relaunch.models.bundle import HealthReport
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import (
    GenericHealthEvent,
    HealthEvent,
    NvSentinelHealthEvent,
    NvSentinelHealthEvents,
    row_nodes,
)
from relaunch.models.recovery import DetectionSource
from relaunch.models.scheduler import Job

log = logging.getLogger("relaunch.console.intake")

HEALTH_KIND = "health_event"
M = TypeVar("M", bound=BaseModel)
_WORD = re.compile(r"[^A-Za-z0-9_.:-]+")
_SHAPES = (
    "a health event is NVSentinel's HealthEvent (nodeName, componentClass, errorCode, "
    "recommendedAction, isFatal, ...) or the generic shape (node, is_fatal, component, "
    "error_code, message, recommended_action, is_healthy, time, source)"
)


def parse_health(raw: Any) -> list[HealthEvent]:
    """The events of a request body: NVSentinel's ``HealthEvents`` (``events``), one
    ``HealthEvent`` (``nodeName``), or the generic shape. A 422 names the field at fault."""
    if not isinstance(raw, dict):
        raise IntakeRefused(422, "body must be a JSON object", "body")
    if "events" in raw:
        return list(_validate(NvSentinelHealthEvents, raw).events)
    if "nodeName" in raw:
        return [_validate(NvSentinelHealthEvent, raw)]
    return [_validate(GenericHealthEvent, raw)]


def _validate(model: type[M], raw: dict[str, Any]) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise refused(exc, 422, _SHAPES) from exc


def event_key(report: HealthReport) -> str:
    """The dedupe key of an event: a retry of it (same sender, node, content and time) lands
    once. An event that says no time is one by its content within the intake's undated window
    (intake.undated_key): the same words sent again and again are stored once."""
    content = report.model_dump_json()
    if report.time is None:
        return f"health:{report.node}:{undated_key(content)}"
    digest = hashlib.sha256(content.encode()).hexdigest()[:20]
    return f"health:{report.node}:{report.time.isoformat()}:{digest}"


def describe(report: HealthReport) -> str:
    """One line for the audit trail and the detection."""
    state = "healthy" if report.is_healthy else "fatal" if report.is_fatal else "not fatal"
    codes = ",".join(report.error_codes[:4])
    parts = [
        f"health event {report.node}",
        report.component or None,
        report.check or None,
        f"[{codes}]" if codes else None,
        f"({state}, {report.recommended_action})",
        f"from {report.sender}" + ("" if report.trusted else " (untrusted)"),
    ]
    head = " ".join(p for p in parts if p)
    return trim(f"{head}: {report.message}" if report.message else head)


def _detection_kind(report: HealthReport) -> str:
    name = _WORD.sub("_", report.check or report.component or "event").strip("_")
    return f"health:{name[:64] or 'event'}"


def _row(report: HealthReport, event: HealthEvent, user: User) -> dict[str, object]:
    return {
        "source": "health",
        "shape": "nvsentinel" if isinstance(event, NvSentinelHealthEvent) else "generic",
        "sender": user.name,
        "trusted": user.trusted_health,
        "store_only": event.store_only,
        "report": report.model_dump(mode="json"),
    }


async def _one(
    c: Console,
    cl: Cluster,
    user: User,
    event: HealthEvent,
    jobs: Callable[[], Awaitable[list[Job]]],
) -> dict[str, object]:
    """Record one event, then deliver it where it should start or join recoveries."""
    report = event.report(sender=user.name, trusted=user.trusted_health)
    key, summary = event_key(report), describe(report)
    entry: dict[str, object] = {
        "node": report.node,
        "trusted": report.trusted,
        "recorded": await record_row(
            c, cl, summary, key, _row(report, event, user), row_nodes(report.node), kind=HEALTH_KIND
        ),
    }
    if report.is_healthy or not report.is_fatal:
        entry["note"] = f"{'healthy' if report.is_healthy else 'not fatal'}: recorded, no action"
        return entry
    if event.store_only:
        entry["note"] = "processingStrategy STORE_ONLY: recorded, no action"
        return entry
    if await already_delivered(c, cl, key):
        entry["note"] = "already delivered"
        return entry
    source = (
        DetectionSource.HEALTH_EVENT if report.trusted else DetectionSource.UNTRUSTED_HEALTH_EVENT
    )
    codes = xid_codes(report)
    found = candidates(cl, await jobs(), report.node, None)
    targets = [
        Target(
            detection=make_detection(
                cl, job, nodes, source, _detection_kind(report), summary, report.time
            ).model_copy(update={"signature": f"xid_{codes[0]}" if codes else HEALTH_KIND}),
            source_key=key,
        )
        for job, nodes in found
        # An untrusted sender's event points, like an alert: it joins the recovery of a job
        # that ended abnormally, and never by itself restarts one that still runs.
        if report.trusted or job.state.is_abnormal_end
    ]
    pointed = [
        job.job_id for job, _ in found if not report.trusted and not job.state.is_abnormal_end
    ]
    entry["detections"] = await deliver_all(c, cl, key, targets, summary)
    if pointed:
        entry["pointed"] = pointed
        entry["note"] = (
            f"points at job {', '.join(pointed)}, still running: recorded, no action (an "
            "untrusted sender's event alone restarts no running job)"
        )
    elif not targets:
        entry["note"] = f"no watched job runs on {report.node}: recorded, no action"
    return entry


async def health(request: Request) -> Response:
    try:
        c, user, cl, raw = await addressed(request)
        events = parse_health(raw)
        limit(request, c, user, len(events))
    except IntakeRefused as exc:
        return refusal_response(exc)
    listed: list[Job] | None = None

    async def jobs() -> list[Job]:  # one listing for all the events of a request
        nonlocal listed
        listed = listed if listed is not None else await cluster_jobs(cl)
        return listed

    report: list[dict[str, object]] = []
    try:
        for event in events:
            report.append(await _one(c, cl, user, event, jobs))
    except RelaunchError as exc:
        log.warning("health event not delivered: %s", exc.message)
        return unavailable(f"not delivered, retry later: {exc.message}")
    except Exception as exc:  # Temporal unreachable, RPC errors: the sender retries on 5xx
        log.warning("health event not delivered: %s", type(exc).__name__)
        return unavailable(f"not delivered, retry later: {type(exc).__name__}")
    return JSONResponse({"accepted": len(events), "trusted": user.trusted_health, "events": report})


def routes() -> list[Route]:
    return [Route("/intake/health", health, methods=["POST"])]
