"""What a notification says: the event's context, its text (a jinja2 template per event, shipped
as package data) and each service's request body."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic import BaseModel, Field

from relaunch.models.notify import NotifyEvent
from relaunch.models.search_attributes import Stage

# The audit trail's stage rows that are worth telling someone about.
STAGE_EVENTS: dict[str, NotifyEvent] = {
    Stage.AWAITING_APPROVAL: NotifyEvent.RECOMMENDATION,
    Stage.DONE: NotifyEvent.ACTION,
    Stage.FAILED: NotifyEvent.FAILURE,
    Stage.HELD: NotifyEvent.FAILURE,
    Stage.EXPIRED: NotifyEvent.EXPIRY,
}

PAGERDUTY_SEVERITY = {
    NotifyEvent.RECOMMENDATION: "warning",
    NotifyEvent.FAILURE: "error",
    NotifyEvent.EXPIRY: "warning",
}


class VerdictInfo(BaseModel):
    category: str
    culprit_nodes: list[str] = Field(default_factory=list)
    confidence: float = 0.0
    summary: str = ""


class PlanInfo(BaseModel):
    action: str
    mode: str = ""
    drain_nodes: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)


class NotificationContext(BaseModel):
    """Everything a template may use."""

    event: NotifyEvent
    incident_id: str
    cluster: str
    job_id: str
    attempt: int
    stage: str
    summary: str
    at: datetime
    verdict: VerdictInfo | None = None
    plan: PlanInfo | None = None
    refusals: list[str] = Field(default_factory=list, description="guards that refused, why")
    link: str = Field(description="the incident in the console (or its id, without a URL)")
    subject: str = Field(
        default="",
        description="what the incident is about: `job 12`, or for a node decision `node n2 "
        "(covers 3 jobs)`",
    )

    def model_post_init(self, _: object) -> None:
        if not self.subject:
            self.subject = f"job {self.job_id}"


def environment() -> Environment:
    # Plain text, not HTML: each service's own escaping is applied to the rendered text.
    return Environment(
        loader=PackageLoader("relaunch.connectors.notify", "templates"),
        undefined=StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )


_ENV = environment()


def render_text(ctx: NotificationContext, env: Environment | None = None) -> tuple[str, str]:
    """(summary line, full text) of the event's template."""
    template = (env or _ENV).get_template(f"{ctx.event.value}.txt.j2")
    title, _, rest = template.render(ctx.model_dump()).strip().partition("\n")
    body = "\n".join(line.rstrip() for line in rest.splitlines() if line.strip())
    return title.strip(), f"{title.strip()}\n\n{body}" if body else title.strip()


def slack_escape(text: str) -> str:
    """Slack's three control characters (its docs: escape &, < and >)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webhook_body(
    ctx: NotificationContext, summary: str, text: str, idempotency_key: str | None = None
) -> dict[str, Any]:
    """The generic webhook's JSON: the context, the rendered text, and the key that is the same
    on every delivery of this (incident, event, channel) — a receiver drops a repeat by it."""
    body: dict[str, Any] = {**ctx.model_dump(mode="json"), "title": summary, "text": text}
    if idempotency_key:
        body["idempotency_key"] = idempotency_key
    return body


def slack_body(ctx: NotificationContext, summary: str, text: str) -> dict[str, Any]:
    body = slack_escape(text)
    elements = [{"type": "mrkdwn", "text": f"incident `{slack_escape(ctx.incident_id)}`"}]
    if ctx.link.startswith(("http://", "https://")):
        elements.append({"type": "mrkdwn", "text": f"<{ctx.link}|open in the console>"})
    return {
        "text": slack_escape(summary),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}},
            {"type": "context", "elements": elements},
        ],
    }


def pagerduty_body(
    ctx: NotificationContext, summary: str, text: str, routing_key: str
) -> dict[str, Any]:
    """An Events API v2 event: ``trigger`` for what needs a human, ``resolve`` once the
    recovery acted; the incident id is the dedup key, so one PagerDuty incident follows it."""
    if ctx.event is NotifyEvent.ACTION:
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": ctx.incident_id}
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": ctx.incident_id,
        "payload": {
            "summary": summary[:1024],
            "source": ctx.cluster,
            "severity": PAGERDUTY_SEVERITY[ctx.event],
            "timestamp": ctx.at.isoformat(),
            "component": ctx.subject,
            "group": ctx.cluster,
            "class": ctx.verdict.category if ctx.verdict else ctx.event.value,
            "custom_details": {"text": text, "stage": ctx.stage},
        },
    }
    if ctx.link.startswith(("http://", "https://")):
        body["links"] = [{"href": ctx.link, "text": "Relaunch console"}]
    return body
