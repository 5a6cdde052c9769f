"""The kill switch in the audit trail: pause and unpause a cluster, and read whether it is
paused (relaunch/models/pause.py says what a pause stops)."""

from __future__ import annotations

from datetime import UTC, datetime

from relaunch.connectors.audit import AuditStore
from relaunch.models.errors import RelaunchError
from relaunch.models.names import person
from relaunch.models.pause import (
    PAUSE,
    UNPAUSE,
    ClusterPausedError,
    PauseState,
    control_incident,
)
from relaunch.models.recovery import AuditRecord

REASON_MAX = 300


class BadPauseError(RelaunchError):
    """A pause without a valid name or reason."""


def _by(by: str) -> str:
    return person(by, "pauses", BadPauseError)


def _reason(reason: str) -> str:
    return "".join(ch for ch in reason.strip() if ch.isprintable())[:REASON_MAX]


async def pause_state(store: AuditStore, cluster: str) -> PauseState:
    """The cluster's state now: its latest pause or unpause row (none: not paused). The
    control record holds only these rows, two per pause: reading it whole stays cheap."""
    rows = [r for r in await store.events(control_incident(cluster)) if r.kind in (PAUSE, UNPAUSE)]
    if not rows:
        return PauseState(cluster=cluster)
    last = rows[-1]
    return PauseState(
        cluster=cluster,
        paused=last.kind == PAUSE,
        by=last.actor,
        reason=str(last.data.get("reason") or ""),
        at=last.at,
    )


async def unless_paused(store: AuditStore, cluster: str) -> None:
    """Raise ClusterPausedError when the cluster is paused: the one gate in front of every
    change Relaunch makes to a cluster."""
    state = await pause_state(store, cluster)
    if state.paused:
        raise ClusterPausedError(state)


async def set_paused(
    store: AuditStore, cluster: str, paused: bool, *, by: str, reason: str = ""
) -> PauseState:
    """Record a pause (``paused``; a reason is required) or an unpause of ``cluster``."""
    by, reason = _by(by), _reason(reason)
    if paused and not reason:
        raise BadPauseError("a pause needs a reason", hint="say why with --reason")
    incident = control_incident(cluster)
    await store.ensure_incident(incident, cluster, "", 0)
    at = datetime.now(UTC)
    kind = PAUSE if paused else UNPAUSE
    verb = "paused" if paused else "unpaused"
    await store.record(
        AuditRecord(
            incident_id=incident,
            kind=kind,
            at=at,
            actor=by,
            summary=f"cluster {cluster} {verb} by {by}" + (f": {reason}" if reason else ""),
            data={"reason": reason, "paused": paused},
        )
    )
    return PauseState(cluster=cluster, paused=paused, by=by, reason=reason, at=at)
