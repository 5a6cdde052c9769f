"""Notification templates and bodies, the notify configuration, and the intake role."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from jinja2 import DictLoader, Environment, StrictUndefined, UndefinedError
from pydantic import ValidationError

from relaunch.connectors.notify.render import (
    NotificationContext,
    PlanInfo,
    VerdictInfo,
    pagerduty_body,
    render_text,
    slack_body,
)
from relaunch.console.auth import ConsoleRole
from relaunch.models.intake import Alert
from relaunch.models.notify import ChannelSettings, NotifyEvent, NotifySettings


def ctx(event: NotifyEvent, **kw: object) -> NotificationContext:
    base: dict[str, object] = {
        "event": event,
        "incident_id": "relaunch-c1-418227-0",
        "cluster": "c1",
        "job_id": "418227",
        "attempt": 0,
        "stage": "awaiting_approval",
        "summary": "recommend isolate_and_restart",
        "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "verdict": VerdictInfo(category="gpu_hardware", culprit_nodes=["gpu07"], confidence=0.93),
        "plan": PlanInfo(action="isolate_and_restart", drain_nodes=["gpu07"], reasons=["Xid 79"]),
        "link": "https://console/incidents/relaunch-c1-418227-0",
    }
    return NotificationContext.model_validate({**base, **kw})


@pytest.mark.parametrize(
    ("event", "title"),
    [
        (
            "recommendation",
            "[c1] Approval needed: isolate_and_restart for job 418227 (gpu_hardware on gpu07)",
        ),
        ("action", "[c1] Recovered: job 418227 restarted without gpu07"),
        ("failure", "[c1] Recovery failed: job 418227 needs a human"),
        ("expiry", "[c1] Approval expired: no action for job 418227"),
    ],
)
def test_each_event_renders_a_title_and_a_body(event: str, title: str) -> None:
    summary, text = render_text(ctx(NotifyEvent(event), stage="failed"))
    assert summary == title
    assert text.startswith(title + "\n\n") and "relaunch-c1-418227-0" in text
    assert "https://console/incidents/relaunch-c1-418227-0" in text


def test_failure_names_the_refusing_guard_and_a_hold() -> None:
    _, text = render_text(
        ctx(NotifyEvent.FAILURE, stage="held", refusals=["blast_radius: REFUSED — 2 of 4 drained"])
    )
    assert "Recovery held" in text and "Refused by blast_radius: REFUSED" in text


def test_templates_render_without_verdict_or_plan() -> None:
    summary, _ = render_text(ctx(NotifyEvent.RECOMMENDATION, verdict=None, plan=None))
    assert summary == "[c1] Approval needed: recovery for job 418227"


def test_a_template_naming_an_unknown_field_fails_loudly() -> None:
    env = Environment(loader=DictLoader({"expiry.txt.j2": "{{ nope }}"}), undefined=StrictUndefined)
    with pytest.raises(UndefinedError):
        render_text(ctx(NotifyEvent.EXPIRY), env)


def test_slack_and_pagerduty_bodies() -> None:
    c = ctx(NotifyEvent.RECOMMENDATION, verdict=VerdictInfo(category="x", summary="a <b> & c"))
    summary, text = render_text(c)
    body = slack_body(c, summary, text)
    assert (
        set(body) == {"text", "blocks"} and "&lt;b&gt; &amp; c" in body["blocks"][0]["text"]["text"]
    )
    pd = pagerduty_body(c, summary, text, "key")
    assert pd["event_action"] == "trigger" and pd["dedup_key"] == c.incident_id
    assert pd["payload"]["severity"] == "warning" and pd["payload"]["source"] == "c1"
    done = pagerduty_body(ctx(NotifyEvent.ACTION), "s", "t", "key")
    assert done == {"routing_key": "key", "event_action": "resolve", "dedup_key": c.incident_id}


def test_channel_config_names_env_vars_never_secrets() -> None:
    with pytest.raises(ValidationError, match="needs url_env"):
        ChannelSettings(type="slack")
    with pytest.raises(ValidationError, match="name an environment variable"):
        ChannelSettings(type="slack", url_env="https://hooks.slack.com/services/T/B/X")
    with pytest.raises(ValidationError, match="needs routing_key_env"):
        ChannelSettings(type="pagerduty", url_env="X")
    with pytest.raises(ValidationError, match="Extra inputs"):
        ChannelSettings.model_validate({"type": "webhook", "url_env": "X", "url": "http://x"})
    with pytest.raises(ValidationError, match="distinct names"):
        NotifySettings(channels=[ChannelSettings(type="webhook", url_env="A")] * 2)
    ch = ChannelSettings(type="pagerduty", routing_key_env="PD_KEY")
    assert ch.name == "pagerduty" and set(ch.events) == set(NotifyEvent)


def test_intake_role_is_apart_from_people() -> None:
    assert ConsoleRole.INTAKE.allows(ConsoleRole.INTAKE)
    for person in (ConsoleRole.VIEWER, ConsoleRole.APPROVER, ConsoleRole.ADMIN):
        assert not person.allows(ConsoleRole.INTAKE) and not ConsoleRole.INTAKE.allows(person)
    assert ConsoleRole.ADMIN.allows(ConsoleRole.VIEWER) and not ConsoleRole.VIEWER.allows(
        ConsoleRole.APPROVER
    )


def test_alert_labels_name_node_job_and_source() -> None:
    start = "2026-01-01T00:00:00Z"
    a = Alert.model_validate(
        {
            "status": "firing",
            "labels": {"alertname": "NodeDown", "instance": "gpu07:9100"},
            "startsAt": start,
        }
    )
    assert a.node() == "gpu07" and a.job_id() is None and not a.is_telemetry()
    assert len(a.key) == 16  # no fingerprint: a hash of the labels
    x = Alert.model_validate(
        {
            "status": "firing",
            "labels": {
                "alertname": "XidError",
                "Hostname": "gpu07",
                "job": "node-exporter",
                "slurm_job_id": "418227",
            },
            "startsAt": start,
            "fingerprint": "f",
        }
    )
    assert x.job_id() == "418227" and x.is_telemetry() and x.key == "f"
