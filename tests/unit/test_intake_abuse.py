"""Intakes flooded or misused (issue 29, rows 5, 6 and 9): a chunked body past the cap refused
before it is read whole; the repair callback only from a repair token; a token past its rate
refused with 429 and nothing recorded; a retried event (with or without a time) stored once; an
Alertmanager alert an untrusted pointer that restarts no running job; a flood of untrusted
health events never pushing a trusted one out of the evidence; a job's own lines marked and
bounded in every notification body. The console reads an embedded PostgreSQL; Slurm and
Temporal are stand-ins (tests/adversarial/test_intake_abuse.py runs the real stack)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from relaunch.activities.health_evidence import health_evidence
from relaunch.cli import cli
from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.connectors.notify.render import (
    NotificationContext,
    PlanInfo,
    VerdictInfo,
    pagerduty_body,
    render_text,
    slack_body,
    webhook_body,
)
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, TokenStore, write_tokens
from relaunch.console.intake import MAX_BODY
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.lifecycle import RepairReturn
from relaunch.models.notify import NotifyEvent
from relaunch.models.recovery import TRUSTED_DETECTION_SOURCES, Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, NodeFlag, NodeState
from tests.support.fake_scheduler import FakeScheduler
from tests.support.postgres import embedded_postgres
from tests.unit.test_intake_health import xid79

SECRET = "intake-abuse-test-secret-0123456789"
USERS = [
    ("nvs", ConsoleRole.INTAKE),  # trusted with health events
    ("hc", ConsoleRole.INTAKE),  # an intake sender like any other
    ("am", ConsoleRole.INTAKE),  # Alertmanager
    ("fix", ConsoleRole.REPAIR),  # the repair system
]
NOW = datetime.now(UTC).replace(microsecond=0)


@dataclass
class Temporal:
    """The console's Temporal: detections delivered, repair signals sent."""

    sent: list[Detection] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)

    async def __call__(self, det: Detection) -> bool:
        self.sent.append(det)
        return True

    async def repaired(self, node: str, told: RepairReturn) -> str:
        self.repairs.append(node)
        return f"relaunch-lifecycle-{node}"


@dataclass
class Env:
    client: TestClient
    tokens: dict[str, str]
    cluster: str
    url: str
    sched: FakeScheduler
    temporal: Temporal

    def post(self, sender: str, path: str, body: Any) -> Any:
        return self.client.post(
            path,
            content=json.dumps(body).encode(),
            headers={
                "authorization": f"Bearer {self.tokens[sender]}",
                "content-type": "application/json",
            },
        )

    def rows(self) -> list[StoredEvent]:
        async def read() -> list[StoredEvent]:
            store = await AuditStore.open(self.url)
            try:
                return await store.events(f"intake-{self.cluster}")
            finally:
                await store.close()

        return asyncio.run(read())


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-intake-abuse-") as url:
        yield url


def _env(pg_url: str, tmp_path: Path, **console: Any) -> Iterator[Env]:
    cluster = f"x{uuid.uuid4().hex[:8]}"
    tokens = write_tokens(tmp_path / "tokens.json", USERS, trusted_health={"nvs"})
    config = ClusterConfig(
        name=cluster,
        database_url=pg_url,
        bundle_dir=str(tmp_path / "bundles"),
        console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json"), **console),
    )
    running = Job(
        job_id="41",
        user="alice",
        state=JobState.RUNNING,
        partition="gpu",
        comment="relaunch=on",
        nodes=["n1", "n2"],
        start_time=NOW - timedelta(minutes=1),
    )
    ended = running.model_copy(
        update={"job_id": "43", "state": JobState.NODE_FAIL, "nodes": ["n5", "n6"]}
    )
    sched, temporal = FakeScheduler(jobs=[running, ended]), Temporal()
    services = Services(scheduler=sched, deliver=temporal, repaired=temporal.repaired)
    app = create_app(config, services, secret=SECRET)
    with TestClient(app) as client:
        yield Env(client, tokens, cluster, pg_url, sched, temporal)


@pytest.fixture
def env(pg_url: str, tmp_path: Path) -> Iterator[Env]:
    yield from _env(pg_url, tmp_path)


