"""Incidents: the list (the audit page's filters, keyset pages), one incident with its stage,
verdict, plan and the request awaiting a decision, its timeline, its verdict and its plan.

An incident outside the caller's cluster scope answers exactly as one that does not exist
(404): a scoped token learns nothing of other clusters' incidents."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

from psycopg.rows import dict_row
from pydantic import BaseModel, ValidationError
from starlette.datastructures import QueryParams

from relaunch.connectors.audit import IncidentRow, StoredEvent
from relaunch.console.api.endpoint import (
    PREFIX,
    Call,
    FieldProblem,
    decode_cursor,
    encode_cursor,
    limit_of,
)
from relaunch.console.api.models import (
    DecisionRecord,
    EventPage,
    EvidenceLineView,
    ExcerptLine,
    IncidentDetail,
    IncidentPage,
    Links,
    PlanView,
    VerdictView,
)
from relaunch.console.lifecycles import DECISION_KINDS, TERMINAL_NODE_STAGES, pending_of
from relaunch.console.queries import _SUMMARY_SQL, AuditFilter, Clusters
from relaunch.console.routes_audit import parse_filter
from relaunch.console.routes_incident import PLAN_DEFAULTS, VERDICT_DEFAULTS, evidence_view, stages
from relaunch.console.web import NotFound, Problem, check_cluster, workflow_url
from relaunch.models.errors import InvalidNameError
from relaunch.models.lifecycle import parse_lifecycle_id
from relaunch.models.names import cluster_name
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.search_attributes import Stage

INCIDENTS_DEFAULT, INCIDENTS_MAX = 50, 500
EVENTS_DEFAULT, EVENTS_MAX = 100, 1000
INCIDENT_FILTERS = ("cluster", "job", "node", "category", "since", "until")


def audit_filter(call: Call, keys: tuple[str, ...]) -> AuditFilter:
    """The audit page's filters (routes_audit.parse_filter) among ``keys``; a bad value is a
    400 naming its parameter."""
    params = call.request.query_params
    mine = QueryParams([(k, v) for k, v in params.multi_items() if k in keys])
    try:
        f = parse_filter(mine)
    except Problem as exc:
        for key in keys:  # which one: the first that fails on its own
            try:
                parse_filter(QueryParams([(key, v) for k, v in mine.multi_items() if k == key]))
            except Problem:
                raise FieldProblem(exc.message, key) from exc
        raise FieldProblem(exc.message, None) from exc
    if f.cluster:
        try:
            cluster_name(f.cluster)
        except InvalidNameError as exc:
            raise FieldProblem(exc.message, "cluster") from exc
    return f


def scoped(call: Call, f: AuditFilter) -> Clusters:
    """The clusters a list may show: the filter's (403 outside the scope), else the scope."""
    if f.cluster:
        check_cluster(call.auth, f.cluster)
        return [f.cluster]
    return call.auth.user.clusters


async def incident_in_scope(call: Call, incident_id: str) -> IncidentRow:
    """The incident (its cluster from the audit trail, not its id); 404 when unknown or
    outside the caller's scope."""
    summary = await call.c.db.incident(incident_id)
    if summary is None or not call.auth.user.sees(summary.cluster):
        raise NotFound(f"no incident {incident_id!r}")
    return summary


# ------------------------------------------------------------------ the list


async def list_incidents(call: Call) -> IncidentPage:
    """Incidents, newest first, filtered like the audit page, one keyset page at a time."""
    f = audit_filter(call, INCIDENT_FILTERS)
    stage = call.param("stage")
    if stage and stage not in {s.value for s in Stage}:
        raise FieldProblem(
            f"stage must be one of {', '.join(s.value for s in Stage)}, not {stage!r}", "stage"
        )
    limit = limit_of(call, INCIDENTS_DEFAULT, INCIDENTS_MAX)
    cursor = decode_cursor(call, "incidents")
    after: tuple[datetime, str] | None = None
    if cursor is not None:
        try:
            after = (datetime.fromisoformat(str(cursor["at"])), str(cursor["id"]))
        except (KeyError, ValueError) as exc:
            raise FieldProblem("cursor is damaged: pass next_cursor as is", "cursor") from exc
    rows = await _incidents(call, f, stage or None, scoped(call, f), after, limit)
    last = rows[limit - 1] if len(rows) > limit else None
    return IncidentPage(
        items=rows[:limit],
        next_cursor=encode_cursor("incidents", at=last.created_at.isoformat(), id=last.id)
        if last
        else None,
    )


