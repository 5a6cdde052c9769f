"""What every intake shares: the sender's token and cluster, the body read as it streams (413
past MAX_BODY), the sender's rate (429 with Retry-After: limits.py), the audit rows of kind
``intake`` under the cluster's ``intake-<cluster>`` record, and delivery as detections through
signal-with-start (a retry of something already delivered is recorded once and delivered
once; a failure to look jobs up or to reach Temporal answers 503, so the sender retries)."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from relaunch.console.auth import ConsoleRole, User
from relaunch.console.intake.limits import IntakeLimits, retry_after
from relaunch.console.web import Cluster, Console, console
from relaunch.models.errors import InvalidNameError, RelaunchError
from relaunch.models.intake import intake_incident as intake_incident  # where intake rows go
from relaunch.models.names import cluster_name
from relaunch.models.recovery import AuditRecord, Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, watched

log = logging.getLogger("relaunch.console.intake")


MAX_BODY = 1 << 20
MAX_ALERTS = 200  # alerts of one Alertmanager notification (its webhook's max_alerts)
# An event that says no time is deduplicated by its content within this many seconds.
UNDATED_WINDOW_S = 600


class IntakeRefused(Exception):
    """A request refused before anything was recorded: a 4xx with the offending field."""

    def __init__(
        self, status: int, error: str, field: str | None, retry_after: str | None = None
    ) -> None:
        super().__init__(error)
        self.status, self.error, self.field = status, error, field
        self.retry_after = retry_after


class Target(BaseModel):
    """One detection to deliver, with what the response reports about it."""

    detection: Detection
    source_key: str


def refusal_response(exc: IntakeRefused) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    if exc.retry_after is not None:
        headers = {"retry-after": exc.retry_after}
    return JSONResponse(
        {"error": exc.error, "field": exc.field}, status_code=exc.status, headers=headers
    )


def unavailable(error: str) -> JSONResponse:
    return JSONResponse({"error": error, "field": None}, status_code=503)


def authorize(request: Request, c: Console, role: ConsoleRole = ConsoleRole.INTAKE) -> User:
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("bearer "):
        raise IntakeRefused(401, f"an {role.value} bearer token is required", "authorization")
    user = c.tokens.authenticate(header[7:])
    if user is None:
        raise IntakeRefused(401, "unknown or revoked token", "authorization")
    if not user.can(role):
        what = {
            ConsoleRole.INTAKE: "an intake sender",
            ConsoleRole.AGENT: "a node's agent",
        }.get(role, "a repair sender")
        raise IntakeRefused(
            403, f"{user.name} is a {user.role}, not {what} (this takes a {role.value} token)", None
        )
    return user


def limit(request: Request, c: Console, user: User, events: int) -> None:
    """Spend ``events`` of the sender's allowance (limits.py), or refuse the request
    whole with 429 and a Retry-After, before anything is recorded."""
    state = request.app.state
    limits: IntakeLimits | None = getattr(state, "intake_limits", None)
    if limits is None:
        settings = c.config.console
        limits = IntakeLimits(settings.intake_events_per_minute, settings.intake_burst)
        state.intake_limits = limits
    wait = limits.take(user.sha256, events)
    if wait is not None:
        raise IntakeRefused(
            429,
            f"{user.name} sent more than {limits.per_minute} events a minute (burst "
            f"{limits.burst}): nothing of this request was recorded; retry after "
            f"{retry_after(wait)}s",
            None,
            retry_after(wait),
        )


def undated_key(content: str) -> str:
    """The dedupe key part of an event that says no time: its content within the
    UNDATED_WINDOW_S of its receipt (a retry lands once; the same event much later counts)."""
    window = int(datetime.now(UTC).timestamp() // UNDATED_WINDOW_S)
    return f"undated:{window}:{hashlib.sha256(content.encode()).hexdigest()[:20]}"


def target_cluster(request: Request, c: Console, user: User, named: object = None) -> Cluster:
    """The served cluster a request is for: ``?cluster=``, else the body's ``named`` cluster,
    else the primary; refused unless the sender's token covers it."""
    query = request.query_params.get("cluster", "").strip()
    if named is not None and not isinstance(named, str):
        raise IntakeRefused(422, "cluster must be a string", "cluster")
    if query and named and query != named:
        raise IntakeRefused(
            422, f"the query names cluster {query!r}, the body {named!r}", "cluster"
        )
    try:
        name = cluster_name(query or named or c.config.name)
    except InvalidNameError as exc:
        raise IntakeRefused(422, exc.message, "cluster") from exc
    if not user.sees(name):
        raise IntakeRefused(403, f"{user.name} may push signals for {user.scope} only", "cluster")
    target = c.clusters.get(name)
    if target is None:
        raise IntakeRefused(422, f"this console does not serve cluster {name!r}", "cluster")
    return target


async def json_body(request: Request) -> Any:
    """The body, read as it streams in and refused (413) as soon as it passes MAX_BODY: a
    chunked body declares no length, and is never read whole before its size is known."""
    body = await read_body(request)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntakeRefused(400, f"body is not valid JSON: {exc}", "body") from exc


