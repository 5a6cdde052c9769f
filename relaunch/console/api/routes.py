"""The endpoints of `/api/v1` and the ASGI app that serves them under the console (mounted by
relaunch/console/app.py): the same tokens, roles, cluster scopes and sessions as its pages."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relaunch.console.api import decisions, incidents, nodes, pause, reports
from relaunch.console.api.endpoint import (
    CSRF_HEADER,
    CURSOR,
    Endpoint,
    Param,
    error_response,
    limit_param,
)
from relaunch.console.api.models import (
    DecisionAnswer,
    DecisionBody,
    EventPage,
    IncidentDetail,
    IncidentPage,
    Me,
    ModeChanges,
    NodeList,
    PlanView,
    Scorecards,
    VerdictView,
)
from relaunch.console.api.openapi import OPENAPI_PATH, document
from relaunch.console.auth import ConsoleRole
from relaunch.console.kpis import WINDOWS
from relaunch.console.routes_audit import KINDS
from relaunch.console.web import Console
from relaunch.models.pause import PauseState
from relaunch.models.recovery import Category
from relaunch.models.search_attributes import Stage

_TIME = {"type": "string", "format": "date-time"}
CLUSTER = Param("cluster", "only this cluster's (one the token sees)")
SINCE = Param("since", "from this time on (ISO 8601; UTC when no zone is given)", _TIME)
UNTIL = Param("until", "before this time (ISO 8601)", _TIME)
FILTERS = (
    CLUSTER,
    Param("job", "only this Slurm job's"),
    Param("node", "only those naming this node"),
    Param(
        "category",
        "only incidents whose verdict has this category",
        {"type": "string", "enum": [c.value for c in Category]},
    ),
    SINCE,
    UNTIL,
)
INCIDENT_ID = "/incidents/{incident_id}"
DECISION_HEADERS = (
    Param(
        "Idempotency-Key",
        "makes retries safe: every try of one decision sends the same key (a UUID)",
        {"type": "string", "pattern": r"^[A-Za-z0-9._:\-]{1,200}$"},
    ),
    Param(CSRF_HEADER, "with the session cookie only: its CSRF token (GET /api/v1/me)"),
)

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/me", reports.get_me, "Who the caller is", Me, tag="meta"),
    Endpoint(
        "GET",
        "/incidents",
        incidents.list_incidents,
        "Incidents, newest first",
        IncidentPage,
        query=(
            *FILTERS,
            Param(
                "stage",
                "only incidents whose latest stage is this",
                {"type": "string", "enum": [s.value for s in Stage]},
            ),
            limit_param(incidents.INCIDENTS_DEFAULT, incidents.INCIDENTS_MAX),
            CURSOR,
        ),
    ),
    Endpoint(
        "GET",
        INCIDENT_ID,
        incidents.get_incident,
        "One incident: stage, verdict, plan, mode, the request awaiting a decision",
        IncidentDetail,
        errors=(404,),
    ),
    Endpoint(
        "GET",
        f"{INCIDENT_ID}/timeline",
        incidents.get_timeline,
        "The incident's audit rows, oldest first",
        EventPage,
        query=(limit_param(incidents.EVENTS_DEFAULT, incidents.EVENTS_MAX), CURSOR),
        errors=(404,),
    ),
    Endpoint(
        "GET",
        f"{INCIDENT_ID}/verdict",
        incidents.get_verdict,
        "The incident's latest verdict",
        VerdictView,
        errors=(404,),
    ),
    Endpoint(
        "GET",
        f"{INCIDENT_ID}/plan",
        incidents.get_plan,
        "The incident's latest plan",
        PlanView,
        errors=(404,),
    ),
    *(
        Endpoint(
            "POST",
            f"{INCIDENT_ID}/{verb}",
            handler,
            f"{verb.capitalize()} the step the incident waits for (exactly once under retries)",
            DecisionAnswer,
            role=ConsoleRole.APPROVER,
            body=DecisionBody,
            headers=DECISION_HEADERS,
            errors=(404, 409, 413, 422),
        )
        for verb, handler in (
            ("approve", decisions.approve_incident),
            ("reject", decisions.reject_incident),
        )
    ),
    Endpoint(
        "GET",
        "/nodes",
        nodes.list_nodes,
        "The nodes of one cluster: Slurm state, drain, lifecycle, reputation",
        NodeList,
        query=(
            Param("cluster", "the cluster (default: the first the token sees)"),
            Param(
                "window",
                "the reputation's window (default 7d)",
                {"type": "string", "enum": list(WINDOWS)},
            ),
        ),
        errors=(404,),
        tag="nodes",
    ),
    Endpoint(
        "GET",
        "/nodes/{node}",
        nodes.get_node,
        "One node of one cluster",
        NodeList,
        query=(
            Param("cluster", "the node's cluster (default: the first the token sees)"),
            Param("window", "the reputation's window", {"type": "string", "enum": list(WINDOWS)}),
        ),
        errors=(404,),
        tag="nodes",
    ),
    Endpoint(
        "GET",
        "/audit",
        reports.search_audit,
        "Search the audit trail, newest row first",
        EventPage,
        query=(
            *FILTERS,
            Param("kind", "only rows of this kind", {"type": "string", "enum": list(KINDS)}),
            Param("action", "only plans and actions of this step"),
            Param("actor", "only rows by this actor"),
            Param("incident", "only this incident's rows"),
            limit_param(reports.AUDIT_DEFAULT, reports.AUDIT_MAX),
            CURSOR,
        ),
        tag="audit",
    ),
    Endpoint(
        "GET",
        "/scorecard",
        reports.get_scorecard,
        "Each cluster's scorecard: recommendations, responses and outcomes",
        Scorecards,
        query=(CLUSTER, Param("since", "recommendations from this time on", _TIME)),
        errors=(404,),
        tag="rollout",
    ),
    Endpoint(
        "GET",
        "/rollout",
        reports.get_rollout,
        "Each cluster's audited mode changes (promotions, demotions)",
        ModeChanges,
        query=(CLUSTER,),
        errors=(404,),
        tag="rollout",
    ),
    Endpoint(
        "GET",
        "/pause",
        pause.list_pauses,
        "Whether each cluster is paused (the kill switch), by whom and why",
        pause.PauseStates,
        query=(CLUSTER,),
        errors=(404,),
        tag="pause",
    ),
    *(
        Endpoint(
            "POST",
            f"/clusters/{{cluster}}/{verb}",
            handler,
            summary,
            PauseState,
            role=ConsoleRole.ADMIN,
            body=pause.PauseBody,
            headers=(DECISION_HEADERS[1],),
            errors=(403, 404, 413),
            tag="pause",
        )
        for verb, handler, summary in (
            ("pause", pause.pause_cluster, "Pause the cluster: Relaunch changes nothing on it"),
            ("unpause", pause.unpause_cluster, "Unpause the cluster: waiting steps go on"),
        )
    ),
)


def create_api(state: Console) -> Starlette:
    """The `/api/v1` app over the console's state (mount it at /api/v1)."""
    spec = document(ENDPOINTS)

    async def openapi(_: Request) -> Response:
        return JSONResponse(spec)

    async def on_http(_: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        words: dict[int, str] = {
            404: "no such API path: GET /api/v1/openapi.json lists them",
            405: "this path does not take that method: GET /api/v1/openapi.json lists them",
        }
        return error_response(status, words.get(status, "the request failed"))

    handlers: dict[Any, Any] = {404: on_http, 405: on_http}
    routes = [Route(OPENAPI_PATH, openapi), *(ep.route() for ep in ENDPOINTS)]
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.console = state
    return app