async def _incidents(
    call: Call,
    f: AuditFilter,
    stage: str | None,
    clusters: Clusters,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[IncidentRow]:
    """Up to ``limit + 1`` incidents (one more says a next page exists), through the console's
    summary of each picked incident (queries._SUMMARY_SQL: latest stage, verdict and plan)."""
    where = ["true"]
    args: dict[str, Any] = {"limit": limit + 1, "clusters": clusters, "stage": stage}
    if clusters is not None:
        where.append("r.cluster = any(%(clusters)s)")
    if f.job:
        where.append("r.job_id = %(job)s")
    if f.node:  # through the rows' GIN index on nodes
        where.append(
            "r.id in (select n.incident_id from audit_events n"
            " where n.nodes @> array[%(node)s]::text[])"
        )
    if f.since:
        where.append("r.created_at >= %(since)s")
    if f.until:
        where.append("r.created_at < %(until)s")
    if f.category:  # any verdict of it here; the latest one's below
        where.append(
            "r.id in (select v.incident_id from audit_events v"
            " where v.kind = 'verdict' and v.data->>'category' = %(category)s)"
        )
    if stage:
        where.append(
            "exists (select 1 from audit_events t where t.incident_id = r.id"
            " and t.kind = 'stage' and t.stage = %(stage)s)"
        )
    if after is not None:
        where.append("(r.created_at, r.id) < (%(after_at)s, %(after_id)s)")
        args.update(after_at=after[0], after_id=after[1])
    args.update({k: v for k, v in f.model_dump().items() if v is not None})
    latest = ["true"]
    if f.category:
        latest.append("v.category = %(category)s")
    if stage:
        latest.append("s.stage = %(stage)s")
    # Without a filter on the latest rows, the page is picked before the summary is read.
    pick_limit = "" if (f.category or stage) else " limit %(limit)s"
    sql = (
        f"with picked as (select * from recoveries r where {' and '.join(where)}"
        f" order by r.created_at desc, r.id desc{pick_limit})"
        + _SUMMARY_SQL
        + f" where {' and '.join(latest)}"
        " order by i.created_at desc, i.id desc limit %(limit)s"
    )
    async with call.c.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, args)
        return [IncidentRow.model_validate(r) for r in await cur.fetchall()]


# ------------------------------------------------------------------ one incident


def _latest(events: list[StoredEvent], kind: str) -> StoredEvent | None:
    found = [e for e in events if e.kind == kind]
    return found[-1] if found else None


M = TypeVar("M", bound=BaseModel)


def _valid(model: type[M], items: list[dict[str, Any]]) -> list[M]:
    """The items that parse (rows written by other versions may hold odd values)."""
    out = []
    for item in items:
        try:
            out.append(model.model_validate(item))
        except ValidationError:
            continue
    return out


def verdict_view(events: list[StoredEvent]) -> VerdictView | None:
    row = _latest(events, "verdict")
    if row is None:
        return None
    data = {**VERDICT_DEFAULTS, **row.data}
    ev = evidence_view(events)
    return VerdictView(
        row_id=row.id,
        at=row.at,
        summary=row.summary,
        category=str(data["category"]),
        culprit_nodes=[str(n) for n in data["culprit_nodes"] or []],
        confidence=float(data["confidence"] or 0.0),
        action=str(data["action"]) if data.get("action") else None,
        evidence_lines=_valid(EvidenceLineView, ev["evidence_lines"]),
        log_excerpt=_valid(ExcerptLine, ev["log_excerpt"]),
        data=row.data,
    )


def plan_view(events: list[StoredEvent]) -> PlanView | None:
    row = _latest(events, "plan")
    if row is None:
        return None
    data = {**PLAN_DEFAULTS, **row.data}

    def names(key: str) -> list[str]:
        value = data.get(key)
        return [str(v) for v in value] if isinstance(value, list) else []

    guards = data.get("guards")
    return PlanView(
        row_id=row.id,
        at=row.at,
        summary=row.summary,
        action=str(data["action"]),
        mode=str(data["mode"] or ""),
        request_id=str(data["request_id"]) if data.get("request_id") else None,
        drain_nodes=names("drain_nodes"),
        fence_nodes=names("fence_nodes"),
        exclude_nodes=names("exclude_nodes"),
        restart_method=str(data["restart_method"] or ""),
        reasons=names("reasons"),
        guards=[g for g in guards if isinstance(g, dict)] if isinstance(guards, list) else [],
        needs_override=bool(data.get("needs_override", False)),
        data=row.data,
    )


