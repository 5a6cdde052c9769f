"""Nodes of one served cluster (``?cluster=``): Slurm state, drain reason, who drained it and
why, reputation, Resume (admin, only for nodes Relaunch drained, through that cluster's own
scheduler), each node's lifecycle (docs/lifecycle.md): its stage, the checks that ran with
their output, and Approve / Reject for the step it waits for (approver, through that cluster's
own Temporal decider, as the incident page and `relaunch approve`), and what other systems said
of it in the window: drains Relaunch did not make, health events pushed in."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relaunch.connectors.audit import NodeReputation, StoredEvent
from relaunch.connectors.pause import pause_state
from relaunch.console import kpis
from relaunch.console.auth import ConsoleRole
from relaunch.console.lifecycles import LIFECYCLE_KINDS, LifecycleView, lifecycle_views
from relaunch.console.queries import NodeDrain
from relaunch.console.routes_incident import send_decision
from relaunch.console.web import (
    Cluster,
    Conflict,
    Console,
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
from relaunch.models.intake import history_nodes
from relaunch.models.lifecycle import parse_lifecycle_id
from relaunch.models.names import cluster_name
from relaunch.models.recovery import DRAIN_REASON_PREFIX, AuditRecord
from relaunch.models.scheduler import Node

SCHEDULER_TIMEOUT_S = 5.0
REPUTATION_TTL_S = 15.0  # incidents per node over days: fresh enough, and not re-read per view
OUTSIDE_SHOWN = 5  # a node's latest rows from outside Relaunch, on the page
OUTSIDE_READ = 2000  # rows from outside Relaunch read for one page (the window's latest)


class NodeView(BaseModel):
    name: str
    node: Node | None
    drain: NodeDrain | None
    reputation: NodeReputation | None
    lifecycle: LifecycleView | None = None
    outside: list[StoredEvent] = Field(default_factory=list)  # from outside Relaunch, oldest first

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
    nodes: list[Node],
    drains: dict[str, NodeDrain],
    reputation: list[NodeReputation],
    lifecycles: dict[str, LifecycleView] | None = None,
    outside: list[StoredEvent] | None = None,
) -> list[NodeView]:
    rep = {r.node: r for r in reputation}
    life = lifecycles or {}
    said: dict[str, list[StoredEvent]] = {}
    for row in outside or []:
        for name in history_nodes(row.nodes):
            said.setdefault(name, []).append(row)
    names = sorted({n.name for n in nodes} | set(drains) | set(rep) | set(life) | set(said))
    by_name = {n.name: n for n in nodes}
    return [
        NodeView(
            name=n,
            node=by_name.get(n),
            drain=drains.get(n),
            reputation=rep.get(n),
            lifecycle=life.get(n),
            outside=said.get(n, [])[-OUTSIDE_SHOWN:],
        )
        for n in names
    ]


async def cluster_nodes(
    c: Console, cl: Cluster, window: str, span: timedelta, *, outside: bool = True
) -> tuple[list[NodeView], str | None]:
    """The views of a cluster's nodes (Slurm's state, drains, reputation over ``span``, the
    latest lifecycle, and with ``outside`` what other systems said of them), and what kept
    Slurm from answering (None when it did): the nodes page's and ``/api/v1/nodes``."""
    sched = cl.services.scheduler
    nodes: list[Node] = []
    slurm_error: str | None = None
    if sched is None:
        slurm_error = "no scheduler configured for the console"

    async def said() -> list[StoredEvent]:
        if not outside:
            return []
        return await c.db.from_store(
            lambda store: store.outside_events(
                cl.name, datetime.now(UTC) - span, limit=OUTSIDE_READ
            )
        )

    drains, reputation, stages, others = await asyncio.gather(
        c.db.node_drains(cl.name),
        c.db.cached(
            ("reputation", cl.name, window),
            REPUTATION_TTL_S,
            lambda: c.db.reputation(cl.name, datetime.now(UTC) - span),
        ),
        c.db.node_stages(cl.name),
        said(),
    )
    # Each node's latest lifecycle: its latest checks and its pending step, in one statement.
    rows = await c.db.latest_rows([s.incident_id for s in stages.values()], LIFECYCLE_KINDS)
    lifecycles = lifecycle_views(stages, rows, cl.config.policy.approval_timeout_s)
    if sched is not None:
        try:
            nodes = await asyncio.wait_for(sched.list_nodes(), SCHEDULER_TIMEOUT_S)
        except (RelaunchError, TimeoutError) as exc:
            slurm_error = f"Slurm does not answer: {exc}"
    return node_views(nodes, drains, reputation, lifecycles, others), slurm_error


async def nodes_page(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    try:
        window, span = kpis.parse_window(request.query_params.get("window", "7d"))
    except kpis.BadWindowError as exc:
        raise Problem(str(exc)) from exc
    cl = served_cluster(c, auth, cluster_param(request, auth) or default_cluster(c, auth))
    views, slurm_error = await cluster_nodes(c, cl, window, span)
    return render(
        request,
        "nodes.html",
        auth,
        cluster=cl.name,
        nodes=views,
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
    # The kill switch holds for a person's button too: nothing changes a paused cluster.
    state = await c.db.from_store(lambda store: pause_state(store, cl.name))
    if state.paused:
        raise Conflict(f"{state.describe()}: resume {name} after `relaunch unpause`")
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


async def decide_lifecycle(request: Request) -> Response:
    """Approve / Reject the step a node's lifecycle waits for, from the nodes page: the
    incident page's rules (approver role, CSRF, the lifecycle's cluster in the token's scope
    and served here) and its path to Temporal; the form names the lifecycle and the request it
    decides, so that a stale page never decides a later step."""
    decision = request.path_params["decision"]
    if decision not in {"approve", "reject"}:
        raise NotFound(f"no such decision {decision!r}")
    auth, form = await require_post(request, ConsoleRole.APPROVER)
    c = console(request)
    node = request.path_params["node"]
    lifecycle = form.get("lifecycle", "").strip()
    parsed = parse_lifecycle_id(lifecycle)
    if parsed is None or parsed[1] != node:
        raise Problem(f"{lifecycle!r} is not a lifecycle of node {node!r}")
    if not form.get("request_id", "").strip():
        raise Problem("the form names no request to decide: reload the page")
    # Whose it is, and whether the user may decide it: the audit trail's row, not the form.
    cluster = await send_decision(request, auth, lifecycle, decision, form)
    target = f"/nodes?cluster={quote(cluster, safe='')}" if c.several else "/nodes"
    return RedirectResponse(target, status_code=303)


def _checked_cluster(value: str) -> str:
    try:
        return cluster_name(value)
    except InvalidNameError as exc:
        raise Problem(exc.message) from exc