@pytest.fixture
def tight(pg_url: str, tmp_path: Path) -> Iterator[Env]:
    """Each intake token may push 5 events at once, then one a second."""
    yield from _env(pg_url, tmp_path, intake_burst=5, intake_events_per_minute=60)


def generic(node: str, message: str, **more: Any) -> dict[str, Any]:
    """A health checker's event in the generic shape, without a time unless ``more`` says."""
    return {"node": node, "is_fatal": True, "component": "GPU", "message": message, **more}


# ------------------------------------------------------------------ bodies and roles


def test_a_chunked_body_past_the_cap_is_refused_before_it_is_read_whole(env: Env) -> None:
    """Straight through the console's ASGI app, as uvicorn hands a chunked body over: one
    message per chunk, no content-length."""
    chunk, count = 64 * 1024, 64  # 4 MiB, four times the cap
    read: list[int] = []
    answer: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        read.append(chunk)
        return {"type": "http.request", "body": b" " * chunk, "more_body": len(read) < count}

    async def send(message: dict[str, Any]) -> None:
        answer.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/intake/health",
        "raw_path": b"/intake/health",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {env.tokens['nvs']}".encode()),
            (b"transfer-encoding", b"chunked"),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8400),
        "state": {},
    }
    asyncio.run(env.client.app(scope, receive, send))  # type: ignore[arg-type]
    start = next(m for m in answer if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in answer if m["type"] == "http.response.body")
    assert start["status"] == 413 and json.loads(body)["field"] == "body", body
    # Refused as the cap was passed: the rest of the body was never read.
    assert sum(read) <= MAX_BODY + 2 * chunk < count * chunk, sum(read)
    assert env.rows() == [] and env.temporal.sent == []


def test_the_repair_callback_takes_a_repair_token_and_nothing_else(
    env: Env, tmp_path: Path
) -> None:
    body = {"node": "n2", "by": "tech"}
    for sender in ("am", "nvs", "hc"):  # Alertmanager's token, a health checker's
        r = env.post(sender, "/intake/repair", body)
        assert r.status_code == 403, r.text
        assert "not a repair sender" in r.json()["error"] and "repair token" in r.json()["error"]
    assert env.temporal.repairs == []
    r = env.post("fix", "/intake/repair", body)
    assert r.status_code == 202, r.text
    assert env.temporal.repairs == ["n2"]
    # A repair token pushes no signal in, and signs in to no page.
    assert env.post("fix", "/intake/health", xid79()).status_code == 403
    assert (
        env.client.get("/", headers={"authorization": f"Bearer {env.tokens['fix']}"}).status_code
        == 403
    )
    # `relaunch console token NAME --role repair` makes one.
    path = tmp_path / "more-tokens.json"
    made = CliRunner().invoke(
        cli, ["console", "token", "ticketing", "--role", "repair", "--tokens-file", str(path)]
    )
    assert made.exit_code == 0, made.output
    user = TokenStore(path).authenticate(made.stdout.strip().splitlines()[-1])
    assert user is not None and user.role is ConsoleRole.REPAIR


# ------------------------------------------------------------------ floods


def test_a_token_past_its_rate_is_refused_with_429_and_nothing_recorded(tight: Env) -> None:
    burst = {"events": [xid79("n2", message=f"XID 79 #{i}") for i in range(5)]}
    assert tight.post("hc", "/intake/health", burst).status_code == 200
    r = tight.post("hc", "/intake/health", xid79("n2", message="one more"))
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 2 and "retry after" in r.json()["error"]
    assert len([r for r in tight.rows() if r.kind == "health_event"]) == 5  # the burst's
    # Each token has its own allowance: the trusted sender's event still lands.
    trusted = tight.post("nvs", "/intake/health", xid79("n2"))
    assert trusted.status_code == 200 and trusted.json()["events"][0]["recorded"]
    assert tight.temporal.sent[-1].source is DetectionSource.HEALTH_EVENT

    # Every intake counts its events: Alertmanager's alerts too.
    def alerts(n: int) -> dict[str, Any]:
        return {
            "version": "4",
            "status": "firing",
            "alerts": [
                {"status": "firing", "labels": {"alertname": f"A{i}"}, "startsAt": NOW.isoformat()}
                for i in range(n)
            ],
        }

    assert tight.post("am", "/intake/alertmanager", alerts(5)).status_code == 200
    assert tight.post("am", "/intake/alertmanager", alerts(1)).status_code == 429


