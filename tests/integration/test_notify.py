"""The notifier against stand-in receivers that answer as Slack, PagerDuty's Events API v2 and
a generic webhook do (status codes and bodies from their documentation): what each is sent,
retries on 5xx/429/connection errors, at most once per (incident, event, channel) across
restarts, one sender at a time, and no secret in the logs."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.notify.channels import IDEMPOTENCY_HEADER
from relaunch.connectors.notify.notifier import Notifier
from relaunch.devstack.stack import Stack
from relaunch.models.notify import ChannelSettings, NotifySettings
from relaunch.models.recovery import AuditRecord
from tests.integration.serve import serve

SLACK_SECRET = "/services/T000/B000/XXXXsecretXXXX"
PD_KEY = "R0UTINGKEYsecret0000000000000000"


class Receivers:
    """Slack: 200 "ok", 400 "invalid_payload", 429 with Retry-After, 500. PagerDuty: 202
    {"status":"success","message":"Event processed","dedup_key":...}, 400 on a bad event, 429.
    ``script`` holds the status codes to answer before succeeding, per service."""

    def __init__(self) -> None:
        self.got: dict[str, list[dict[str, Any]]] = {"slack": [], "pd": [], "hook": []}
        self.script: dict[str, list[int]] = {"slack": [], "pd": [], "hook": []}

    async def slack(self, request: Request) -> Response:
        body = await request.json()
        self.got["slack"].append(body)
        if self.script["slack"]:
            code = self.script["slack"].pop(0)
            text = {429: "rate_limited", 500: "rollup_error"}.get(code, "invalid_payload")
            return PlainTextResponse(
                text, code, headers={"retry-after": "0"} if code == 429 else None
            )
        if not isinstance(body.get("text"), str):
            return PlainTextResponse("invalid_payload", 400)
        return PlainTextResponse("ok")

    async def pagerduty(self, request: Request) -> Response:
        body = await request.json()
        self.got["pd"].append(body)
        if self.script["pd"]:
            code = self.script["pd"].pop(0)
            return JSONResponse(
                {
                    "status": "throttle event",
                    "message": "Requests for this service are arriving too quickly.",
                }
                if code == 429
                else {
                    "status": "invalid event",
                    "message": "Event object is invalid",
                    "errors": ["x"],
                },
                code,
            )
        ok = (
            body.get("routing_key") == PD_KEY
            and body.get("event_action") in {"trigger", "resolve"}
            and body.get("dedup_key")
            and (
                body["event_action"] == "resolve"
                or {"summary", "source", "severity"} <= body["payload"].keys()
            )
        )
        if not ok:
            return JSONResponse(
                {
                    "status": "invalid event",
                    "message": "Event object is invalid",
                    "errors": ["bad"],
                },
                400,
            )
        return JSONResponse(
            {"status": "success", "message": "Event processed", "dedup_key": body["dedup_key"]}, 202
        )

    async def hook(self, request: Request) -> Response:
        self.got["hook"].append(await request.json())
        if self.script["hook"]:
            return PlainTextResponse("busy", self.script["hook"].pop(0))
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(SLACK_SECRET, self.slack, methods=["POST"]),
                Route("/v2/enqueue", self.pagerduty, methods=["POST"]),
                Route("/hook", self.hook, methods=["POST"]),
            ]
        )


@pytest.fixture
async def store(stack: Stack) -> AsyncIterator[AuditStore]:
    s = await AuditStore.open(stack.database_url)
    yield s
    await s.close()


def settings(base: str, **kw: Any) -> NotifySettings:
    return NotifySettings(
        channels=[
            ChannelSettings(
                type="slack", url_env="T_SLACK_URL", events=["recommendation", "failure"]
            ),
            ChannelSettings(
                type="pagerduty", routing_key_env="T_PD_KEY", events_url=f"{base}/v2/enqueue"
            ),
            ChannelSettings(type="webhook", name="ops-hook", url_env="T_HOOK_URL"),
        ],
        poll_interval_s=0.2,
        backoff_s=0.05,
        backoff_max_s=0.2,
        console_url="https://console.example/",
        **kw,
    )


async def seed(store: AuditStore, cluster: str, job: str, stages: list[str]) -> str:
    incident = f"relaunch-{cluster}-{job}-0"
    await store.ensure_incident(incident, cluster, job, 0)
    now = datetime.now(UTC)
    await store.record(
        AuditRecord(
            incident_id=incident,
            kind="verdict",
            at=now,
            nodes=["n2"],
            summary="gpu",
            data={
                "category": "gpu_hardware",
                "culprit_nodes": ["n2"],
                "confidence": 0.95,
                "summary": "Xid 79 <GPU0> & more",
            },
        ),
    )
    await store.record(
        AuditRecord(
            incident_id=incident,
            kind="plan",
            at=now,
            summary="plan",
            data={
                "action": "isolate_and_restart",
                "mode": "monitor",
                "drain_nodes": ["n2"],
                "reasons": ["Xid 79 on n2"],
            },
        ),
    )
    for stage in stages:
        await store.record(
            AuditRecord(
                incident_id=incident, kind="stage", at=now, stage=stage, summary=f"{stage}: summary"
            )
        )
    return incident


@pytest.fixture
def env_secrets(monkeypatch: pytest.MonkeyPatch) -> Any:
    def set_(base: str) -> None:
        monkeypatch.setenv("T_SLACK_URL", base + SLACK_SECRET)
        monkeypatch.setenv("T_PD_KEY", PD_KEY)
        monkeypatch.setenv("T_HOOK_URL", base + "/hook")

    return set_


async def test_each_service_gets_its_documented_request_with_retries_and_once_only(
    stack: Stack, store: AuditStore, env_secrets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cluster = f"nt{os.getpid() % 10000}x{time.monotonic_ns() % 10000}"
    rx = Receivers()
    with serve(rx.app(), "/") as base:
        env_secrets(base)
        notifier = Notifier(cluster, settings(base), store, stack.database_url)
        rx.script = {"slack": [500, 429], "pd": [429], "hook": [503]}
        incident = await seed(store, cluster, "11", ["gathering", "awaiting_approval"])
        async with httpx.AsyncClient() as client:
            assert await notifier.poll_once(client) == 3
            slack, pd, hook = rx.got["slack"], rx.got["pd"], rx.got["hook"]
            assert len(slack) == 3 and len(pd) == 2 and len(hook) == 2  # retried until accepted
            assert slack[-1]["text"].startswith(f"[{cluster}] Approval needed: isolate_and_restart")
            section = slack[-1]["blocks"][0]["text"]["text"]
            assert "&lt;GPU0&gt; &amp; more" in section  # Slack's escaping
            assert (
                "<https://console.example/incidents/"
                in slack[-1]["blocks"][1]["elements"][1]["text"]
            )
            assert pd[-1]["event_action"] == "trigger" and pd[-1]["dedup_key"] == incident
            assert (
                pd[-1]["payload"]["severity"] == "warning"
                and pd[-1]["payload"]["source"] == cluster
            )
            assert hook[-1]["event"] == "recommendation" and hook[-1]["incident_id"] == incident
            assert hook[-1]["verdict"]["culprit_nodes"] == ["n2"]

            # The recovery goes on and is done: Slack is not subscribed to actions; PagerDuty
            # resolves the incident it opened.
            for stage in ("isolating", "acting", "verifying", "done"):
                await store.record(
                    AuditRecord(
                        incident_id=incident,
                        kind="stage",
                        at=datetime.now(UTC),
                        stage=stage,
                        summary=stage,
                    )
                )
            assert await notifier.poll_once(client) == 2
            assert (
                len(slack) == 3
                and pd[-1]["event_action"] == "resolve"
                and hook[-1]["event"] == "action"
            )

            # A restarted notifier looks back over the same rows and sends nothing again.
            again = Notifier(cluster, settings(base), store, stack.database_url)
            assert await again.poll_once(client) == 0
            assert (len(slack), len(pd), len(hook)) == (3, 3, 3)

            # A refusal (400) is not retried and not recorded; the next event still goes out.
            rx.script = {"slack": [400], "pd": [], "hook": []}
            other = await seed(store, cluster, "12", ["held"])
            assert await notifier.poll_once(client) == 2
            assert len(slack) == 4 and pd[-1]["payload"]["severity"] == "error"
            assert hook[-1]["event"] == "failure" and hook[-1]["stage"] == "held"
    rows = [e for e in await store.events(incident) if e.kind == "notification"]
    assert sorted((r.data["event"], r.data["channel"]) for r in rows) == sorted(
        [
            ("recommendation", "slack"),
            ("recommendation", "pagerduty"),
            ("recommendation", "ops-hook"),
            ("action", "pagerduty"),
            ("action", "ops-hook"),
        ]
    )
    assert {r.data["channel"] for r in await store.events(other) if r.kind == "notification"} == {
        "pagerduty",
        "ops-hook",
    }
    logged = caplog.text
    assert "retry" in logged and "refused" in logged
    assert SLACK_SECRET not in logged and PD_KEY not in logged and "XXXXsecret" not in logged


async def test_connection_errors_are_retried_and_only_one_notifier_sends(
    stack: Stack, store: AuditStore, env_secrets: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = f"nl{os.getpid() % 10000}x{time.monotonic_ns() % 10000}"
    rx = Receivers()
    with serve(rx.app(), "/") as base:
        env_secrets(base)
        # Nothing listens at first: connection refused, retried with backoff.
        monkeypatch.setenv("T_HOOK_URL", "http://127.0.0.1:9/hook")
        lone = Notifier(cluster, settings(base, max_attempts=3), store, stack.database_url)
        await seed(store, cluster, "21", ["expired"])
        async with httpx.AsyncClient() as client:
            assert await lone.poll_once(client) == 1  # PagerDuty got it; the hook did not
        monkeypatch.setenv("T_HOOK_URL", base + "/hook")

        stop = asyncio.Event()
        a = Notifier(cluster, settings(base), store, stack.database_url)
        b = Notifier(cluster, settings(base), store, stack.database_url)
        tasks = [asyncio.create_task(n.run(stop)) for n in (a, b)]
        try:
            await asyncio.sleep(1.0)
            incident = await seed(store, cluster, "22", ["awaiting_approval"])
            deadline = time.monotonic() + 20
            while len(a.sent) + len(b.sent) < 4 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    # One of the two held the lock and sent everything; the other sent nothing.
    assert sorted([len(a.sent), len(b.sent)]) == [0, 4], (a.sent, b.sent)
    hooks = [h for h in rx.got["hook"] if h["incident_id"] == incident]
    assert len(hooks) == 1 and hooks[0]["event"] == "recommendation"
    # The hook's expiry that failed earlier is sent by the next notifier's look-back.
    assert any(h["event"] == "expiry" for h in rx.got["hook"])


class FlakyHook:
    """A webhook that is down (503, or refusing with 400) for its first ``down`` requests, and
    notes for each request whether its outbox row was already in the database."""

    def __init__(self, database_url: str, down: int, code: int = 503) -> None:
        self.database_url, self.down, self.code = database_url, down, code
        self.got: list[tuple[dict[str, Any], str | None, bool]] = []

    async def post(self, request: Request) -> Response:
        body = await request.json()
        async with await psycopg.AsyncConnection.connect(self.database_url) as conn:
            cur = await conn.execute(
                "select 1 from audit_events where incident_id = %s"
                " and kind = 'notification_queued' and data->>'event' = %s",
                (body["incident_id"], body["event"]),
            )
            queued = await cur.fetchone() is not None
        self.got.append((body, request.headers.get(IDEMPOTENCY_HEADER), queued))
        if len(self.got) <= self.down:
            return PlainTextResponse("down", self.code)
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/hook", self.post, methods=["POST"])])


def hook_only(**kw: Any) -> NotifySettings:
    return NotifySettings(
        channels=[ChannelSettings(type="webhook", name="ops-hook", url_env="T_HOOK_URL")],
        poll_interval_s=0.1,
        max_attempts=2,
        backoff_s=0.02,
        backoff_max_s=0.05,
        retry_interval_max_s=0.2,
        **kw,
    )


async def poll_until(notifier: Notifier, client: httpx.AsyncClient, seconds: float) -> int:
    sent, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        sent += await notifier.poll_once(client)
        await asyncio.sleep(0.05)
    return sent


async def test_an_outage_of_the_receiver_is_waited_out_recorded_first_delivered_once(
    stack: Stack, store: AuditStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver is down for many passes (the scaled-down picture of a 30-minute outage:
    with the defaults a notification is tried again at least once a minute for a day)."""
    cluster = f"no{os.getpid() % 10000}x{time.monotonic_ns() % 10000}"
    hook = FlakyHook(stack.database_url, down=8)
    with serve(hook.app(), "/") as base:
        monkeypatch.setenv("T_HOOK_URL", base + "/hook")
        notifier = Notifier(cluster, hook_only(), store, stack.database_url)
        incident = await seed(store, cluster, "31", ["awaiting_approval"])
        async with httpx.AsyncClient() as client:
            assert await notifier.poll_once(client) == 0  # the first pass: 2 quick attempts
            assert await poll_until(notifier, client, 4.0) == 1
            assert await poll_until(notifier, client, 1.0) == 0  # delivered: never again
    assert len(hook.got) == 9  # 8 refused while down, 1 accepted
    assert all(queued for _, _, queued in hook.got)  # recorded before every attempt
    keys = {key for _, key, _ in hook.got} | {body["idempotency_key"] for body, _, _ in hook.got}
    assert len(keys) == 1 and None not in keys  # one key on every delivery attempt
    rows = [e for e in await store.events(incident) if e.kind.startswith("notification")]
    assert [(r.kind, r.data["event"]) for r in rows] == [
        ("notification_queued", "recommendation"),
        ("notification", "recommendation"),
    ]
    assert rows[1].data["attempts"] == 9


