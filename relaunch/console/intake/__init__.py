"""Signals pushed in, one module per intake: ``POST /intake/alertmanager`` (alertmanager.py),
``POST /intake/slurm`` (slurm.py), ``POST /intake/health`` (node-health events, health.py) and
the repair system's callback ``POST /intake/repair`` (repair.py), node agents' batches ``POST
/intake/agent`` (agent.py: the kernel's own messages, telemetry, heartbeats), over what they share
(common.py: the token and cluster, the capped body, the rate per token, audit rows, delivery).

Each request is addressed to one cluster the console serves (``?cluster=NAME``, or a Slurm
event's ``cluster`` field; the primary cluster by default) and handled with that cluster's own
configuration, scheduler and Temporal delivery only, so that a signal for one cluster never
starts or joins a recovery on another; an intake token limited to some clusters may address only
those. A request is checked whole before anything of it is stored: the token (intake; the
repair callback's own role, repair), the body, every field, and the sender's rate.
"""

from __future__ import annotations

from starlette.routing import Route

from relaunch.console.intake import agent, alertmanager, health, repair, slurm
from relaunch.console.intake.common import MAX_BODY, IntakeRefused, intake_incident

__all__ = ["MAX_BODY", "IntakeRefused", "intake_incident", "routes"]


def routes() -> list[Route]:
    return [
        Route("/intake/alertmanager", alertmanager.alertmanager, methods=["POST"]),
        Route("/intake/slurm", slurm.slurm, methods=["POST"]),
        Route("/intake/repair", repair.repair, methods=["POST"]),
        *health.routes(),
        *agent.routes(),
    ]
