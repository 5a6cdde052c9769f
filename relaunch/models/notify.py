"""Configuration of outgoing notifications (the ``notify`` section of a cluster's config).

Secrets — webhook URLs and PagerDuty routing keys — never appear in the configuration: it names
the environment variables that hold them."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class ChannelType(StrEnum):
    WEBHOOK = "webhook"
    SLACK = "slack"
    PAGERDUTY = "pagerduty"


class NotifyEvent(StrEnum):
    """What a channel can be told about (each once per incident and channel)."""

    RECOMMENDATION = "recommendation"  # monitor mode: a plan awaits approval
    ACTION = "action"  # the recovery acted and the job runs again
    FAILURE = "failure"  # a step failed, or the recovery held the job for a human
    EXPIRY = "expiry"  # nobody decided before the approval expired


PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class ChannelSettings(BaseModel):
    """One destination. ``url_env`` (webhook, Slack) or ``routing_key_env`` (PagerDuty) names
    the environment variable that holds the secret."""

    model_config = ConfigDict(extra="forbid")  # a pasted `url: https://hooks...` is an error

    type: ChannelType
    name: str = Field(default="", description="in the audit trail and logs; default: the type")
    url_env: str | None = None
    routing_key_env: str | None = None
    events_url: str = Field(
        default=PAGERDUTY_EVENTS_URL, description="PagerDuty's Events API v2 endpoint"
    )
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NotifyEvent))

    @model_validator(mode="after")
    def _secret_source(self) -> ChannelSettings:
        needed = "routing_key_env" if self.type is ChannelType.PAGERDUTY else "url_env"
        value = getattr(self, needed)
        if not value:
            raise ValueError(f"a {self.type.value} channel needs {needed}")
        if not _ENV.fullmatch(value):
            raise ValueError(f"{needed} must name an environment variable, not hold a value")
        if not self.name:
            self.name = self.type.value
        return self


class NotifySettings(BaseModel):
    """Where recommendations, actions, failures and expiries are announced."""

    model_config = ConfigDict(extra="forbid")

    channels: list[ChannelSettings] = Field(default_factory=list)
    poll_interval_s: float = Field(default=2.0, gt=0, le=60)
    lookback_s: float = Field(
        default=3600.0,
        ge=0,
        le=30 * 86400,
        description="on start, audit rows this recent are (re)considered",
    )
    max_attempts: int = Field(
        default=6, ge=1, le=20, description="attempts of a notification's first delivery"
    )
    backoff_s: float = Field(default=1.0, gt=0, le=3600, description="first retry delay; doubles")
    backoff_max_s: float = Field(default=60.0, gt=0, le=86400)
    retry_for_s: float = Field(
        default=86400.0,
        gt=0,
        le=30 * 86400,
        description="an undelivered notification stays in the outbox and is tried again, one "
        "attempt per pass with the backoff going on, for this long; then it is given up "
        "(a notification_failed row)",
    )
    retry_interval_max_s: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="the longest wait between two passes for one notification",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    console_url: str | None = Field(
        default=None, description="the console's public URL, for links in messages"
    )

    @model_validator(mode="after")
    def _unique_names(self) -> NotifySettings:
        names = [c.name for c in self.channels]
        if len(names) != len(set(names)):
            raise ValueError("notify channels need distinct names")
        return self
