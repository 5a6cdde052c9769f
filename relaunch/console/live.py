"""Live updates: one poller for every client, fanned out as server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from relaunch.console.queries import ConsoleDb
from relaunch.models.errors import RelaunchError

log = logging.getLogger("relaunch.console.live")

KEEPALIVE_S = 15.0


class Broadcaster:
    """Polls ``audit_events where id > last`` every ``interval`` seconds while anyone listens
    (a single query for all clients) and hands each new row to every subscriber."""

    def __init__(self, db: ConsoleDb, interval: float = 0.5) -> None:
        self._db, self._interval = db, interval
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._task: asyncio.Task[None] | None = None
        self._last: int | None = None

    async def _poll(self) -> None:
        while self._subscribers:
            try:
                if self._last is None:
                    self._last = await self._db.latest_id()
                for row in await self._db.events_after(self._last):
                    self._last = max(self._last, int(row["id"]))
                    for queue in list(self._subscribers):
                        if queue.qsize() < 1000:  # a stalled client loses rows, not memory
                            queue.put_nowait(row)
            except RelaunchError as exc:
                log.warning("live poll: %s", exc.message)
            await asyncio.sleep(self._interval)
        self._task = None

    async def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        """A queue of the rows recorded from now on (the start is read before returning)."""
        if self._last is None:
            self._last = await self._db.latest_id()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._subscribers.add(queue)
        if self._task is None:
            self._task = asyncio.create_task(self._poll())
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(queue)

    async def close(self) -> None:
        self._subscribers.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def sse(row: dict[str, Any]) -> str:
    """One ``audit`` event: the row's id, incident, kind, stage, actor, time and summary."""
    payload = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
    return f"id: {row['id']}\nevent: audit\ndata: {json.dumps(payload)}\n\n"


async def stream(
    broadcaster: Broadcaster,
    queue: asyncio.Queue[dict[str, Any]],
    sees: Callable[[str], bool] | None = None,
) -> AsyncIterator[str]:
    """The body of ``/events``: rows as they come (only those of clusters ``sees`` accepts,
    when given), a comment line as keep-alive."""
    try:
        yield "retry: 2000\n: connected\n\n"
        while True:
            try:
                row = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if sees is None or sees(str(row.get("cluster"))):
                yield sse(row)
    finally:
        broadcaster.unsubscribe(queue)
