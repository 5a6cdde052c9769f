"""Signals pushed in: ``POST /intake/alertmanager``, ``POST /intake/slurm`` and the repair
system's callback ``POST /intake/repair`` (node-health events, ``POST /intake/health``, are in
intake_health.py, with the same helpers).

Each request is addressed to one cluster the console serves (``?cluster=NAME``, or a Slurm
event's ``cluster`` field; the primary cluster by default) and handled with that cluster's own
configuration, scheduler and Temporal delivery only, so that a signal for one cluster never
starts or joins a recovery on another; an intake token limited to some clusters may address only
those. A request is checked whole before anything of it is stored: the token (intake; the
repair callback's own role, repair), the body (read as it streams, 413 past MAX_BODY), every
field, and the sender's rate (429 with Retry-After: intake_limits.py). Each accepted request is
then recorded (audit rows of kind ``intake``, against the cluster's ``intake-<cluster>``
record), turned into detections for the watched jobs it concerns and delivered through
signal-with-start. A failure to look the jobs up or to reach Temporal answers 503, so the sender
retries; a retry of something already delivered (same alert fingerprint and start, the same
Slurm event; one without a time by its content) is recorded once and delivered once.

An Alertmanager alert points and never convicts (docs/trust.md): a detection of source
``alert`` only for a job that already ended abnormally; a job still running is left alone.

A repair callback says that a node its lifecycle sent to repair is repaired: the lifecycle that
waits for it is signalled (`returned`, as `relaunch nodes returned`) and validates the node
before it returns it to service (docs/lifecycle.md). It answers 202 with that lifecycle's id,
404 when no lifecycle of the node runs, 409 when the node's lifecycle is not waiting for a
repair (it is still checking the node, or already validating it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relaunch.console.auth import ConsoleRole, User
from relaunch.console.intake_limits import IntakeLimits, retry_after
from relaunch.console.web import Cluster, Console, console
from relaunch.models.errors import InvalidNameError, RelaunchError
from relaunch.models.intake import (
    Alert,
    AlertmanagerPayload,
    AlertStatus,
    SlurmEventKind,
    SlurmHookEvent,
)
from relaunch.models.intake import intake_incident as intake_incident  # where intake rows go
from relaunch.models.lifecycle import NoLifecycleError, RepairReturn
from relaunch.models.names import cluster_name, node_name
from relaunch.models.recovery import AuditRecord, Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, NodeFlag, watched

log = logging.getLogger("relaunch.console.intake")


MAX_BODY = 1 << 20
MAX_ALERTS = 200  # alerts of one Alertmanager notification (its webhook's max_alerts)
# An event that says no time is deduplicated by its content within this many seconds.
UNDATED_WINDOW_S = 600
_ALERTNAME = re.compile(r"[A-Za-z0-9_:.-]{1,100}")


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


def _refusal(exc: IntakeRefused) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    if exc.retry_after is not None:
        headers = {"retry-after": exc.retry_after}
    return JSONResponse(
        {"error": exc.error, "field": exc.field}, status_code=exc.status, headers=headers
    )


def _unavailable(error: str) -> JSONResponse:
    return JSONResponse({"error": error, "field": None}, status_code=503)


def _authorize(request: Request, c: Console, role: ConsoleRole = ConsoleRole.INTAKE) -> User:
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("bearer "):
        raise IntakeRefused(401, f"an {role.value} bearer token is required", "authorization")
    user = c.tokens.authenticate(header[7:])
    if user is None:
        raise IntakeRefused(401, "unknown or revoked token", "authorization")
    if not user.can(role):
        what = "an intake sender" if role is ConsoleRole.INTAKE else "a repair sender"
        raise IntakeRefused(
            403, f"{user.name} is a {user.role}, not {what} (this takes a {role.value} token)", None
        )
    return user


def limit(request: Request, c: Console, user: User, events: int) -> None:
    """Spend ``events`` of the sender's allowance (intake_limits.py), or refuse the request
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


def _target(request: Request, c: Console, user: User, named: object = None) -> Cluster:
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


async def _json_body(request: Request) -> Any:
    """The body, read as it streams in and refused (413) as soon as it passes MAX_BODY: a
    chunked body declares no length, and is never read whole before its size is known."""
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
    body = b"".join(chunks)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntakeRefused(400, f"body is not valid JSON: {exc}", "body") from exc


