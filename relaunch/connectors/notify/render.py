"""What a notification says: the event's context, its text (a jinja2 template per event, shipped
as package data) and each service's request body.

A verdict's summary and a plan's reasons quote lines of the job's own output, which its user
wrote. Wherever such a line (a job-controlled evidence line of the verdict) shows in a body, it
is marked as the job's own words, on one line and bounded (:func:`job_words`), so that what a
job printed never reads as Relaunch's finding or instruction in Slack, PagerDuty or a webhook.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic import BaseModel, Field, model_validator

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


JOB_WORDS_MAX = 200  # characters of one quoted line of the job's output
MAX_JOB_WORDS = 20  # job-controlled lines of one verdict looked for in a notification
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")
MIN_QUOTE = 8  # shorter pieces of a job's line are not looked for (they match anything)


def job_words(text: str) -> str:
    """A line the job wrote, as a notification shows it: marked as the job's own words, on one
    line (control characters and newlines become spaces), at most JOB_WORDS_MAX characters."""
    flat = " ".join(_CONTROL.sub(" ", text).split())
    if len(flat) > JOB_WORDS_MAX:
        flat = flat[:JOB_WORDS_MAX] + "…"
    return f'[job output, the job\'s own words: "{flat}"]'


class VerdictInfo(BaseModel):
    category: str
    culprit_nodes: list[str] = Field(default_factory=list)
    confidence: float = 0.0
    summary: str = ""
    job_words: list[str] = Field(
        default_factory=list,
        description="the verdict's evidence lines from the job's own output (job-controlled): "
        "where a notification quotes one, it is marked as the job's own words",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_evidence(cls, data: Any) -> Any:
        """A verdict row's data carries its evidence lines: keep the job-controlled ones."""
        if isinstance(data, dict) and "job_words" not in data and "evidence" in data:
            lines = data["evidence"] if isinstance(data["evidence"], list) else []
            words = [
                str(line["text"])
                for line in lines
                if isinstance(line, dict) and not line.get("trusted") and line.get("text")
            ]
            data = {**data, "job_words": words[:MAX_JOB_WORDS]}
        return data


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


def mark_job_words(text: str, words: list[str]) -> str:
    """``text`` with every quote of one of ``words`` (a job's own lines, whole or as the
    verdict's summary cuts them) marked as the job's own words (:func:`job_words`)."""
    found: list[str] = []
    for word in sorted({w.strip() for w in words if len(w.strip()) >= MIN_QUOTE}, key=len)[::-1]:
        for piece in dict.fromkeys((word, word[:160], word[:120])):
            if len(piece) >= MIN_QUOTE and piece in text:
                text = text.replace(piece, f"\x00{len(found)}\x00")
                found.append(piece)
    for i, piece in enumerate(found):
        text = text.replace(f"\x00{i}\x00", job_words(piece))
    return text


def marked(ctx: NotificationContext) -> NotificationContext:
    """The context as a notification shows it: the job's own lines marked wherever the summary,
    the verdict's summary, the plan's reasons or the refusals quote them."""
    words = ctx.verdict.job_words if ctx.verdict else []
    if not words:
        return ctx

    def mark(text: str) -> str:
        return mark_job_words(text, words)

    update: dict[str, Any] = {
        "summary": mark(ctx.summary),
        "refusals": [mark(r) for r in ctx.refusals],
    }
    if ctx.verdict:
        update["verdict"] = ctx.verdict.model_copy(update={"summary": mark(ctx.verdict.summary)})
    if ctx.plan:
        update["plan"] = ctx.plan.model_copy(
            update={"reasons": [mark(r) for r in ctx.plan.reasons]}
        )
    return ctx.model_copy(update=update)


def render_text(ctx: NotificationContext, env: Environment | None = None) -> tuple[str, str]:
    """(summary line, full text) of the event's template, the job's own words marked."""
    ctx = marked(ctx)
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
    shown = marked(ctx).model_dump(mode="json", exclude={"verdict": {"job_words"}})
    body: dict[str, Any] = {**shown, "title": summary, "text": text}
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
