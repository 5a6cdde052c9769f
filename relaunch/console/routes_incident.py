"""One incident: timeline, decisive evidence, verdict, plan, and the Approve / Reject forms. A
node lifecycle's id (``relaunch-<cluster>-lifecycle-<node>-<n>``) is an incident too: its page
shows the node's stages, the checks that ran and the step waiting for a decision."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relaunch.connectors.audit import StoredEvent
from relaunch.console.auth import ConsoleRole
from relaunch.console.lifecycles import TERMINAL_NODE_STAGES, checks_view, pending_of
from relaunch.console.web import (
    Auth,
    Conflict,
    NotFound,
    Problem,
    Unavailable,
    check_cluster,
    console,
    render,
    require,
    require_post,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import parse_lifecycle_id
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.recovery import Approval
from relaunch.models.search_attributes import TERMINAL_STAGES

DECISIVE_ROLES = {"root", "confirm"}
RECOVERY_TERMINAL = frozenset(s.value for s in TERMINAL_STAGES)
MAX_REASON = 500
# Rows are written by other versions too: every field a template reads has a default.
EVIDENCE_DEFAULTS: dict[str, Any] = {
    "role": "root",
    "source": "",
    "line_no": "",
    "node": None,
    "signature": "",
    "text": "",
    "count": 1,
    "xid": None,
}
VERDICT_DEFAULTS: dict[str, Any] = {
    "category": "unknown",
    "culprit_nodes": [],
    "confidence": 0.0,
    "summary": "",
}
PLAN_DEFAULTS: dict[str, Any] = {
    "action": "none",
    "mode": "",
    "drain_nodes": [],
    "exclude_nodes": [],
    "restart_method": "",
    "reasons": [],
    "guards": [],
}


class StageSpan(BaseModel):
    stage: str
    at: datetime
    duration_s: float | None
    current: bool


class TimelineRow(BaseModel):
    event: StoredEvent
    since_start_s: float
    step_s: float


def stages(
    events: list[StoredEvent],
    now: datetime,
    kind: str = "stage",
    terminal_stages: frozenset[str] = RECOVERY_TERMINAL,
) -> list[StageSpan]:
    """Each stage with how long it lasted (to the next stage, or until now while open): the
    recovery's stages (``stage`` rows), or a lifecycle's (``node_stage`` rows)."""
    rows = [e for e in events if e.kind == kind and e.stage]
    spans = []
    for i, e in enumerate(rows):
        last = i == len(rows) - 1
        terminal = e.stage in terminal_stages
        end = rows[i + 1].at if not last else (None if terminal else now)
        spans.append(
            StageSpan(
                stage=str(e.stage),
                at=e.at,
                duration_s=(end - e.at).total_seconds() if end else None,
                current=last,
            )
        )
    return spans


def timeline(events: list[StoredEvent]) -> list[TimelineRow]:
    if not events:
        return []
    start, prev, out = events[0].at, events[0].at, []
    for e in events:
        out.append(
            TimelineRow(
                event=e,
                since_start_s=(e.at - start).total_seconds(),
                step_s=(e.at - prev).total_seconds(),
            )
        )
        prev = e.at
    return out


def _latest(events: list[StoredEvent], kind: str) -> StoredEvent | None:
    found = [e for e in events if e.kind == kind]
    return found[-1] if found else None


def evidence_view(events: list[StoredEvent]) -> dict[str, Any]:
    """The verdict's evidence lines (decisive ones flagged) and the log excerpt with the
    lines the verdict rests on marked."""
    verdict = _latest(events, "verdict")
    lines: list[dict[str, Any]] = []
    if verdict is not None:
        raw = verdict.data.get("evidence")
        for item in raw if isinstance(raw, list) else []:
            if isinstance(item, dict):
                line = {**EVIDENCE_DEFAULTS, **item}
                lines.append({**line, "decisive": line["role"] in DECISIVE_ROLES})
    decisive = {str(line.get("text", "")).strip() for line in lines if line["decisive"]}
    excerpt: list[dict[str, Any]] = []
    ev = _latest(events, "evidence")
    raw_excerpt = ev.data.get("log_excerpt") if ev else None
    for text in raw_excerpt if isinstance(raw_excerpt, list) else []:
        t = str(text)
        excerpt.append({"text": t, "decisive": any(d and d in t for d in decisive)})
    return {"evidence_lines": lines, "log_excerpt": excerpt}


async def _context(request: Request, auth: Auth, incident_id: str) -> dict[str, Any]:
    c = console(request)
    summary = await c.db.incident(incident_id)  # the schema checked, PostgreSQL answering
    if summary is None:
        raise NotFound(f"no incident {incident_id!r}: the audit trail has no such id")
    check_cluster(auth, summary.cluster)  # whose it is: the audit trail's row, not the id
    events = await c.db.from_store(lambda store: store.events(incident_id))
    now = datetime.now(UTC)
    timeout_s = c.config_of(summary.cluster).policy.approval_timeout_s
    # Awaiting: the latest stage row asks for a decision that no approval or rejection row
    # answered yet (a lifecycle records no stage between a decision and its next step).
    pending = pending_of(events, timeout_s)
    lifecycle = parse_lifecycle_id(incident_id)
    if lifecycle is not None:  # a node's stages: suspect, drained, diagnosing, …
        spans = stages(events, now, "node_stage", TERMINAL_NODE_STAGES)
    else:
        spans = stages(events, now)
    current = spans[-1].stage if spans else None
    awaiting = pending is not None
    expires_at = pending.expires_at if pending else None
    verdict, plan = _latest(events, "verdict"), _latest(events, "plan")
    node = parse_node_decision_id(incident_id) if lifecycle is None else None
    joined = _latest(events, "node_decision")
    checks = [v for v in (checks_view(e) for e in events if e.kind == "checks") if v]
    return {
        # A node lifecycle: its node and the checks that ran (newest first).
        "lifecycle": {
            "node": lifecycle[1],
            "checks": checks[::-1],
        }
        if lifecycle is not None
        else None,
        "pending": pending,
        # A node decision: its node and the job recoveries one decision covers.
        "node_decision": {
            "node": node[1],
            "covers": await c.db.from_store(lambda store: store.covered_by(incident_id)),
        }
        if node is not None
        else None,
        # A job recovery that joined node decisions: which (node → decision id).
        "joined": dict(joined.data.get("decisions") or {}) if joined else {},  # type: ignore[call-overload]
        "incident": summary,
        "served_here": summary.cluster in c.clusters,
        "events": events,
        "timeline": timeline(events),
        "stages": spans,
        "stage": current,
        "awaiting": awaiting,
        "expires_at": expires_at,
        "expires_in_s": (expires_at - now).total_seconds() if expires_at else None,
        "verdict": {**VERDICT_DEFAULTS, **verdict.data} if verdict else None,
        "plan": {**PLAN_DEFAULTS, **plan.data} if plan else None,
        "decisions": [e for e in events if e.kind in {"approval", "rejection"}],
        **evidence_view(events),
    }


async def incident_page(request: Request) -> Response:
    auth = require(request)
    incident_id = request.path_params["incident_id"]
    ctx = await _context(request, auth, incident_id)
    return render(request, "incident.html", auth, **ctx)


async def incident_fragment(request: Request) -> Response:
    auth: Auth = require(request)
    ctx = await _context(request, auth, request.path_params["incident_id"])
    return render(request, "_incident_live.html", auth, **ctx)


async def decide(request: Request) -> Response:
    decision = request.path_params["decision"]
    if decision not in {"approve", "reject"}:
        raise NotFound(f"no such decision {decision!r}")
    auth, form = await require_post(request, ConsoleRole.APPROVER)
    incident_id = request.path_params["incident_id"]
    await send_decision(request, auth, incident_id, decision, form)
    return RedirectResponse(
        f"/incidents/{quote(incident_id, safe='')}?decided={decision}", status_code=303
    )


async def send_decision(
    request: Request, auth: Auth, incident_id: str, decision: str, form: dict[str, str]
) -> str:
    """Send a person's approve/reject of ``incident_id`` (the incident page's and the nodes
    page's forms, after require_post): the incident must be in the audit trail and in the
    user's scope, and of a cluster this console serves; it goes through that cluster's own
    Temporal decider (recovery_client.decide, the CLI's path). A form that names the request
    it decides (``request_id``) is refused when that request no longer waits: the page was
    stale, and the step now waiting is another. Returns the incident's cluster."""
    c = console(request)
    summary = await c.db.incident(incident_id)
    if summary is None:
        raise NotFound(f"no incident {incident_id!r}")
    check_cluster(auth, summary.cluster)
    reason = form.get("reason", "").strip()
    if len(reason) > MAX_REASON:
        raise Problem(f"the reason is longer than {MAX_REASON} characters")
    request_id = form.get("request_id", "").strip()
    if request_id:
        timeout_s = c.config_of(summary.cluster).policy.approval_timeout_s
        events = await c.db.from_store(lambda store: store.events(incident_id))
        pending = pending_of(events, timeout_s)
        if pending is None or pending.request_id != request_id:
            now = f"now {pending.step or 'another step'} waits" if pending else "nothing waits"
            raise Conflict(
                f"{incident_id}: the step you decided is no longer waiting ({now}): reload the page"
            )
    served = c.clusters.get(summary.cluster)
    if served is None:  # a cluster's own configuration acts on its incidents, no other
        raise Conflict(
            f"incident {incident_id} is of cluster {summary.cluster}, which this console does "
            "not serve: decide it on that cluster's console or with its CLI configuration"
        )
    decide_on = served.services.decide  # that cluster's own Temporal decider
    if decide_on is None:
        raise Unavailable("this console has no Temporal connection: decisions cannot be sent")
    try:
        await decide_on(incident_id, decision, Approval(by=auth.user.name, reason=reason))
    except RelaunchError as exc:
        if exc.retryable:
            raise Unavailable(f"Temporal does not answer: {exc.message}") from exc
        raise Conflict(exc.message) from exc
    return summary.cluster