async def addressed(
    request: Request, role: ConsoleRole = ConsoleRole.INTAKE
) -> tuple[Console, User, Cluster, Any]:
    """What every intake of one event shape starts with: the sender's token checked (of
    ``role``), the JSON body read, and the cluster it is for (its ``cluster`` field, else
    ``?cluster=``, else the primary) checked against the token's scope; the body without
    ``cluster``. Raises IntakeRefused."""
    c = console(request)
    user = _authorize(request, c, role)
    raw = await _json_body(request)
    named = raw.pop("cluster", None) if isinstance(raw, dict) else None
    return c, user, _target(request, c, user, named), raw


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


def _parse(model: type[BaseModel], raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise IntakeRefused(422, "body must be a JSON object", "body")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise refused(exc) from exc


def _trim(value: str, limit: int = 300) -> str:
    return value if len(value) <= limit else value[:limit] + "…"


def _watched(cl: Cluster, job: Job) -> bool:
    w = cl.config.watch
    return watched(job, cl.name, partitions=w.partitions, opt_in_comment=w.opt_in_comment)


def _on_node(job: Job, node: str) -> str | None:
    """The job's node that ``node`` names (as is, or a FQDN's first label)."""
    if node in job.nodes:
        return node
    short = node.split(".")[0]
    return short if short in job.nodes else None


async def _jobs(cl: Cluster) -> list[Job]:
    if cl.services.scheduler is None:
        raise RelaunchError(f"the console has no scheduler to look jobs up on {cl.name}")
    return await cl.services.scheduler.list_jobs()


def _candidates(
    cl: Cluster, jobs: list[Job], node: str | None, job_id: str | None
) -> list[tuple[Job, list[str]]]:
    """Watched jobs the signal concerns, each with the nodes to name in the detection."""
    found: list[tuple[Job, list[str]]] = []
    for job in jobs:
        if not _watched(cl, job):
            continue
        on = _on_node(job, node) if node else None
        if job_id is not None:
            if job.job_id == job_id:
                found.append((job, [on] if on else []))
        elif on and (job.state is JobState.RUNNING or job.state.is_abnormal_end):
            found.append((job, [on]))
    return found


async def _record(
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
    async with c.db.connection():  # the schema is there (migrated on the console's first use)
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


async def _delivered(c: Console, cl: Cluster, key: str) -> bool:
    return await c.db.store.has_dedupe_key(f"{intake_incident(cl.name)}:{key}:delivered")


async def _deliver(
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
    await _record(c, cl, f"delivered: {summary}", f"{key}:delivered", {"delivered": results}, [])
    return results


def _detection(
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
        text=_trim(text, 500),
        nodes=nodes,
        fault_time=fault_time,
        detected_at=datetime.now(UTC),
        submitted_at=job.submit_time,
    )


# ---------------------------------------------------------------------- Alertmanager


def _check_alert(i: int, alert: Alert) -> tuple[str | None, str | None]:
    if not _ALERTNAME.fullmatch(alert.name):
        raise IntakeRefused(
            422, f"invalid alertname {alert.name!r}", f"alerts.{i}.labels.alertname"
        )
    try:
        node = alert.node()
    except InvalidNameError as exc:
        label = next(
            lb for lb in ("Hostname", "hostname", "node", "instance") if alert.labels.get(lb)
        )
        raise IntakeRefused(422, exc.message, f"alerts.{i}.labels.{label}") from exc
    try:
        job_id = alert.job_id()
    except InvalidNameError as exc:
        label = "slurm_job_id" if alert.labels.get("slurm_job_id") else "job"
        raise IntakeRefused(422, exc.message, f"alerts.{i}.labels.{label}") from exc
    return node, job_id


def _alert_row(payload: AlertmanagerPayload, alert: Alert) -> dict[str, object]:
    return {
        "source": "alertmanager",
        "receiver": _trim(payload.receiver, 100),
        "group_key": _trim(payload.groupKey, 200),
        "status": alert.status.value,
        "trusted": False,  # an alert points at a node or job; it never convicts (docs/trust.md)
        "fingerprint": alert.key,
        "starts_at": alert.startsAt.isoformat(),
        "labels": {_trim(k, 60): _trim(v, 200) for k, v in list(alert.labels.items())[:30]},
        "annotations": {
            _trim(k, 60): _trim(v, 500) for k, v in list(alert.annotations.items())[:10]
        },
    }


async def alertmanager(request: Request) -> Response:
    c = console(request)
    try:
        user = _authorize(request, c)
        cl = _target(request, c, user)
        payload: AlertmanagerPayload = _parse(AlertmanagerPayload, await _json_body(request))
        if len(payload.alerts) > MAX_ALERTS:
            raise IntakeRefused(
                422,
                f"at most {MAX_ALERTS} alerts in one notification (set max_alerts in "
                "Alertmanager's webhook_config)",
                "alerts",
            )
        checked = [_check_alert(i, a) for i, a in enumerate(payload.alerts)]
        limit(request, c, user, max(1, len(payload.alerts)))
    except IntakeRefused as exc:
        return _refusal(exc)
    report: list[dict[str, object]] = []
    try:
        jobs: list[Job] | None = None
        for alert, (node, job_id) in zip(payload.alerts, checked, strict=True):
            key = f"am:{alert.key}:{alert.startsAt.isoformat()}"
            summary = f"alert {alert.name} {alert.status.value}" + (f" on {node}" if node else "")
            status_key = key if alert.status is AlertStatus.FIRING else f"{key}:resolved"
            new = await _record(
                c, cl, summary, status_key, _alert_row(payload, alert), [node] if node else []
            )
            entry: dict[str, object] = {
                "alert": alert.name,
                "fingerprint": alert.key,
                "status": alert.status.value,
                "recorded": new,
            }
            report.append(entry)
            if alert.status is AlertStatus.RESOLVED:
                entry["note"] = "resolved: recorded, no action"
                continue
            if node is None and job_id is None:
                entry["note"] = "names no node or Slurm job: recorded, no action"
                continue
            if await _delivered(c, cl, key):
                entry["note"] = "already delivered"
                continue
            jobs = jobs if jobs is not None else await _jobs(cl)
            found = _candidates(cl, jobs, node, job_id)
            # An alert is the sender's say-so, whoever wrote its labels: it points a recovery
            # at a node (source `alert`, never trusted), and it never restarts by itself a job
            # that has not ended abnormally (docs/trust.md).
            targets = [
                Target(
                    detection=_detection(
                        cl,
                        job,
                        nodes,
                        DetectionSource.ALERT,
                        f"alert:{alert.name}",
                        alert.text(),
                        alert.startsAt,
                    ),
                    source_key=key,
                )
                for job, nodes in found
                if job.state.is_abnormal_end
            ]
            pointed = [job.job_id for job, _ in found if not job.state.is_abnormal_end]
            if pointed:
                entry["pointed"] = pointed
                entry["note"] = (
                    f"points at job {', '.join(pointed)}, still {found[0][0].state.value}: "
                    "recorded, no action (an alert alone restarts no running job)"
                )
            entry["detections"] = await _deliver(c, cl, key, targets, summary)
    except RelaunchError as exc:
        log.warning("intake from alertmanager not delivered: %s", exc.message)
        return _unavailable(f"not delivered, retry later: {exc.message}")
    except Exception as exc:  # Temporal unreachable, RPC errors: the sender retries on 5xx
        log.warning("intake from alertmanager not delivered: %s", type(exc).__name__)
        return _unavailable(f"not delivered, retry later: {type(exc).__name__}")
    return JSONResponse({"accepted": len(payload.alerts), "alerts": report})


# ---------------------------------------------------------------------- Slurm hooks


async def slurm(request: Request) -> Response:
    try:
        c, user, cl, raw = await addressed(request)
        event: SlurmHookEvent = _parse(SlurmHookEvent, raw)
        if event.event is SlurmEventKind.JOB_END and event.job_id is None:
            raise IntakeRefused(422, "a job_end event needs job_id", "job_id")
        if event.event is not SlurmEventKind.JOB_END and event.node is None:
            raise IntakeRefused(422, f"a {event.event.value} event needs node", "node")
        limit(request, c, user, 1)
    except IntakeRefused as exc:
        return _refusal(exc)
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
        entry["recorded"] = await _record(
            c,
            cl,
            summary,
            key,
            {"source": "slurm_hook", **event.model_dump(mode="json")},
            [event.node] if event.node else [],
        )
        if await _delivered(c, cl, key):
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
        jobs = await _jobs(cl)
        doubt = await _not_borne_out(cl, event, jobs)
        if doubt is not None:
            # Any intake token may post here: what it says becomes a scheduler detection only
            # when Slurm's own fresh view says the same (docs/trust.md, "Intakes").
            log.info("intake from slurm not borne out by Slurm: %s", doubt)
            entry["note"] = f"not borne out by Slurm's own view ({doubt}): recorded, no action"
            return JSONResponse(entry)
        found = _candidates(cl, jobs, event.node, event.job_id)
        targets = [
            Target(
                detection=_detection(
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
        entry["detections"] = await _deliver(c, cl, key, targets, summary)
    except RelaunchError as exc:
        log.warning("intake from slurm not delivered: %s", exc.message)
        return _unavailable(f"not delivered, retry later: {exc.message}")
    except Exception as exc:
        log.warning("intake from slurm not delivered: %s", type(exc).__name__)
        return _unavailable(f"not delivered, retry later: {type(exc).__name__}")
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
    assert cl.services.scheduler is not None  # _jobs checked it
    name = event.node or ""
    nodes = {n.name: n for n in await cl.services.scheduler.list_nodes()}
    node = nodes.get(name) or nodes.get(name.split(".")[0])
    if node is None:
        return f"Slurm lists no node {name}"
    if not node.responding or NodeFlag.FAIL in node.flags:
        return None
    return f"Slurm lists {node.name} {node.display_state}"


# ---------------------------------------------------------------------- repair callback

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RepairCallback(BaseModel):
    """``POST /intake/repair``: the repair system (or a script) says ``node`` is repaired."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(description="the repaired node, as Slurm names it")
    by: str = Field(max_length=100, description="who repaired it (recorded)")
    ticket: str = Field(default="", max_length=64, description="the repair ticket")
    note: str = Field(default="", max_length=500, description="what was done (recorded)")

    @field_validator("node")
    @classmethod
    def _node(cls, value: str) -> str:
        return node_name(value)

    @field_validator("by", "ticket")
    @classmethod
    def _line(cls, value: str) -> str:
        if _CONTROL.search(value):
            raise ValueError("control characters are not allowed")
        return value.strip()

    @field_validator("note")
    @classmethod
    def _note(cls, value: str) -> str:
        if _CONTROL.search(value.replace("\n", " ").replace("\t", " ")):
            raise ValueError("control characters other than newlines and tabs are not allowed")
        return value.strip()

    @field_validator("by")
    @classmethod
    def _by(cls, value: str) -> str:
        if not value:
            raise ValueError("by must name who repaired the node")
        return value


def _parse_repair(raw: Any) -> RepairCallback:
    """The callback's body, or a 400 naming the field at fault."""
    if not isinstance(raw, dict):
        raise IntakeRefused(400, "body must be a JSON object", "body")
    try:
        return RepairCallback.model_validate(raw)
    except ValidationError as exc:
        raise refused(exc, 400, "the body takes node, by, ticket, note and cluster") from exc


async def repair(request: Request) -> Response:
    try:
        c, user, cl, raw = await addressed(request, ConsoleRole.REPAIR)
        body = _parse_repair(raw)
        limit(request, c, user, 1)
    except IntakeRefused as exc:
        return _refusal(exc)
    signal = cl.services.repaired
    if signal is None:
        return _unavailable("the console cannot reach Temporal (no repair signal configured)")
    told = RepairReturn(by=body.by, ticket=body.ticket, note=body.note)
    try:
        lifecycle = await signal(body.node, told)
    except RelaunchError as exc:
        if exc.retryable:
            log.warning("repair callback for %s not delivered: %s", body.node, exc.message)
            return _unavailable(f"not delivered, retry later: {exc.message}")
        # recovery_client.signal_repaired: none of the node's lifecycles runs (404), or the
        # one that runs is not waiting for a repair (409).
        status = 404 if isinstance(exc, NoLifecycleError) else 409
        return JSONResponse({"error": exc.message, "field": "node"}, status_code=status)
    except Exception as exc:  # Temporal unreachable, RPC errors: the sender retries on 5xx
        log.warning("repair callback for %s not delivered: %s", body.node, type(exc).__name__)
        return _unavailable(f"not delivered, retry later: {type(exc).__name__}")
    summary = (
        f"repair callback: {body.node} repaired, says {body.by}"
        + (f" (ticket {body.ticket})" if body.ticket else "")
        + f": {lifecycle} validates it"
    )
    try:  # the lifecycle records its own `repaired` row; this one names the sender
        await _record(
            c,
            cl,
            summary,
            None,
            {"source": "repair", "sender": user.name, "lifecycle": lifecycle, **body.model_dump()},
            [body.node],
        )
    except Exception as exc:  # delivered: a retry would be refused (409), so answer 202
        log.warning("repair callback for %s not recorded: %s", body.node, type(exc).__name__)
    log.info("intake repair %s -> %s", body.node, lifecycle)
    return JSONResponse(
        {
            "lifecycle": lifecycle,
            "cluster": cl.name,
            "node": body.node,
            "note": "the lifecycle validates the node; it returns to service only if its "
            "checks pass",
        },
        status_code=202,
    )


def routes() -> list[Route]:
    return [
        Route("/intake/alertmanager", alertmanager, methods=["POST"]),
        Route("/intake/slurm", slurm, methods=["POST"]),
        Route("/intake/repair", repair, methods=["POST"]),
    ]