async def read_body(request: Request) -> bytes:
    """The raw body, read as it streams in, refused (413) as soon as it passes MAX_BODY."""
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError as exc:
        raise IntakeRefused(400, "content-length is not a number", "content-length") from exc
    if declared > MAX_BODY:
        raise IntakeRefused(413, f"body larger than {MAX_BODY} bytes", "body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise IntakeRefused(413, f"body larger than {MAX_BODY} bytes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


async def addressed(
    request: Request, role: ConsoleRole = ConsoleRole.INTAKE
) -> tuple[Console, User, Cluster, Any]:
    """What every intake of one event shape starts with: the sender's token checked (of
    ``role``), the JSON body read, and the cluster it is for (its ``cluster`` field, else
    ``?cluster=``, else the primary) checked against the token's scope; the body without
    ``cluster``. Raises IntakeRefused."""
    c = console(request)
    user = authorize(request, c, role)
    raw = await json_body(request)
    named = raw.pop("cluster", None) if isinstance(raw, dict) else None
    return c, user, target_cluster(request, c, user, named), raw


def refused(exc: ValidationError, status: int = 422, unknown: str | None = None) -> IntakeRefused:
    """A body's first validation error as a refusal naming its field: a missing field said so,
    an unknown one with ``unknown`` (what the body takes) when given."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "body"
    msg = str(first["msg"]).removeprefix("Value error, ")
    if unknown is not None and first["type"] == "extra_forbidden":
        msg = f"unknown field {field!r}: {unknown}"
    elif unknown is not None and first["type"] == "missing":
        msg = f"{field} is required"
    return IntakeRefused(status, msg, field)


def parse_model(model: type[BaseModel], raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise IntakeRefused(422, "body must be a JSON object", "body")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise refused(exc) from exc


def trim(value: str, limit: int = 300) -> str:
    return value if len(value) <= limit else value[:limit] + "…"


def is_watched(cl: Cluster, job: Job) -> bool:
    w = cl.config.watch
    return watched(job, cl.name, partitions=w.partitions, opt_in_comment=w.opt_in_comment)


def on_node(job: Job, node: str) -> str | None:
    """The job's node that ``node`` names (as is, or a FQDN's first label)."""
    if node in job.nodes:
        return node
    short = node.split(".")[0]
    return short if short in job.nodes else None


async def cluster_jobs(cl: Cluster) -> list[Job]:
    if cl.services.scheduler is None:
        raise RelaunchError(f"the console has no scheduler to look jobs up on {cl.name}")
    return await cl.services.scheduler.list_jobs()


def candidates(
    cl: Cluster, jobs: list[Job], node: str | None, job_id: str | None
) -> list[tuple[Job, list[str]]]:
    """Watched jobs the signal concerns, each with the nodes to name in the detection."""
    found: list[tuple[Job, list[str]]] = []
    for job in jobs:
        if not is_watched(cl, job):
            continue
        on = on_node(job, node) if node else None
        if job_id is not None:
            if job.job_id == job_id:
                found.append((job, [on] if on else []))
        elif on and (job.state is JobState.RUNNING or job.state.is_abnormal_end):
            found.append((job, [on]))
    return found


async def record_row(
    c: Console,
    cl: Cluster,
    summary: str,
    key: str | None,
    data: dict[str, object],
    nodes: list[str],
    kind: str = "intake",
) -> bool:
    store = c.db.store
    incident = intake_incident(cl.name)
    async with c.db.connection():  # the schema is there (checked on the console's first use)
        pass
    await store.ensure_incident(incident, cl.name, "intake", 0)
    return await store.record(
        AuditRecord(
            incident_id=incident,
            kind=kind,
            at=datetime.now(UTC),
            actor="intake",
            nodes=nodes,
            summary=summary,
            data=data,
        ),
        dedupe_key=f"{incident}:{key}" if key else None,
    )


async def already_delivered(c: Console, cl: Cluster, key: str) -> bool:
    return await c.db.store.has_dedupe_key(f"{intake_incident(cl.name)}:{key}:delivered")


async def deliver_all(
    c: Console, cl: Cluster, key: str, targets: list[Target], summary: str
) -> list[dict[str, object]]:
    """Deliver every detection through this cluster's own delivery, then mark the signal
    delivered (a retry after a failure delivers again: signal-with-start joins the recovery
    already started)."""
    deliver = cl.services.deliver
    if deliver is None:
        raise RelaunchError("the console cannot reach Temporal (no delivery configured)")
    results: list[dict[str, object]] = []
    for target in targets:
        det = target.detection
        if det.cluster != cl.name:  # built from cl's own jobs: never another cluster's
            raise RelaunchError(f"a detection for {det.cluster} reached {cl.name}'s delivery")
        started = await deliver(det)
        results.append(
            {
                "job_id": det.job_id,
                "workflow_id": det.workflow_id,
                "kind": det.kind,
                "started": started,
            }
        )
        log.info(
            "intake %s -> %s (%s)", det.kind, det.workflow_id, "started" if started else "joined"
        )
    await record_row(c, cl, f"delivered: {summary}", f"{key}:delivered", {"delivered": results}, [])
    return results


def make_detection(
    cl: Cluster,
    job: Job,
    nodes: list[str],
    source: DetectionSource,
    kind: str,
    text: str,
    fault_time: datetime | None,
) -> Detection:
    return Detection(
        cluster=cl.name,
        job_id=job.job_id,
        attempt=job.restart_count,
        source=source,
        kind=kind,
        text=trim(text, 500),
        nodes=nodes,
        fault_time=fault_time,
        detected_at=datetime.now(UTC),
        submitted_at=job.submit_time,
    )
