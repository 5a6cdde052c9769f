"""The kill switch through `/api/v1`: each cluster's pause state, and pause / unpause (admin).
The same audit rows as `relaunch pause` (relaunch/connectors/pause.py); the caller's name is
who paused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.pause import REASON_MAX, BadPauseError, pause_state, set_paused
from relaunch.console.api.endpoint import Call, FieldProblem
from relaunch.console.api.reports import _clusters
from relaunch.console.web import served_cluster
from relaunch.models.pause import PauseState

MAX_BODY = 4 * 1024


class PauseBody(BaseModel):
    """Why the cluster is paused (required for a pause; kept in the audit trail)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=REASON_MAX)


class PauseStates(BaseModel):
    """Whether each cluster asked for is paused, by whom, why and since when."""

    items: list[PauseState]


async def list_pauses(call: Call) -> PauseStates:
    """Each served cluster's pause state (``?cluster=`` for one)."""
    items = []
    for cl in _clusters(call):
        name = cl.name

        async def query(store: AuditStore, name: str = name) -> PauseState:
            return await pause_state(store, name)

        items.append(await call.c.db.from_store(query))
    return PauseStates(items=items)


async def pause_cluster(call: Call) -> PauseState:
    """Pause the cluster: Relaunch changes nothing on it until it is unpaused."""
    return await _set(call, paused=True)


async def unpause_cluster(call: Call) -> PauseState:
    """Unpause the cluster: the steps that waited go on."""
    return await _set(call, paused=False)


async def _set(call: Call, *, paused: bool) -> PauseState:
    cluster = served_cluster(call.c, call.auth, call.path("cluster")).name
    raw = await call.request.body()
    if len(raw) > MAX_BODY:
        raise FieldProblem(f"the body is larger than {MAX_BODY} bytes", "body", status=413)
    try:
        body = PauseBody.model_validate_json(raw) if raw.strip() else PauseBody()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise FieldProblem(f"{where}: {first['msg']} (the body takes reason)", where) from exc
    if paused and not body.reason.strip():
        raise FieldProblem("a pause needs a reason: say why in the body's reason", "reason")
    by = call.auth.user.name

    async def write(store: AuditStore) -> PauseState:
        return await set_paused(store, cluster, paused, by=by, reason=body.reason)

    try:
        state = await call.c.db.from_store(write)
    except BadPauseError as exc:
        raise FieldProblem(str(exc), "reason") from exc
    call.c.pauses[cluster] = state  # the pages' banner at once, not at the next read
    return state
