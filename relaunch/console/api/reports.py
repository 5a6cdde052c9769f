"""The caller, the audit search, the scorecard and the audited mode changes."""

from __future__ import annotations

from datetime import datetime

from relaunch.connectors.audit import AuditStore
from relaunch.console.api.endpoint import (
    Call,
    FieldProblem,
    cluster_of,
    decode_cursor,
    encode_cursor,
    limit_of,
    time_of,
)
from relaunch.console.api.incidents import audit_filter, scoped
from relaunch.console.api.models import EventPage, Me, ModeChanges, Scorecards
from relaunch.console.routes_audit import FILTER_KEYS
from relaunch.console.scorecard_metrics import scorecard_of
from relaunch.console.web import Cluster, served_cluster
from relaunch.models.config import ClusterConfig
from relaunch.models.rollout import ModeChange, Scorecard
from relaunch.rollout.policy import mode_changes

AUDIT_FILTERS = (*FILTER_KEYS, "since", "until")
AUDIT_DEFAULT, AUDIT_MAX = 100, 1000


async def get_me(call: Call) -> Me:
    """Who the token (or session) is; a session's CSRF token for its state-changing calls."""
    auth = call.auth
    return Me(
        name=auth.user.name,
        role=auth.user.role,
        clusters=auth.user.clusters,
        csrf_token=auth.csrf if auth.sid is not None else None,
    )


async def search_audit(call: Call) -> EventPage:
    """The audit search: the audit page's filters, newest row first, keyset pages."""
    f = audit_filter(call, AUDIT_FILTERS)
    limit = limit_of(call, AUDIT_DEFAULT, AUDIT_MAX)
    cursor = decode_cursor(call, "audit")
    before: int | None = None
    if cursor is not None:
        value = cursor.get("before")
        if not isinstance(value, int) or value < 1:
            raise FieldProblem("cursor is damaged: pass next_cursor as is", "cursor")
        before = value
    rows, next_before = await call.c.db.search(
        f, before=before, limit=limit, clusters=scoped(call, f)
    )
    return EventPage(
        items=rows,
        next_cursor=encode_cursor("audit", before=next_before) if next_before else None,
    )


def _clusters(call: Call) -> list[Cluster]:
    """The served clusters asked for: ``?cluster=`` (403 outside the scope, 404 when not
    served here), else every served cluster the caller sees."""
    wanted = cluster_of(call)
    if wanted:
        return [served_cluster(call.c, call.auth, wanted)]
    return call.c.served_for(call.auth.user)


async def _scorecard(call: Call, config: ClusterConfig, since: datetime | None) -> Scorecard:
    return await scorecard_of(call.c.db, config, since)


async def get_scorecard(call: Call) -> Scorecards:
    """Each cluster's scorecard of recommendations since ``since`` (default: the configured
    window)."""
    since = time_of(call, "since")
    return Scorecards(items=[await _scorecard(call, cl.config, since) for cl in _clusters(call)])


async def _changes(call: Call, cluster: str) -> list[ModeChange]:
    async def query(store: AuditStore) -> list[ModeChange]:
        return await mode_changes(store, cluster)

    return await call.c.db.from_store(query)


async def get_rollout(call: Call) -> ModeChanges:
    """Each cluster's audited promotions and demotions, oldest first."""
    items: list[ModeChange] = []
    for cl in _clusters(call):
        items += await _changes(call, cl.name)
    return ModeChanges(items=items)
