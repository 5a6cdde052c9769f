"""Nodes of one served cluster: Slurm's state and drain reason, the latest drain recorded for
each, its lifecycle (stage, latest checks, the step waiting for a decision) and its reputation
— what the nodes page shows, from the same queries."""

from __future__ import annotations

from relaunch.console import kpis
from relaunch.console.api.endpoint import Call, FieldProblem, cluster_of
from relaunch.console.api.models import NodeItem, NodeList
from relaunch.console.routes_nodes import NodeView, cluster_nodes
from relaunch.console.web import NotFound, default_cluster, served_cluster
from relaunch.models.errors import InvalidNameError
from relaunch.models.names import node_name


def _item(cluster: str, view: NodeView) -> NodeItem:
    node = view.node
    return NodeItem(
        name=view.name,
        cluster=cluster,
        slurm=node,
        state=node.display_state if node else None,
        drain_reason=node.reason if node and node.reason else None,
        drained_by_relaunch=view.drained_by_relaunch,
        drain=view.drain,
        lifecycle=view.lifecycle,
        lifecycle_stage=view.lifecycle.stage if view.lifecycle else None,
        reputation=view.reputation,
    )


async def _nodes(call: Call) -> NodeList:
    c, auth = call.c, call.auth
    try:
        window, span = kpis.parse_window(call.param("window") or "7d")
    except kpis.BadWindowError as exc:
        raise FieldProblem(str(exc), "window") from exc
    cl = served_cluster(c, auth, cluster_of(call) or default_cluster(c, auth))
    views, slurm_error = await cluster_nodes(c, cl, window, span, outside=False)
    return NodeList(
        cluster=cl.name,
        window=window,
        slurm_error=slurm_error,
        items=[_item(cl.name, v) for v in views],
    )


async def list_nodes(call: Call) -> NodeList:
    """The nodes of one cluster (``?cluster=``; the first the caller sees by default)."""
    return await _nodes(call)


async def get_node(call: Call) -> NodeList:
    """One node of one cluster, in a list of one (its cluster and Slurm's error with it)."""
    try:
        name = node_name(call.path("node"))
    except InvalidNameError as exc:
        raise FieldProblem(exc.message, "node") from exc
    found = await _nodes(call)
    items = [n for n in found.items if n.name == name]
    if not items:
        raise NotFound(f"cluster {found.cluster} has no node {name!r} (Slurm or the audit trail)")
    return found.model_copy(update={"items": items})
