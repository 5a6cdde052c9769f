"""The scorecard (`/scorecard`): for each served cluster the user sees (narrowed by
``?cluster=``), how right Relaunch's recommendations were since ``?since=`` (an ISO time, or a
span back such as ``7d`` or ``12h``; by default the cluster's ``rollout.window_days``), the
promotions and demotions it suggests, and the audited mode changes. An admin makes a change
with one click (`POST /scorecard/mode`): the same audit row as `relaunch rollout promote`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relaunch.console.auth import ConsoleRole
from relaunch.console.scorecard_metrics import forget_scorecard, scorecard_of
from relaunch.console.web import (
    Cluster,
    Console,
    Problem,
    cluster_param,
    console,
    default_cluster,
    render,
    require,
    require_post,
    served_cluster,
)
from relaunch.models.errors import InvalidNameError
from relaunch.models.names import cluster_name
from relaunch.models.recovery import Mode
from relaunch.models.rollout import ModeChange, Recommendation, ScopeKind, Scorecard
from relaunch.rollout.policy import BadScopeError, change_mode, mode_changes
from relaunch.rollout.policy import parse_since as since_of

RECENT = 50  # recommendations listed per cluster, newest first
SPANS = ("24h", "7d", "30d")


class ClusterScorecard(BaseModel):
    """One cluster's part of the page."""

    cluster: str
    card: Scorecard
    recent: list[Recommendation]
    changes: list[ModeChange]  # newest first


def parse_since(value: str, now: datetime) -> datetime | None:
    """``?since=`` (relaunch.rollout.policy.parse_since); anything else is a 400."""
    try:
        return since_of(value, now)
    except ValueError as exc:
        raise Problem(str(exc)) from exc


async def cluster_scorecard(c: Console, cl: Cluster, since: datetime | None) -> ClusterScorecard:
    config = cl.config
    card, changes = await asyncio.gather(
        scorecard_of(c.db, config, since),
        c.db.from_store(lambda store: mode_changes(store, config.name)),
    )
    return ClusterScorecard(
        cluster=cl.name,
        card=card,
        recent=list(reversed(card.recommendations))[:RECENT],
        changes=list(reversed(changes)),
    )


def _href(**params: str) -> str:
    query = urlencode({k: v for k, v in params.items() if v})
    return f"/scorecard?{query}" if query else "/scorecard"


async def scorecard_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    wanted = cluster_param(request, auth)
    since_raw = request.query_params.get("since", "").strip()
    since = parse_since(since_raw, datetime.now(UTC))
    shown = [served_cluster(c, auth, wanted)] if wanted else c.served_for(auth.user)
    views = await asyncio.gather(*(cluster_scorecard(c, cl, since) for cl in shown))
    spans: list[dict[str, Any]] = [
        {"name": "window", "href": _href(cluster=wanted or ""), "active": not since_raw}
    ]
    spans += [
        {"name": s, "href": _href(cluster=wanted or "", since=s), "active": since_raw == s}
        for s in SPANS
    ]
    return render(
        request,
        "scorecard.html",
        auth,
        views=views,
        since=since_raw,
        spans=spans,
        cluster_filter=wanted or "",
        recent_limit=RECENT,
    )


def _choice(field: str, value: str, options: type[ScopeKind] | type[Mode]) -> Any:
    try:
        return options(value)
    except ValueError as exc:
        allowed = ", ".join(o.value for o in options)
        raise Problem(f"{field} must be one of {allowed}, not {value!r}") from exc


async def change(request: Request) -> Response:
    """Promote or demote a category or partition of a served cluster the admin sees; the
    audit row names the signed-in admin, and the reason (the form's, else the suggestion's
    why)."""
    auth, form = await require_post(request, ConsoleRole.ADMIN)
    c = console(request)
    raw = form.get("cluster", "").strip()
    try:
        wanted = cluster_name(raw) if raw else cluster_param(request, auth)
    except InvalidNameError as exc:
        raise Problem(exc.message) from exc
    cl = served_cluster(c, auth, wanted or default_cluster(c, auth))
    scope: ScopeKind = _choice("scope", form.get("scope", ""), ScopeKind)
    mode: Mode = _choice("mode", form.get("mode", ""), Mode)
    name = form.get("name", "").strip()
    reason = form.get("reason", "").strip() or form.get("why", "").strip()
    since = form.get("since", "").strip()
    parse_since(since, datetime.now(UTC))  # checked first: only a valid one goes into the link
    by = auth.user.name
    try:
        await c.db.from_store(
            lambda store: change_mode(store, cl.name, scope, name, mode, by=by, reason=reason)
        )
    except (BadScopeError, InvalidNameError) as exc:
        raise Problem(exc.message) from exc
    forget_scorecard(c.db, cl.name)
    return RedirectResponse(
        _href(cluster=cl.name if c.several else "", since=since), status_code=303
    )
