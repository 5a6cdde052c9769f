"""Sending one notification to one channel: secrets from the environment, retries with
exponential backoff on 429, 5xx and connection errors, an ``Idempotency-Key`` header, and
nothing secret in any log line or error message (a webhook URL is itself the secret)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import httpx

from relaunch.connectors.notify.render import (
    NotificationContext,
    pagerduty_body,
    render_text,
    slack_body,
    webhook_body,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.notify import ChannelSettings, ChannelType, NotifySettings

log = logging.getLogger("relaunch.notify")


IDEMPOTENCY_HEADER = "Idempotency-Key"


class NotificationError(RelaunchError):
    """A channel refused a notification, or could not be reached within the retries."""


class NotificationRefusedError(NotificationError):
    """The service refused the notification (a 4xx other than 429): sending it again will not
    help."""


class NotificationUndeliveredError(NotificationError):
    """The service could not be reached, or answered 429 / 5xx, on every attempt."""

    retryable = True


class ChannelMisconfiguredError(NotificationError):
    """The channel's secret is not in the environment (set it and restart: what waits in the
    outbox is sent then)."""

    retryable = True


def _secret(channel: ChannelSettings) -> str:
    env = channel.routing_key_env if channel.type is ChannelType.PAGERDUTY else channel.url_env
    value = os.environ.get(env or "", "").strip()
    if not value:
        raise ChannelMisconfiguredError(
            f"channel {channel.name}: environment variable {env} is not set",
            hint="set it in the console's environment (the value is never logged)",
        )
    return value


def request_for(
    channel: ChannelSettings, ctx: NotificationContext, idempotency_key: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(URL, JSON body) of the channel's request for this event."""
    summary, text = render_text(ctx)
    secret = _secret(channel)
    if channel.type is ChannelType.PAGERDUTY:
        return channel.events_url, pagerduty_body(ctx, summary, text, secret)
    if channel.type is ChannelType.SLACK:
        return secret, slack_body(ctx, summary, text)
    return secret, webhook_body(ctx, summary, text, idempotency_key)


def _accepted(channel: ChannelSettings, response: httpx.Response) -> bool:
    if channel.type is ChannelType.SLACK:
        return response.status_code == 200
    if channel.type is ChannelType.PAGERDUTY:
        return response.status_code == 202
    return 200 <= response.status_code < 300


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _explain(response: httpx.Response) -> str:
    """What the service said, short (Slack answers text, PagerDuty JSON with errors)."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("errors") or data)[:200]
    return str(data)[:200]


async def send(
    client: httpx.AsyncClient,
    channel: ChannelSettings,
    ctx: NotificationContext,
    settings: NotifySettings,
    *,
    idempotency_key: str | None = None,
    attempts: int | None = None,
) -> int:
    """Send until accepted, at most ``attempts`` times (default ``settings.max_attempts``);
    returns the attempts it took. Every attempt carries the same ``Idempotency-Key`` header
    (and a webhook's body the same ``idempotency_key``), so a receiver can drop a repeat.
    Raises NotificationRefusedError when the service refuses (4xx other than 429),
    NotificationUndeliveredError when the attempts run out."""
    url, body = request_for(channel, ctx, idempotency_key)
    headers = {IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key else None
    delay = settings.backoff_s
    tries = attempts or settings.max_attempts
    for attempt in range(1, tries + 1):
        wait: float | None = None
        try:
            response = await client.post(
                url, json=body, headers=headers, timeout=settings.timeout_s
            )
        except httpx.TransportError as exc:
            problem = f"cannot reach it ({type(exc).__name__})"
        else:
            if _accepted(channel, response):
                return attempt
            problem = f"HTTP {response.status_code}: {_explain(response)}"
            if response.status_code != 429 and response.status_code < 500:
                raise NotificationRefusedError(
                    f"channel {channel.name} refused {ctx.event}: {problem}"
                )
            wait = _retry_after(response)
        if attempt == tries:
            break
        pause = min(wait if wait is not None else delay, settings.backoff_max_s)
        log.warning(
            "notification to %s failed (%s); retry %d in %.1fs",
            channel.name,
            problem,
            attempt,
            pause,
        )
        await asyncio.sleep(pause)
        delay = min(delay * 2, settings.backoff_max_s)
    raise NotificationUndeliveredError(
        f"channel {channel.name}: {ctx.event} not delivered after {tries} attempts: {problem}"
    )
