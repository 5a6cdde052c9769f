"""The conviction rule for probes: a probe timeout alone never convicts a node.

A probe that gets no answer at all (``timeout``) is what a powered-off node looks like, and also
what a node looks like whose slurmd's listen backlog a job has filled with idle connections:
once the accept queue is full, the node's kernel drops every new SYN (no SYN-ACK, no reset).
Any job can do that to any node's slurmd port.
The SYN probe tells the two apart: with the SYN's second copy it sends a bare ACK, which a live
kernel resets whether or not the listener's queue is full (``LISTEN_FULL``), while a host that
is gone or off the fabric answers neither (``SILENT``). A connect probe (no raw socket) or the
SSH prober cannot: its ``timeout`` is either. So a node is *probe-unreachable but alive* when

- its kernel resets the ACK (``LISTEN_FULL``), or
- a probe timed out and its agent's heartbeat is fresh (the watcher's own clock), or Slurm's
  fresh read shows its slurmd responding (no ``NOT_RESPONDING``, not ``DOWN``).

Such a node is recorded, at most a suspect, never fenced or drained on the probes' word. A reset
to the SYN (``refused``: nothing listens, slurmd is dead), ``SILENT`` or a network error cannot
be made by filling a backlog and convicts at once; a connect timeout does once Slurm itself
stops hearing from the node or its agent falls silent (a powered-off node without an agent,
probed by connects, is then convicted at Slurm's next ping, not after three seconds).
"""

from __future__ import annotations

from relaunch.connectors.liveness import LISTEN_FULL
from relaunch.models.scheduler import Node

NO_ANSWER = "timeout"  # a connect probe's (or the SSH prober's) detail when nothing came back


def alive_despite_probe(
    detail: str, node: Node | None, *, heartbeat_fresh: bool = False
) -> str | None:
    """Why a node whose slurmd a probe could not reach (``detail``: the probe's own word) is
    alive all the same, or None when the probe's word stands (see the module docstring).
    ``node`` is Slurm's fresh read of the node (None when Slurm does not list it)."""
    if detail == LISTEN_FULL:
        return "its kernel still resets a bare ACK on that port (slurmd's listen queue is full)"
    if detail != NO_ANSWER:
        return None  # refused, silent to a SYN and an ACK, or a network error
    if heartbeat_fresh:
        return "its agent's heartbeat is fresh"
    if node is not None and node.responding:
        return f"Slurm sees its slurmd responding ({node.display_state})"
    return None
