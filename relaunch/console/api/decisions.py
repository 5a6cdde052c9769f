"""Approve and reject through `/api/v1`, exactly once under retries.

A decision goes through the same decider as the console's buttons and `relaunch approve`
(``Services.decide``: recovery_client.decide, the workflow's `decide` update, whose validator
takes one decision per request). What a retry answers is read from the audit trail, never from
this process's memory, so a retry that reaches another replica or a restarted console gets the
same answer:

- the request a call decides is its ``request_id`` (the incident's, as GET gives it), else the
  one an earlier call with the same ``Idempotency-Key`` was bound to (a ``decision_request``
  row, recorded once under a dedupe key before the decision is sent), else the one that waits;
- when the workflow has recorded a decision of that request (its ``approval`` / ``rejection``
  row names the request), the same decision by the same person is answered as the first call
  was (200, ``Idempotent-Replayed: true``) and nothing is sent; another is a 409;
- a retry that crosses the first call (the decision taken, its row not written yet) is refused
  by the workflow's validator; the row is then awaited and the retry answered from it.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from datetime import UTC, datetime

from pydantic import ValidationError
from starlette.requests import Request
from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from relaunch.connectors.audit import StoredEvent
from relaunch.console.api.endpoint import Answer, Call, FieldProblem
from relaunch.console.api.incidents import incident_in_scope
from relaunch.console.api.models import DecisionAnswer, DecisionBody
from relaunch.console.lifecycles import DECISION_KINDS, pending_of
from relaunch.console.web import Conflict, Console, Unavailable
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Approval, AuditRecord, Decision

DECISION_REQUEST = "decision_request"  # the audit row binding an Idempotency-Key to a request
IDEMPOTENCY_HEADER = "idempotency-key"
REPLAYED_HEADER = "idempotent-replayed"
_KEY = re.compile(r"^[A-Za-z0-9._:\-]{1,200}$")
MAX_BODY = 16 * 1024
# How long a retry refused by the workflow waits for the decision's row (written right after
# the update returns), and how often it looks.
DECIDED_WAIT_S = 5.0
DECIDED_POLL_S = 0.1
_TEMPORAL_DOWN = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED}


async def approve_incident(call: Call) -> Answer:
    """Approve the step the incident waits for (a recovery's plan, a node decision's drain,
    a node lifecycle's rung or return)."""
    return await _decide(call, Decision.APPROVE)


async def reject_incident(call: Call) -> Answer:
    """Reject the step the incident waits for."""
    return await _decide(call, Decision.REJECT)


async def _body(request: Request) -> DecisionBody:
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise FieldProblem(f"the body is larger than {MAX_BODY} bytes", "body", status=413)
    if not raw.strip():
        return DecisionBody()
    try:
        return DecisionBody.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        if first["type"] == "extra_forbidden":
            msg = f"unknown field {where!r}: the body takes reason and request_id"
        elif first["type"] == "json_invalid":
            msg = 'the body is not JSON: send {"reason": "...", "request_id": "..."}'
        else:
            msg = f"{where}: {first['msg']}"
        raise FieldProblem(msg, where) from exc


def _key(request: Request) -> str | None:
    raw = request.headers.get(IDEMPOTENCY_HEADER)
    if raw is None:
        return None
    if not _KEY.match(raw):
        raise FieldProblem(
            "Idempotency-Key must be 1 to 200 letters, digits and . _ : - (a UUID will do)",
            "Idempotency-Key",
        )
    return raw


def _decided(events: list[StoredEvent], request_id: str) -> StoredEvent | None:
    """The workflow's row of a decision on ``request_id`` (there is at most one)."""
    for e in events:
        if e.kind in DECISION_KINDS and request_id and e.data.get("request_id") == request_id:
            return e
    return None


def _bound(events: list[StoredEvent], by: str, key: str) -> StoredEvent | None:
    """The earlier call's binding of this person's Idempotency-Key."""
    for e in events:
        if (
            e.kind == DECISION_REQUEST
            and e.data.get("by") == by
            and e.data.get("idempotency_key") == key
        ):
            return e
    return None


def _same_call(bound: StoredEvent, decision: Decision, body: DecisionBody) -> None:
    """Refuse an Idempotency-Key sent again with another request."""
    data = bound.data
    if (
        data.get("decision") != decision.value
        or data.get("reason") != body.reason.strip()
        or (body.request_id is not None and data.get("request_id") != body.request_id)
    ):
        raise FieldProblem(
            f"this Idempotency-Key was sent before with another request ({data.get('decision')} "
            f"of {data.get('request_id')}): a new request needs a new key",
            "Idempotency-Key",
            status=422,
        )


def _answer_from(row: StoredEvent, cluster: str, decision: Decision, by: str) -> Answer:
    """A retry's answer, from the decision the workflow recorded; 409 when that decision is
    another's (another person's, or the other way)."""
    data = row.data
    if data.get("decision") != decision.value or data.get("by", row.actor) != by:
        past = "approved" if row.kind == "approval" else "rejected"
        raise Conflict(
            f"{row.incident_id}: {data.get('request_id')} was already {past} by "
            f"{data.get('by', row.actor)}"
        )
    answer = DecisionAnswer(
        incident_id=row.incident_id,
        cluster=cluster,
        request_id=str(data.get("request_id")),
        decision=Decision(str(data.get("decision"))),
        by=str(data.get("by", row.actor)),
        reason=str(data.get("reason") or ""),
    )
    return Answer(answer, headers={REPLAYED_HEADER: "true"})


async def _events(c: Console, incident_id: str) -> list[StoredEvent]:
    return await c.db.from_store(lambda store: store.events(incident_id))


async def _decide(call: Call, decision: Decision) -> Answer:
    auth, c = call.auth, call.c
    key = _key(call.request)
    body = await _body(call.request)
    incident_id = call.path("incident_id")
    summary = await incident_in_scope(call, incident_id)
    served = c.clusters.get(summary.cluster)
    if served is None:  # a cluster's own configuration acts on its incidents, no other
        raise Conflict(
            f"incident {incident_id} is of cluster {summary.cluster}, which this console does "
            "not serve: decide it on that cluster's console or with its CLI configuration"
        )
    decide_on = served.services.decide
    if decide_on is None:
        raise Unavailable("this console has no Temporal connection: decisions cannot be sent")
    by, reason = auth.user.name, body.reason.strip()
    timeout_s = served.config.policy.approval_timeout_s
    events = await _events(c, incident_id)

    bound = _bound(events, by, key) if key else None
    if bound is not None:
        _same_call(bound, decision, body)
    request_id = body.request_id or (str(bound.data.get("request_id")) if bound else None)
    if request_id is not None and (done := _decided(events, request_id)) is not None:
        return _answer_from(done, summary.cluster, decision, by)

    pending = pending_of(events, timeout_s)
    if pending is None or (request_id is not None and pending.request_id != request_id):
        now = f"now {pending.step or pending.request_id} waits" if pending else "nothing waits"
        what = f"{request_id} is" if request_id else "the incident is"
        raise Conflict(f"{incident_id}: {what} not waiting for a decision ({now})")
    request_id = pending.request_id

    if key and bound is None:
        await _bind(c, incident_id, by, key, decision, reason, request_id)
    try:
        await decide_on(incident_id, decision.value, Approval(by=by, reason=reason))
    except (RPCError, RPCTimeoutOrCancelledError) as exc:
        raise Unavailable(f"Temporal does not answer: {exc}: retry") from exc
    except RelaunchError as exc:
        cause = exc.__cause__
        if exc.retryable or (isinstance(cause, RPCError) and cause.status in _TEMPORAL_DOWN):
            raise Unavailable(f"Temporal does not answer: {exc.message}: retry") from exc
        # Refused: perhaps because an earlier try of this very call took the decision.
        done = await _await_decided(c, incident_id, request_id, timeout_s)
        if done is not None:
            return _answer_from(done, summary.cluster, decision, by)
        raise Conflict(exc.message) from exc
    return Answer(
        DecisionAnswer(
            incident_id=incident_id,
            cluster=summary.cluster,
            request_id=request_id,
            decision=decision,
            by=by,
            reason=reason,
        )
    )


async def _bind(
    c: Console,
    incident_id: str,
    by: str,
    key: str,
    decision: Decision,
    reason: str,
    request_id: str,
) -> None:
    """Record, once, which request this Idempotency-Key decides (before the decision is sent,
    so that a retry after the decision finds it)."""
    row = AuditRecord(
        incident_id=incident_id,
        kind=DECISION_REQUEST,
        at=datetime.now(UTC),
        actor=by,
        summary=f"{decision.value} of {request_id} asked through the API by {by}",
        data={
            "decision": decision.value,
            "by": by,
            "reason": reason,
            "request_id": request_id,
            "idempotency_key": key,
        },
    )
    digest = hashlib.sha256(f"{incident_id}\0{by}\0{key}".encode()).hexdigest()
    recorded = await c.db.from_store(
        lambda store: store.record(row, dedupe_key=f"api-decision:{digest}")
    )
    if not recorded:  # a concurrent try of the same key recorded it first: it must agree
        bound = _bound(await _events(c, incident_id), by, key)
        if bound is not None:
            _same_call(bound, decision, DecisionBody(reason=reason, request_id=request_id))


async def _await_decided(
    c: Console, incident_id: str, request_id: str, timeout_s: float
) -> StoredEvent | None:
    """The decision row of ``request_id`` once the workflow has written it; None as soon as
    the incident moved on without one (or after DECIDED_WAIT_S)."""
    deadline = time.monotonic() + DECIDED_WAIT_S
    while True:
        events = await _events(c, incident_id)
        done = _decided(events, request_id)
        if done is not None:
            return done
        pending = pending_of(events, timeout_s)
        if pending is None or pending.request_id != request_id or time.monotonic() > deadline:
            return None
        await asyncio.sleep(DECIDED_POLL_S)