async def test_a_database_lost_after_the_send_marks_it_sent_without_sending_again(
    stack: Stack, store: AuditStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = f"nd{os.getpid() % 10000}x{time.monotonic_ns() % 10000}"
    hook = FlakyHook(stack.database_url, down=0)
    record = store.record
    lost: list[str] = []

    async def record_unless_first_mark(row: AuditRecord, *, dedupe_key: str | None = None) -> bool:
        if row.kind == "notification" and not lost:
            lost.append(row.incident_id)
            raise psycopg.OperationalError("the database went away")
        return await record(row, dedupe_key=dedupe_key)

    with serve(hook.app(), "/") as base:
        monkeypatch.setenv("T_HOOK_URL", base + "/hook")
        notifier = Notifier(cluster, hook_only(), store, stack.database_url)
        incident = await seed(store, cluster, "41", ["held"])
        monkeypatch.setattr(store, "record", record_unless_first_mark)
        async with httpx.AsyncClient() as client:
            with pytest.raises(psycopg.OperationalError):
                await notifier.poll_once(client)  # sent; the row that says so is not recorded
            assert await poll_until(notifier, client, 1.0) == 0  # recorded now, not resent
    assert lost == [incident]
    assert [body["event"] for body, _, _ in hook.got] == ["failure"]
    sent = [e for e in await store.events(incident) if e.kind == "notification"]
    assert [r.data["event"] for r in sent] == ["failure"]


async def test_a_refused_or_expired_notification_is_given_up_in_the_trail(
    stack: Stack, store: AuditStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = f"nf{os.getpid() % 10000}x{time.monotonic_ns() % 10000}"
    hook = FlakyHook(stack.database_url, down=1, code=400)
    with serve(hook.app(), "/") as base:
        monkeypatch.setenv("T_HOOK_URL", base + "/hook")
        refused = await seed(store, cluster, "51", ["expired"])
        async with httpx.AsyncClient() as client:
            notifier = Notifier(cluster, hook_only(), store, stack.database_url)
            assert await poll_until(notifier, client, 0.5) == 0
            assert len(hook.got) == 1  # a refusal is not retried
            # Receiver down past the retry window: given up, in words.
            monkeypatch.setenv("T_HOOK_URL", "http://127.0.0.1:9/hook")
            late = await seed(store, cluster, "52", ["expired"])
            short = Notifier(cluster, hook_only(retry_for_s=0.5), store, stack.database_url)
            assert await poll_until(short, client, 1.5) == 0
    failed = {
        e.incident_id: e.summary
        for i in (refused, late)
        for e in await store.events(i)
        if e.kind == "notification_failed"
    }
    assert "refused" in failed[refused] and "HTTP 400" in failed[refused]
    assert "not delivered within 0.5s" in failed[late]
