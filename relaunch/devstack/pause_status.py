"""`relaunch dev status`'s kill-switch lines: whether each cluster of the stack is paused
(`relaunch pause`). A paused cluster is not unhealthy: the line says so without failing."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.pause import pause_state
from relaunch.devstack.status import Part
from relaunch.models.errors import RelaunchError
from relaunch.models.pause import PauseState

if TYPE_CHECKING:
    from relaunch.devstack.stack import Stack


async def _states(database_url: str, clusters: list[str]) -> list[PauseState]:
    store = await AuditStore.open(database_url, timeout=3)
    try:
        return [await pause_state(store, name) for name in clusters]
    finally:
        await store.close()


def pause_parts(stack: Stack) -> list[Part]:
    """One line per cluster: ``paused by NAME: reason`` or ``not paused``."""
    names = [home.name for home in stack.clusters]
    try:
        states = asyncio.run(_states(stack.database_url, names))
    except RelaunchError as exc:
        return [Part(name="kill switch", address="unknown", healthy=True, detail=str(exc))]
    parts = []
    for state in states:
        when = f" since {state.at:%Y-%m-%d %H:%M:%S} UTC" if state.paused and state.at else ""
        parts.append(
            Part(
                name=f"kill switch {state.cluster}",
                address=(f"PAUSED by {state.by}: {state.reason}" if state.paused else "not paused"),
                healthy=True,
                detail=f"`relaunch unpause --cluster {state.cluster}`{when}"
                if state.paused
                else "",
            )
        )
    return parts
