"""Audit search: filters, keyset paging on the row id, CSV and JSON export; only the rows of
the clusters the user sees."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relaunch.connectors.audit import StoredEvent
from relaunch.console.queries import AuditFilter
from relaunch.console.web import Auth, Problem, check_cluster, console, render, require
from relaunch.models.recovery import Category

KINDS = (
    "detection",
    "evidence",
    "verdict",
    "plan",
    "guard",
    "stage",
    "approval",
    "rejection",
    "decision_request",
    "action",
    "resubmit_intent",
    "lineage",
    "verify",
    "suspect",
    "intake",
    "health_event",
    "external_drain",
    "notification_queued",
    "notification",
    "notification_failed",
)
PAGE = 50
EXPORT_DEFAULT, EXPORT_MAX = 1000, 10000
_WORD = re.compile(r"^[A-Za-z0-9_.:@/\-]{1,200}$")
FILTER_KEYS = ("cluster", "job", "node", "category", "kind", "action", "actor", "incident")


def _time(name: str, value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise Problem(
            f"{name} must be an ISO 8601 time such as 2026-05-01T12:00, not {value!r}"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_filter(params: QueryParams) -> AuditFilter:
    """The query's filters, each checked (a bad value is a 400, never a query)."""
    values: dict[str, Any] = {}
    for key in FILTER_KEYS:
        value = params.get(key, "").strip()
        if not value:
            continue
        if not _WORD.match(value):
            raise Problem(f"{key} {value!r} has characters a {key} never has")
        values[key] = value
    if "category" in values and values["category"] not in {c.value for c in Category}:
        raise Problem(
            f"category must be one of {', '.join(c.value for c in Category)}, "
            f"not {values['category']!r}"
        )
    if "kind" in values and values["kind"] not in KINDS:
        raise Problem(f"kind must be one of {', '.join(KINDS)}, not {values['kind']!r}")
    for key in ("since", "until"):
        if params.get(key, "").strip():
            values[key] = _time(key, params[key].strip())
    return AuditFilter(**values)


def _scoped(auth: Auth, f: AuditFilter) -> list[str] | None:
    """The clusters whose rows a search may return: the filter's own (if the user sees it),
    else the user's scope."""
    if f.cluster:
        check_cluster(auth, f.cluster)
        return [f.cluster]
    return auth.user.clusters


def _int(params: QueryParams, key: str, default: int | None, low: int, high: int) -> int | None:
    raw = params.get(key, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise Problem(f"{key} must be a whole number from {low} to {high}, not {raw!r}")
    return int(raw)


def _query(f: AuditFilter, **extra: object) -> str:
    params = {
        k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in f.model_dump().items()
    }
    params.update(extra)
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


async def audit_page(request: Request) -> Response:
    auth = require(request)
    f = parse_filter(request.query_params)
    before = _int(request.query_params, "before", None, 1, 2**62)
    rows, next_before = await console(request).db.search(
        f, before=before, limit=PAGE, clusters=_scoped(auth, f)
    )
    return render(
        request,
        "audit.html",
        auth,
        rows=rows,
        f=f,
        kinds=KINDS,
        categories=[c.value for c in Category],
        next_url=f"/audit?{_query(f, before=next_before)}" if next_before else None,
        export_query=_query(f),
        first_page=before is None,
    )


def _row(e: StoredEvent) -> dict[str, Any]:
    return json.loads(e.model_dump_json())  # type: ignore[no-any-return]


async def audit_json(request: Request) -> Response:
    auth = require(request)
    f = parse_filter(request.query_params)
    before = _int(request.query_params, "before", None, 1, 2**62)
    limit = _int(request.query_params, "limit", EXPORT_DEFAULT, 1, EXPORT_MAX) or EXPORT_DEFAULT
    rows, next_before = await console(request).db.search(
        f, before=before, limit=limit, clusters=_scoped(auth, f)
    )
    return JSONResponse({"rows": [_row(e) for e in rows], "next_before": next_before})


def _cell(text: str) -> str:
    # A spreadsheet would run a cell that starts with one of these as a formula.
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


async def audit_csv(request: Request) -> Response:
    auth = require(request)
    f = parse_filter(request.query_params)
    before = _int(request.query_params, "before", None, 1, 2**62)
    limit = _int(request.query_params, "limit", EXPORT_DEFAULT, 1, EXPORT_MAX) or EXPORT_DEFAULT
    rows, next_before = await console(request).db.search(
        f, before=before, limit=limit, clusters=_scoped(auth, f)
    )
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["id", "at", "incident_id", "kind", "stage", "actor", "nodes", "summary", "data"]
    )
    for e in rows:
        writer.writerow(
            [
                e.id,
                e.at.isoformat(),
                e.incident_id,
                e.kind,
                e.stage or "",
                _cell(e.actor),
                " ".join(e.nodes),
                _cell(e.summary),
                json.dumps(e.data, sort_keys=True, default=str),
            ]
        )
    headers = {"content-disposition": 'attachment; filename="relaunch-audit.csv"'}
    if next_before:
        headers["x-next-before"] = str(next_before)
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)
