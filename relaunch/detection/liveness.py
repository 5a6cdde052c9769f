"""The conviction rule for probes: a probe timeout alone never convicts a node.

A probe that gets no answer at all (``timeout``) is what a powered-off node looks like, and also
what a node looks like whose slurmd's listen backlog a job has filled with idle connections:
once the accept queue is full, the node's kernel drops every new SYN (no SYN-ACK, no reset), to
Relaunch's SYN probe and connect probe alike. Any job can do that to any node's slurmd port.
So a node the probes time out on is convicted only when nothing trusted says it is alive:

- its agent's heartbeat is fresh (the watcher's own clock saw it change lately), or
- Slurm's fresh read shows its slurmd responding (no ``NOT_RESPONDING``, not ``DOWN``).

Such a node is *probe-unreachable but alive*: recorded, at most a suspect, never fenced or
drained on the probes' word. A reset (``refused``: the node's kernel says nothing listens on the
port) or a network error (``unreachable: ...``) cannot be made by filling a backlog and still
convicts at once, as does a timeout once Slurm itself stops hearing from the node or its agent
falls silent. The cost: a powered-off node without an agent is convicted when Slurm flags it
``NOT_RESPONDING`` (its next ping after the failure), not after the probes' three seconds.
"""

from __future__ import annotations

from relaunch.models.scheduler import Node

NO_ANSWER = "timeout"  # the probes' detail for a probe that got nothing back


def alive_despite_probe(
    detail: str, node: Node | None, *, heartbeat_fresh: bool = False
) -> str | None:
    """Why a node whose slurmd a probe could not reach (``detail``: the probe's own word) is
    alive all the same, or None when the probe's word stands (see the module docstring).
    ``node`` is Slurm's fresh read of the node (None when Slurm does not list it)."""
    if detail != NO_ANSWER:
        return None  # refused or a network error: the node's kernel or the network said so
    if heartbeat_fresh:
        return "its agent's heartbeat is fresh"
    if node is not None and node.responding:
        return f"Slurm sees its slurmd responding ({node.display_state})"
    return None