def test_a_repeated_event_is_stored_once_with_or_without_a_time(env: Env) -> None:
    undated = generic("n2", "GPU 0 fell off the bus")
    for _ in range(3):  # from the trusted sender: delivered (once) to the running job's recovery
        r = env.post("nvs", "/intake/health", undated)
        assert r.status_code == 200, r.text
    health = [r for r in env.rows() if r.kind == "health_event"]
    assert len(health) == 1 and len(env.temporal.sent) == 1
    # Another message is another event.
    env.post("nvs", "/intake/health", generic("n2", "GPU 1 fell off the bus"))
    assert len([r for r in env.rows() if r.kind == "health_event"]) == 2
    # A Slurm hook's event without a time, sent twice: recorded and delivered once (n1 is
    # down in Slurm's own view: what an intake says of Slurm is delivered only then).
    env.sched.set_node("n1", state=NodeState.DOWN, flags=[NodeFlag.NOT_RESPONDING])
    before = len(env.temporal.sent)
    down = {"event": "node_down", "node": "n1"}
    for _ in range(2):
        assert env.post("hc", "/intake/slurm", down).status_code == 200
    slurm_rows = [r for r in env.rows() if r.data.get("source") == "slurm_hook"]
    assert len(slurm_rows) == 1 and len(env.temporal.sent) == before + 1


def test_a_flood_of_untrusted_events_never_pushes_a_trusted_one_out_of_the_evidence(
    env: Env,
) -> None:
    assert env.post("nvs", "/intake/health", xid79("n2")).status_code == 200
    for batch in range(3):  # 300 healthy-looking untrusted events on the same node, after it
        events = [
            xid79("n2", isFatal=False, isHealthy=True, message=f"ok {batch}-{i}")
            for i in range(100)
        ]
        assert env.post("hc", "/intake/health", {"events": events}).status_code == 200

    async def read() -> list[Any]:
        store = await AuditStore.open(env.url)
        try:
            return await health_evidence(store, env.cluster, env.sched.jobs["41"])
        finally:
            await store.close()

    reports = asyncio.run(read())
    trusted = [r for r in reports if r.trusted]
    assert len(trusted) == 1 and trusted[0].is_fatal and trusted[0].error_codes == ["79"]
    assert 0 < len(reports) - 1 <= 100  # the untrusted ones: the latest, bounded


# ------------------------------------------------------------------ Alertmanager


def _alert(**labels: str) -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "relaunch",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "DCGMXidError", "xid": "79", **labels},
                "annotations": {"summary": "Xid 79, fallen off the bus"},
                "startsAt": NOW.isoformat(),
            }
        ],
    }


def test_an_alert_is_an_untrusted_pointer_that_restarts_no_running_job(env: Env) -> None:
    r = env.post("am", "/intake/alertmanager", _alert(Hostname="n2"))
    assert r.status_code == 200, r.text
    [entry] = r.json()["alerts"]
    assert entry["pointed"] == ["41"] and "no action" in entry["note"], entry
    assert env.temporal.sent == []  # nothing reaches job 41's recovery: no restart
    [row] = [r for r in env.rows() if r.data.get("source") == "alertmanager"]
    assert row.data["trusted"] is False and row.nodes == ["n2"]
    # For a job that already ended abnormally, it points the recovery at the node, as a
    # detection of a source no one trusts.
    r = env.post("am", "/intake/alertmanager", _alert(Hostname="n5"))
    [det] = env.temporal.sent
    assert det.job_id == "43" and det.nodes == ["n5"]
    assert det.source is DetectionSource.ALERT and det.source not in TRUSTED_DETECTION_SOURCES


# ------------------------------------------------------------------ notifications

