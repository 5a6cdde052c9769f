"""The notifier: follows the audit trail (new rows by id, like the console's live feed) and
tells each configured channel about recommendations, actions, failures and expiries, through an
outbox in the audit trail itself.

- Recorded before sent: for each (incident, event, channel) a ``notification_queued`` row (the
  message's context, its idempotency key) is recorded first; only what is in the outbox is sent.
- Sent until delivered: a notification the service does not accept (connection errors, 429,
  5xx) stays in the outbox and is tried again, with the backoff going on up to
  ``retry_interval_max_s``, for ``retry_for_s`` (a day by default): a receiver down for hours
  still gets it. One that the service refuses (another 4xx), or that is still undelivered
  after ``retry_for_s``, is given up: a ``notification_failed`` row says why.
- Delivered once: when the service accepts, a ``notification`` row is recorded under the
  (incident, event, channel) dedupe key, and nothing with that row is sent again. When the
  database is unreachable at that moment, the notifier remembers the delivery and records it
  once the database is back, without sending again. Only a notifier that dies between the
  service's answer and that row sends the notification a second time after its restart (at most
  once more per such crash); every delivery of one notification carries the same
  ``Idempotency-Key`` header (and a webhook's body the same ``idempotency_key``), so a receiver
  that keeps the keys it has seen drops the repeat. PagerDuty's dedup_key is the incident id.
- Only one notifier per cluster sends at a time: it holds a PostgreSQL advisory lock on a
  connection of its own, and one that cannot take it waits.
- On start it looks back ``lookback_s`` so that what happened while no notifier ran is queued
  (the dedupe keys stop a repeat of what was queued or sent already).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
from psycopg_pool import PoolTimeout

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.connectors.notify.channels import NotificationError, send
from relaunch.connectors.notify.render import (
    STAGE_EVENTS,
    NotificationContext,
    PlanInfo,
    VerdictInfo,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.notify import ChannelSettings, NotifyEvent, NotifySettings
from relaunch.models.recovery import AuditRecord

log = logging.getLogger("relaunch.notify")


def lock_id(cluster: str) -> int:
    """The advisory lock of this cluster's notifier (a signed 64-bit key)."""
    digest = hashlib.sha256(f"relaunch-notify:{cluster}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def dedupe_key(incident: str, event: NotifyEvent, channel: ChannelSettings) -> str:
    """The key of the row that says this notification was delivered."""
    return f"{incident}:notify:{event.value}:{channel.name}"


def idempotency_key(incident: str, event: NotifyEvent, channel: ChannelSettings) -> str:
    """What every delivery of this notification carries (an opaque, header-safe digest)."""
    return hashlib.sha256(dedupe_key(incident, event, channel).encode()).hexdigest()[:32]


class _Waiting:
    """An outbox entry this notifier failed to deliver: when to try it next."""

    def __init__(self) -> None:
        self.passes = 0
        self.attempts = 0
        self.next_at = 0.0


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
        self._waiting: dict[str, _Waiting] = {}  # outbox key -> backoff of an undelivered one
        self._delivered: dict[str, int] = {}  # outbox key -> attempts, accepted, not yet recorded
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
                except (psycopg.Error, PoolTimeout, RelaunchError) as exc:
                    log.warning("notifier: database unavailable (%s); retrying", exc)
                if not stop.is_set():
                    await _sleep(stop, self.settings.poll_interval_s)
        finally:
            if self._client is None:
                await client.aclose()

    async def _while_locked(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(
            self._database_url, autocommit=True, connect_timeout=10
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
        """Queue what the stage rows recorded since the last poll announce, then send what the
        outbox holds and is due; returns how many were delivered."""
        await self.enqueue()
        return await self.deliver(client)

    async def enqueue(self) -> int:
        """Record an outbox row for each (stage row, subscribed channel) not queued yet;
        returns how many were queued."""
        if self._last is None:
            since = datetime.now(UTC) - timedelta(seconds=self.settings.lookback_s)
            self._last = await self.store.first_id_since(since, ["stage"])
        queued = 0
        while True:
            rows = await self.store.events_after(self._last, ["stage"])
            for row in rows:
                queued += await self._queue(row)
                self._last = row.id
            if len(rows) < 500:
                return queued

    async def _queue(self, row: StoredEvent) -> int:
        event = STAGE_EVENTS.get(row.stage or "")
        channels = [c for c in self.settings.channels if event in c.events]
        if event is None or not channels:
            return 0
        incident = await self.store.incident_info(row.incident_id)
        if incident is None or incident["cluster"] != self.cluster:
            return 0
        ctx: NotificationContext | None = None
        queued = 0
        for channel in channels:
            sent_key = dedupe_key(row.incident_id, event, channel)
            if await self.store.has_dedupe_key(sent_key):
                continue  # delivered (before the outbox existed, or by another notifier)
            ctx = ctx or await self._context(row, event, incident)
            queued += await self.store.record(
                AuditRecord(
                    incident_id=row.incident_id,
                    kind="notification_queued",
                    at=datetime.now(UTC),
                    actor="relaunch",
                    summary=f"{event.value} for {channel.name} ({channel.type.value}) queued",
                    data={
                        "event": event.value,
                        "channel": channel.name,
                        "type": channel.type.value,
                        "row": row.id,
                        "sent_key": sent_key,
                        "failed_key": f"{sent_key}:failed",
                        "idempotency_key": idempotency_key(row.incident_id, event, channel),
                        "context": ctx.model_dump(mode="json"),
                    },
                ),
                dedupe_key=f"{sent_key}:queued",
            )
        return queued

    async def deliver(self, client: httpx.AsyncClient) -> int:
        """Send each due notification in the outbox once; returns how many were delivered."""
        now = datetime.now(UTC)
        # Twice the retry window: what outlived it while no notifier ran is given up, in words.
        since = now - timedelta(seconds=2 * self.settings.retry_for_s)
        by_name = {c.name: c for c in self.settings.channels}
        sent = 0
        for item in await self.store.pending_notifications(self.cluster, since):
            key = str(item.data["sent_key"])
            channel = by_name.get(str(item.data["channel"]))
            if channel is None:
                await self._give_up(item, "the channel is no longer configured")
                continue
            if key in self._delivered:  # accepted earlier; the database was away since
                await self._mark_sent(item, channel, self._delivered[key])
                continue
            if (now - item.at).total_seconds() >= self.settings.retry_for_s:
                await self._give_up(
                    item, f"not delivered within {self.settings.retry_for_s:g}s of being queued"
                )
                continue
            waiting = self._waiting.get(key)
            if waiting is not None and waiting.next_at > time.monotonic():
                continue
            sent += await self._send(client, item, channel, waiting)
        return sent

    async def _send(
        self,
        client: httpx.AsyncClient,
        item: StoredEvent,
        channel: ChannelSettings,
        waiting: _Waiting | None,
    ) -> int:
        key = str(item.data["sent_key"])
        ctx = NotificationContext.model_validate(item.data["context"])
        try:
            attempts = await send(
                client,
                channel,
                ctx,
                self.settings,
                idempotency_key=str(item.data["idempotency_key"]),
                # The first pass retries quickly; later passes try once, the outbox backs off.
                attempts=None if waiting is None else 1,
            )
        except NotificationError as exc:
            if not exc.retryable:
                log.error("notification not sent: %s", exc.message)
                await self._give_up(item, exc.message)
                return 0
            first = waiting is None
            waiting = self._waiting.setdefault(key, _Waiting())
            waiting.passes += 1
            waiting.attempts += self.settings.max_attempts if first else 1  # all were tried
            pause = min(
                self.settings.backoff_s * 2 ** (self.settings.max_attempts + waiting.passes - 1),
                self.settings.retry_interval_max_s,
            )
            waiting.next_at = time.monotonic() + pause
            log.warning("notification not sent yet (%s); next try in %.0fs", exc.message, pause)
            return 0
        self._waiting.pop(key, None)
        self._delivered[key] = (waiting.attempts if waiting else 0) + attempts
        self.sent.append((item.incident_id, ctx.event, channel.name))
        await self._mark_sent(item, channel, self._delivered[key])
        return 1

    async def _mark_sent(self, item: StoredEvent, channel: ChannelSettings, attempts: int) -> None:
        key = str(item.data["sent_key"])
        await self.store.record(
            AuditRecord(
                incident_id=item.incident_id,
                kind="notification",
                at=datetime.now(UTC),
                actor="relaunch",
                summary=f"{item.data['event']} sent to {channel.name} ({channel.type.value})",
                data={
                    "event": item.data["event"],
                    "channel": channel.name,
                    "type": channel.type.value,
                    "attempts": attempts,
                    "row": item.data.get("row"),
                    "idempotency_key": item.data["idempotency_key"],
                    "queued_at": item.at.isoformat(),
                },
            ),
            dedupe_key=key,
        )
        self._delivered.pop(key, None)

    async def _give_up(self, item: StoredEvent, reason: str) -> None:
        await self.store.record(
            AuditRecord(
                incident_id=item.incident_id,
                kind="notification_failed",
                at=datetime.now(UTC),
                actor="relaunch",
                summary=f"{item.data['event']} to {item.data['channel']} given up: {reason}",
                data={
                    "event": item.data["event"],
                    "channel": item.data["channel"],
                    "reason": reason,
                    "queued_at": item.at.isoformat(),
                },
            ),
            dedupe_key=str(item.data["failed_key"]),
        )
        self._waiting.pop(str(item.data["sent_key"]), None)

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
            subject=await self._subject(row.incident_id, str(incident["job_id"])),
        )

    async def _subject(self, incident_id: str, job_id: str) -> str:
        """`job 12`; for a node decision, its node and the jobs one decision covers."""
        node = parse_node_decision_id(incident_id)
        if node is None:
            return f"job {job_id}"
        covers = len(await self.store.covered_by(incident_id))
        return f"node {node[1]} (covers {covers} job{'' if covers == 1 else 's'})"


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
