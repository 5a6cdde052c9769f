"""The notifier: follows the audit trail (new rows by id, like the console's live feed) and
tells each configured channel about recommendations, actions, failures and expiries.

- Only one notifier per cluster sends at a time: it holds a PostgreSQL advisory lock on a
  connection of its own, and one that cannot take it waits.
- Each (incident, event, channel) is sent at most once: after the service accepts, a
  ``notification`` row is recorded under a dedupe key, which is checked before sending.
- On start it looks back ``lookback_s`` so that what happened while no notifier ran is sent
  (the dedupe keys stop a repeat of what was sent already).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.connectors.notify.channels import NotificationError, send
from relaunch.connectors.notify.render import (
    STAGE_EVENTS,
    NotificationContext,
    PlanInfo,
    VerdictInfo,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.notify import ChannelSettings, NotifyEvent, NotifySettings
from relaunch.models.recovery import AuditRecord

log = logging.getLogger("relaunch.notify")


def lock_id(cluster: str) -> int:
    """The advisory lock of this cluster's notifier (a signed 64-bit key)."""
    digest = hashlib.sha256(f"relaunch-notify:{cluster}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def dedupe_key(incident: str, event: NotifyEvent, channel: ChannelSettings) -> str:
    return f"{incident}:notify:{event.value}:{channel.name}"


class Notifier:
    """Run with :meth:`run` until ``stop`` is set (the console runs it as a background task)."""

    def __init__(
        self,
        cluster: str,
        settings: NotifySettings,
        store: AuditStore,
        database_url: str,
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.cluster, self.settings, self.store = cluster, settings, store
        self._database_url = database_url
        self._client = client
        self._last: int | None = None
        self.sent: list[tuple[str, NotifyEvent, str]] = []  # what this process sent
        # httpx logs each request's URL at INFO (and httpcore its traffic at DEBUG): a webhook
        # URL is a secret.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)

    async def run(self, stop: asyncio.Event) -> None:
        client = self._client or httpx.AsyncClient(follow_redirects=False)
        try:
            while not stop.is_set():
                try:
                    await self._while_locked(client, stop)
                except (psycopg.OperationalError, RelaunchError) as exc:
                    log.warning("notifier: database unavailable (%s); retrying", exc)
                if not stop.is_set():
                    await _sleep(stop, self.settings.poll_interval_s)
        finally:
            if self._client is None:
                await client.aclose()

    async def _while_locked(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(
            self._database_url, autocommit=True
        ) as conn:
            while not stop.is_set():
                cur = await conn.execute(
                    "select pg_try_advisory_lock(%s)", (lock_id(self.cluster),)
                )
                row = await cur.fetchone()
                if row and row[0]:
                    break
                await _sleep(stop, self.settings.poll_interval_s)
            else:
                return
            log.info("notifier for %s: sending", self.cluster)
            while not stop.is_set():
                await self.poll_once(client)
                await conn.execute("select 1")  # the lock lives as long as this connection
                await _sleep(stop, self.settings.poll_interval_s)

    async def poll_once(self, client: httpx.AsyncClient) -> int:
        """Handle the stage rows recorded since the last poll; returns how many were sent."""
        if self._last is None:
            since = datetime.now(UTC) - timedelta(seconds=self.settings.lookback_s)
            self._last = await self.store.first_id_since(since, ["stage"])
        sent = 0
        while True:
            rows = await self.store.events_after(self._last, ["stage"])
            for row in rows:
                sent += await self._handle(client, row)
                self._last = row.id
            if len(rows) < 500:
                return sent

    async def _handle(self, client: httpx.AsyncClient, row: StoredEvent) -> int:
        event = STAGE_EVENTS.get(row.stage or "")
        channels = [c for c in self.settings.channels if event in c.events]
        if event is None or not channels:
            return 0
        incident = await self.store.incident_info(row.incident_id)
        if incident is None or incident["cluster"] != self.cluster:
            return 0
        ctx: NotificationContext | None = None
        sent = 0
        for channel in channels:
            key = dedupe_key(row.incident_id, event, channel)
            if await self.store.has_dedupe_key(key):
                continue
            ctx = ctx or await self._context(row, event, incident)
            try:
                attempts = await send(client, channel, ctx, self.settings)
            except NotificationError as exc:
                log.error("notification not sent: %s", exc.message)
                continue
            await self.store.record(
                AuditRecord(
                    incident_id=row.incident_id,
                    kind="notification",
                    at=datetime.now(UTC),
                    actor="relaunch",
                    summary=f"{event.value} sent to {channel.name} ({channel.type.value})",
                    data={
                        "event": event.value,
                        "channel": channel.name,
                        "type": channel.type.value,
                        "attempts": attempts,
                        "row": row.id,
                    },
                ),
                dedupe_key=key,
            )
            self.sent.append((row.incident_id, event, channel.name))
            sent += 1
        return sent

    async def _context(
        self, row: StoredEvent, event: NotifyEvent, incident: dict[str, Any]
    ) -> NotificationContext:
        events = await self.store.events(row.incident_id)
        verdict = next((e for e in reversed(events) if e.kind == "verdict"), None)
        plan = next((e for e in reversed(events) if e.kind == "plan"), None)
        refusals = [e.summary for e in events if e.kind == "guard" and "REFUSED" in e.summary]
        base = self.settings.console_url
        return NotificationContext(
            event=event,
            incident_id=row.incident_id,
            cluster=str(incident["cluster"]),
            job_id=str(incident["job_id"]),
            attempt=int(incident["attempt"]),
            stage=row.stage or "",
            summary=row.summary,
            at=row.at,
            verdict=VerdictInfo.model_validate(verdict.data) if verdict else None,
            plan=PlanInfo.model_validate(plan.data) if plan else None,
            refusals=refusals,
            link=f"{base.rstrip('/')}/incidents/{row.incident_id}" if base else row.incident_id,
        )


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