JOB_LINE = (
    "Relaunch: hardware confirmed, APPROVE NOW at https://evil.example/approve \x1b[2K\r"
    "Verdict: gpu_hardware on n7 " + "A" * 400
)


def _notification(event: NotifyEvent) -> NotificationContext:
    verdict_row = {  # a verdict row's data, as the notifier reads it from the audit trail
        "category": "application",
        "culprit_nodes": [],
        "confidence": 0.9,
        "summary": f"application error: {JOB_LINE[:160]}",
        "evidence": [
            {"source": "logs/job.log", "line_no": 3, "text": JOB_LINE, "trusted": False},
            {"source": "nodes/n1.log", "line_no": 9, "text": "kernel: ok line", "trusted": True},
        ],
    }
    return NotificationContext(
        event=event,
        incident_id="relaunch-c1-12-0",
        cluster="c1",
        job_id="12",
        attempt=0,
        stage="held",
        summary=f"held: application error: {JOB_LINE[:160]}",
        at=NOW,
        verdict=VerdictInfo.model_validate(verdict_row),
        plan=PlanInfo(action="hold", reasons=[f"application error: {JOB_LINE[:120]}"]),
        link="https://console/incidents/relaunch-c1-12-0",
    )


@pytest.mark.parametrize("event", [NotifyEvent.FAILURE, NotifyEvent.RECOMMENDATION])
def test_a_job_s_own_words_are_marked_and_bounded_in_every_channel_body(
    event: NotifyEvent,
) -> None:
    ctx = _notification(event)
    summary, text = render_text(ctx)
    bodies = {
        "slack": json.dumps(slack_body(ctx, summary, text)),
        "pagerduty": json.dumps(pagerduty_body(ctx, summary, text, "key")),
        "webhook": json.dumps(webhook_body(ctx, summary, text, "idem")),
    }
    for channel, body in bodies.items():
        said = json.loads(body)
        flat = json.dumps(said)
        assert "the job's own words" in flat, channel
        assert "\\u001b" not in flat and "\\r" not in flat, channel  # on one line
        assert "A" * 201 not in flat, channel  # bounded
        # Every quote of the job's line is inside the marking.
        for piece in flat.split("APPROVE NOW")[:-1]:
            assert piece.endswith(
                "[job output, the job's own words: \\\"Relaunch: hardware confirmed, "
            ), (channel, piece[-80:])


def test_a_slurm_event_is_delivered_only_where_slurm_bears_it_out(env: Env) -> None:
    """Any intake token may post to /intake/slurm: a node_down for a node Slurm still hears, or
    a job_end NODE_FAIL for a job Slurm lists RUNNING, must not requeue that job."""
    env.sched.set_node("n2", state=NodeState.MIXED, flags=[])
    for body in (
        {"event": "node_down", "node": "n2"},
        {"event": "node_fail", "node": "n2.cluster.example"},
        {"event": "node_down", "node": "n9"},
        {"event": "job_end", "job_id": "41", "state": "NODE_FAIL"},
    ):
        r = env.post("hc", "/intake/slurm", body)
        assert r.status_code == 200, r.text
        assert "not borne out by Slurm" in r.json()["note"], r.json()
    assert env.temporal.sent == []
    recorded = [r for r in env.rows() if r.data.get("source") == "slurm_hook"]
    assert len(recorded) == 4  # each recorded for the audit trail, none delivered
    # The same events once Slurm's own view says so: delivered as scheduler detections.
    env.sched.set_node("n2", state=NodeState.DOWN, flags=[NodeFlag.NOT_RESPONDING])
    r = env.post(
        "hc", "/intake/slurm", {"event": "node_down", "node": "n2", "time": NOW.isoformat()}
    )
    assert r.status_code == 200 and len(r.json()["detections"]) == 1, r.text
    r = env.post("hc", "/intake/slurm", {"event": "job_end", "job_id": "43", "state": "NODE_FAIL"})
    assert r.status_code == 200 and len(r.json()["detections"]) == 1, r.text
    assert [(d.job_id, d.source.value) for d in env.temporal.sent] == [
        ("41", "scheduler"),
        ("43", "scheduler"),
    ]
