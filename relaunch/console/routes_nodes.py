"""Nodes of one served cluster (``?cluster=``): Slurm state, drain reason, who drained it and
why, reputation, and Resume (admin, only for nodes Relaunch drained, through that cluster's own
scheduler)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from urllib.parse import quote

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relaunch.connectors.audit import NodeReputation
from relaunch.console import kpis
from relaunch.console.auth import ConsoleRole
from relaunch.console.queries import NodeDrain
from relaunch.console.web import (
    Conflict,
    NotFound,
    Problem,
    Unavailable,
    cluster_param,
    console,
    default_cluster,
    render,
    require,
    require_post,
    served_cluster,
)
from relaunch.models.errors import InvalidNameError, NodeNotFoundError, RelaunchError
from relaunch.models.names import cluster_name
from relaunch.models.recovery import DRAIN_REASON_PREFIX, AuditRecord
from relaunch.models.scheduler import Node

SCHEDULER_TIMEOUT_S = 5.0
REPUTATION_TTL_S = 15.0  # incidents per node over days: fresh enough, and not re-read per view


class NodeView(BaseModel):
    name: str
    node: Node | None
    drain: NodeDrain | None
    reputation: NodeReputation | None

    @property
    def drained_by_relaunch(self) -> bool:
        return (
            self.node is not None
            and self.node.drain_flag
            and self.node.reason.startswith(DRAIN_REASON_PREFIX)
            and self.drain is not None
            and self.drain.step in {"drain", "fence"}
        )


def node_views(
    nodes: list[Node], drains: dict[str, NodeDrain], reputation: list[NodeReputation]
) -> list[NodeView]:
    rep = {r.node: r for r in reputation}
    names = sorted({n.name for n in nodes} | set(drains) | set(rep))
    by_name = {n.name: n for n in nodes}
    return [
        NodeView(name=n, node=by_name.get(n), drain=drains.get(n), reputation=rep.get(n))
        for n in names
    ]


async def nodes_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    try:
        window, span = kpis.parse_window(request.query_params.get("window", "7d"))
    except kpis.BadWindowError as exc:
        raise Problem(str(exc)) from exc
    cl = served_cluster(c, auth, cluster_param(request, auth) or default_cluster(c, auth))
    sched = cl.services.scheduler
    nodes: list[Node] = []
    slurm_error: str | None = None
    if sched is None:
        slurm_error = "no scheduler configured for the console"
    drains, reputation = await asyncio.gather(
        c.db.node_drains(cl.name),
        c.db.cached(
            ("reputation", cl.name, window),
            REPUTATION_TTL_S,
            lambda: c.db.reputation(cl.name, datetime.now(UTC) - span),
        ),
    )
    if sched is not None:
        try:
            nodes = await asyncio.wait_for(sched.list_nodes(), SCHEDULER_TIMEOUT_S)
        except (RelaunchError, TimeoutError) as exc:
            slurm_error = f"Slurm does not answer: {exc}"
    return render(
        request,
        "nodes.html",
        auth,
        cluster=cl.name,
        nodes=node_views(nodes, drains, reputation),
        slurm_error=slurm_error,
        window=window,
        windows=list(kpis.WINDOWS),
    )


async def resume(request: Request) -> Response:
    auth, form = await require_post(request, ConsoleRole.ADMIN)
    c = console(request)
    name = request.path_params["node"]
    wanted = form.get("cluster", "").strip() or cluster_param(request, auth)
    cl = served_cluster(c, auth, _checked_cluster(wanted) if wanted else default_cluster(c, auth))
    sched = cl.services.scheduler
    if sched is None:
        raise Unavailable("this console has no scheduler connection")
    try:
        node = await asyncio.wait_for(sched.get_node(name), SCHEDULER_TIMEOUT_S)
    except InvalidNameError as exc:
        raise Problem(exc.message) from exc
    except NodeNotFoundError as exc:
        raise NotFound(exc.message) from exc
    except (RelaunchError, TimeoutError) as exc:
        raise Unavailable(f"Slurm does not answer: {exc}") from exc
    drain = (await c.db.node_drains(cl.name)).get(name)
    view = NodeView(name=name, node=node, drain=drain, reputation=None)
    if not view.drained_by_relaunch or drain is None:
        raise Conflict(
            f"node {name} was not drained by Relaunch ({node.display_state}"
            + (f", reason {node.reason!r}" if node.reason else "")
            + "): resume it with Slurm's own tools"
        )
    try:
        result = await sched.resume_node(name)
    except RelaunchError as exc:
        raise Unavailable(f"resume {name} failed: {exc}") from exc
    verb = "done" if result.changed else f"unchanged ({result.note})"
    await c.db.store.record(
        AuditRecord(
            incident_id=drain.incident_id,
            kind="action",
            at=datetime.now(UTC),
            actor=auth.user.name,
            nodes=[name],
            summary=f"resume {name}: {verb} (console, by {auth.user.name})",
            data={"step": "resume", "by": auth.user.name, **result.model_dump(mode="json")},
        )
    )
    target = f"/nodes?cluster={quote(cl.name, safe='')}" if c.several else "/nodes"
    return RedirectResponse(target, status_code=303)


def _checked_cluster(value: str) -> str:
    try:
        return cluster_name(value)
    except InvalidNameError as exc:
        raise Problem(exc.message) from exc