def decision_records(events: list[StoredEvent]) -> list[DecisionRecord]:
    out = []
    for e in events:
        if e.kind not in DECISION_KINDS:
            continue
        data = e.data
        said = data.get("decision") or ("approve" if e.kind == "approval" else "reject")
        out.append(
            DecisionRecord(
                row_id=e.id,
                at=e.at,
                decision=str(said),
                by=str(data.get("by") or e.actor),
                reason=str(data.get("reason") or ""),
                request_id=str(data["request_id"]) if data.get("request_id") else None,
                step=str(data["step"]) if data.get("step") else None,
            )
        )
    return out


def links(call: Call, incident_id: str, cluster: str) -> Links:
    base = f"{PREFIX}/incidents/{quote(incident_id, safe='')}"
    return Links(
        timeline=f"{base}/timeline",
        verdict=f"{base}/verdict",
        plan=f"{base}/plan",
        approve=f"{base}/approve",
        reject=f"{base}/reject",
        workflow=workflow_url(call.c.config_of(cluster), incident_id),
    )


async def get_incident(call: Call) -> IncidentDetail:
    """One incident with its latest stage, verdict, plan, mode, and whether (and under which
    request_id) it awaits a decision."""
    incident_id = call.path("incident_id")
    summary = await incident_in_scope(call, incident_id)
    c = call.c
    events = await c.db.from_store(lambda store: store.events(incident_id))
    pending = pending_of(events, c.config_of(summary.cluster).policy.approval_timeout_s)
    lifecycle = parse_lifecycle_id(incident_id)
    decision = parse_node_decision_id(incident_id) if lifecycle is None else None
    if lifecycle is not None:
        spans = stages(events, datetime.now(UTC), "node_stage", TERMINAL_NODE_STAGES)
    else:
        spans = stages(events, datetime.now(UTC))
    joined = _latest(events, "node_decision")
    raw_joined = joined.data.get("decisions") if joined else None
    covers: list[str] = []
    if decision is not None:
        covers = await c.db.from_store(lambda store: store.covered_by(incident_id))
    return IncidentDetail(
        incident=summary,
        kind="lifecycle" if lifecycle else "node_decision" if decision else "recovery",
        node=lifecycle[1] if lifecycle else decision[1] if decision else None,
        stage=spans[-1].stage if spans else None,
        stages=spans,
        mode=summary.mode,
        awaiting_approval=pending is not None,
        request_id=pending.request_id if pending else None,
        pending=pending,
        decisions=decision_records(events),
        verdict=verdict_view(events),
        plan=plan_view(events),
        node_decisions={str(k): str(v) for k, v in raw_joined.items()}
        if isinstance(raw_joined, dict)
        else {},
        covers=covers,
        served_here=summary.cluster in c.clusters,
        links=links(call, incident_id, summary.cluster),
    )


async def _found(call: Call, view: Callable[[list[StoredEvent]], M | None], what: str) -> M:
    """The incident's latest ``what`` as ``view`` reads it from its rows (404 while none)."""
    incident_id = call.path("incident_id")
    await incident_in_scope(call, incident_id)
    events = await call.c.db.from_store(lambda store: store.events(incident_id))
    found = view(events)
    if found is None:
        raise NotFound(f"incident {incident_id} has no {what} (yet)")
    return found


async def get_verdict(call: Call) -> VerdictView:
    """The incident's latest verdict (404 while it has none)."""
    return await _found(call, verdict_view, "verdict")


async def get_plan(call: Call) -> PlanView:
    """The incident's latest plan (404 while it has none)."""
    return await _found(call, plan_view, "plan")


async def get_timeline(call: Call) -> EventPage:
    """The incident's audit rows in the order they happened, one page at a time."""
    incident_id = call.path("incident_id")
    await incident_in_scope(call, incident_id)
    limit = limit_of(call, EVENTS_DEFAULT, EVENTS_MAX)
    cursor = decode_cursor(call, "timeline")
    events = await call.c.db.from_store(lambda store: store.events(incident_id))
    if cursor is not None:
        try:
            at, row = datetime.fromisoformat(str(cursor["at"])), int(cursor["id"])
        except (KeyError, ValueError, TypeError) as exc:
            raise FieldProblem("cursor is damaged: pass next_cursor as is", "cursor") from exc
        events = [e for e in events if (e.at, e.id) > (at, row)]
    last = events[limit - 1] if len(events) > limit else None
    return EventPage(
        items=events[:limit],
        next_cursor=encode_cursor("timeline", at=last.at.isoformat(), id=last.id) if last else None,
    )
