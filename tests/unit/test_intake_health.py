"""``POST /intake/health``: NVSentinel's HealthEvent (its protojson names) and the generic shape
parsed strictly; bad bodies refused with the field named and nothing recorded; a sender's
token decides whether its events convict (trusted: a ``health_event`` detection and trusted
evidence) or only point (untrusted: excluded from the job's restart, never drained, nobody's
suspicion). The console reads an embedded PostgreSQL; Slurm and Temporal are stand-ins."""

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
from relaunch.connectors.bundles import read_bundle, write_bundle
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, TokenStore, write_tokens
from relaunch.console.intake import IntakeRefused
from relaunch.console.intake.health import parse_health
from relaunch.console.web import Services
from relaunch.detection.attribution import attribute_bundle, suspects
from relaunch.detection.planning import PlanHistory, make_plan
from relaunch.models.bundle import BundleJob
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.intake import GenericHealthEvent, NvSentinelHealthEvent, history_nodes
from relaunch.models.recovery import (
    Action,
    Detection,
    DetectionSource,
    EvidenceSummary,
    JobSnapshot,
    Policy,
)
from relaunch.models.scheduler import Job, JobState
from tests.support.fake_scheduler import FakeScheduler
from tests.support.postgres import embedded_postgres

SECRET = "intake-health-test-secret-0123456789"
USERS = [
    ("nvs", ConsoleRole.INTAKE),  # trusted with health events
    ("hc", ConsoleRole.INTAKE),  # an intake sender like any other
    ("vera", ConsoleRole.VIEWER),
]
NOW = datetime.now(UTC).replace(microsecond=0)
JOURNAL = "NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def xid79(node: str = "n2", **changes: Any) -> dict[str, Any]:
    """A HealthEvent as NVSentinel's syslog-health-monitor sends it (protojson)."""
    event: dict[str, Any] = {
        "version": 1,
        "agent": "syslog-health-monitor",
        "componentClass": "GPU",
        "checkName": "SysLogsXIDError",
        "isFatal": True,
        "isHealthy": False,
        "message": "XID 79; Resolution: RESTART_BM",
        "recommendedAction": "RESTART_BM",
        "errorCode": ["79"],
        "entitiesImpacted": [
            {"entityType": "PCI", "entityValue": "0000:17:00"},
            {"entityType": "GPU", "entityValue": "GPU-a1b2c3d4-e5f6-a7b8-c9d0-e1f2a3b4c5d6"},
        ],
        "metadata": {"JOURNAL_MESSAGE": JOURNAL},
        "generatedTimestamp": NOW.isoformat().replace("+00:00", "Z"),
        "nodeName": node,
        "processingStrategy": "EXECUTE_REMEDIATION",
    }
    return {**event, **changes}


# ------------------------------------------------------------------ parsing


def test_nvsentinel_health_event_is_read_by_its_protojson_names() -> None:
    [event] = parse_health(xid79())
    assert isinstance(event, NvSentinelHealthEvent) and not event.store_only
    report = event.report(sender="nvs", trusted=True)
    assert (report.node, report.component, report.check) == ("n2", "GPU", "SysLogsXIDError")
    assert (report.error_codes, report.recommended_action) == (["79"], "RESTART_BM")
    assert report.is_fatal and not report.is_healthy and report.time == NOW
    assert report.journal == JOURNAL and "PCI:0000:17:00" in report.entities
    assert (report.source, report.sender, report.trusted) == (
        "nvsentinel/syslog-health-monitor",
        "nvs",
        True,
    )
    # Enums by number, Go's {seconds, nanos} timestamp, zero values left out, new fields.
    [terse] = parse_health(
        {
            "nodeName": "n2",
            "recommendedAction": 24,
            "processingStrategy": 2,
            "generatedTimestamp": {"seconds": int(NOW.timestamp()), "nanos": 0},
            "quarantineOverrides": {"skip": True},
        }
    )
    assert isinstance(terse, NvSentinelHealthEvent) and terse.store_only
    report = terse.report(sender="nvs", trusted=False)
    assert (report.recommended_action, report.time, report.is_fatal) == ("RESTART_BM", NOW, False)
    # HealthEvents: several in one request.
    events = parse_health({"version": 1, "events": [xid79("n1"), xid79("n2")]})
    assert [e.report(sender="x", trusted=False).node for e in events] == ["n1", "n2"]


def test_generic_health_event() -> None:
    [event] = parse_health(
        {
            "node": "gpu07.example.org",
            "is_fatal": True,
            "component": "NIC",
            "error_code": "IB_PORT_DOWN",
            "message": "mlx5_0 port 1 down",
            "recommended_action": "CONTACT_SUPPORT",
            "time": "2026-03-01T12:00:00",
            "source": "nhc",
        }
    )
    assert isinstance(event, GenericHealthEvent)
    report = event.report(sender="hc", trusted=False)
    assert report.error_codes == ["IB_PORT_DOWN"] and report.time == datetime(
        2026, 3, 1, 12, tzinfo=UTC
    )
    assert (report.node, report.component, report.source) == ("gpu07.example.org", "NIC", "nhc")


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ([xid79()], "body", "JSON object"),
        (xid79(nodeName="n2;reboot"), "nodeName", "invalid node name"),
        (xid79(nodeName="-rf"), "nodeName", "invalid node name"),
        (xid79(nodeName=7), "nodeName", "valid string"),
        (xid79(isFatal="true"), "isFatal", "valid boolean"),
        (xid79(errorCode="79"), "errorCode", "valid list"),
        (xid79(errorCode=[79]), "errorCode.0", "valid string"),
        (xid79(errorCode=["1"] * 33), "errorCode", "at most 32"),
        (xid79(recommendedAction="restart bm"), "recommendedAction", "upper-case name"),
        (xid79(recommendedAction=True), "recommendedAction", "upper-case name"),
        (xid79(message="x" * 4097), "message", "at most 4096"),
        (xid79(generatedTimestamp="yesterday"), "generatedTimestamp", "datetime"),
        (xid79(entitiesImpacted=[{"entityType": "PCI"}] * 65), "entitiesImpacted", "at most 64"),
        (xid79(metadata={"k": "v" * 4097}), "metadata.k", "at most 4096"),
        ({"events": []}, "events", "at least 1"),
        ({"events": [xid79()] * 101}, "events", "at most 100"),
        ({"events": [xid79(), xid79(nodeName="a b")]}, "events.1.nodeName", "invalid node"),
        ({"node": "n2"}, "is_fatal", "is_fatal is required"),
        ({"is_fatal": True}, "node", "node is required"),
        ({"node": "n2", "is_fatal": 1}, "is_fatal", "valid boolean"),
        ({"node": "n2", "is_fatal": True, "severity": "high"}, "severity", "unknown field"),
        ({"node": "n2", "is_fatal": True, "error_code": {"a": 1}}, "error_code", "valid list"),
        ({"node": "n2", "is_fatal": True, "component": "G" * 65}, "component", "at most 64"),
    ],
)
def test_a_bad_field_is_refused_with_its_name(body: Any, field: str, words: str) -> None:
    with pytest.raises(IntakeRefused) as refused:
        parse_health(body)
    assert refused.value.status == 422
    assert refused.value.field == field and words in refused.value.error, refused.value.error


# ------------------------------------------------------------------ over HTTP


@dataclass
class Recorder:
    """The console's Temporal delivery: the detections handed over."""

    sent: list[Detection] = field(default_factory=list)

    async def __call__(self, det: Detection) -> bool:
        self.sent.append(det)
        return True


@dataclass
class Env:
    client: TestClient
    tokens: dict[str, str]
    cluster: str
    url: str
    sched: FakeScheduler
    temporal: Recorder

    def post(self, sender: str | None, body: Any, **headers: str) -> Any:
        auth = {"authorization": f"Bearer {self.tokens[sender]}"} if sender else {}
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.client.post(
            "/intake/health",
            content=raw,
            headers={**auth, "content-type": "application/json", **headers},
        )

    def rows(self) -> list[StoredEvent]:
        async def read() -> list[StoredEvent]:
            store = await AuditStore.open(self.url)
            try:
                return await store.outside_events(self.cluster, NOW - timedelta(days=1))
            finally:
                await store.close()

        return asyncio.run(read())


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-intake-health-") as url:
        yield url


@pytest.fixture
def env(pg_url: str, tmp_path: Path) -> Iterator[Env]:
    cluster = f"h{uuid.uuid4().hex[:8]}"
    tokens = write_tokens(tmp_path / "tokens.json", USERS, trusted_health={"nvs"})
    config = ClusterConfig(
        name=cluster,
        database_url=pg_url,
        bundle_dir=str(tmp_path / "bundles"),
        console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json")),
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
    other = running.model_copy(update={"job_id": "42", "comment": "", "nodes": ["n3"]})
    sched, temporal = FakeScheduler(jobs=[running, other]), Recorder()
    app = create_app(config, Services(scheduler=sched, deliver=temporal), secret=SECRET)
    with TestClient(app) as client:
        yield Env(client, tokens, cluster, pg_url, sched, temporal)


def test_refused_requests_record_and_deliver_nothing(env: Env) -> None:
    r = env.post(None, xid79())
    assert r.status_code == 401 and r.json()["field"] == "authorization"
    assert env.post("vera", xid79()).status_code == 403  # a person's token is no intake token
    r = env.post("nvs", b"{not json")
    assert r.status_code == 400 and r.json()["field"] == "body"
    r = env.post("nvs", b"{" + b" " * (1 << 20) + b"}")
    assert r.status_code == 413 and r.json()["field"] == "body"
    r = env.post("nvs", xid79(nodeName="n2$(reboot)"))
    assert r.status_code == 422 and r.json()["field"] == "nodeName", r.text
    assert "invalid node name" in r.json()["error"]
    r = env.post("nvs", xid79(), **{"content-length": str((1 << 20) + 1)})
    assert r.status_code in (400, 413)  # refused before the body is read
    assert env.rows() == [] and env.temporal.sent == []


def test_a_trusted_sender_s_fatal_event_starts_a_recovery_as_trusted_evidence(env: Env) -> None:
    r = env.post("nvs", xid79())
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["trusted"] is True and answer["accepted"] == 1
    [entry] = answer["events"]
    assert entry["recorded"] and entry["detections"][0]["job_id"] == "41"
    [det] = env.temporal.sent
    assert det.source is DetectionSource.HEALTH_EVENT and det.nodes == ["n2"]
    assert (det.kind, det.signature, det.job_id) == ("health:SysLogsXIDError", "xid_79", "41")
    assert det.fault_time == NOW and "from nvs" in det.text
    [row] = env.rows()
    assert (row.kind, row.nodes, row.data["trusted"], row.data["sender"]) == (
        "health_event",
        ["n2"],
        True,
        "nvs",
    )
    assert row.data["report"]["error_codes"] == ["79"] and row.data["shape"] == "nvsentinel"

    # NVSentinel's retry of the same event: recorded once, delivered once.
    again = env.post("nvs", xid79()).json()["events"][0]
    assert again["note"] == "already delivered" and not again["recorded"]
    assert len(env.temporal.sent) == 1 and len(env.rows()) == 1


def test_an_untrusted_sender_s_event_points_and_never_convicts(env: Env) -> None:
    # Job 41 still runs on n2: an untrusted sender's event is recorded and points at it, and
    # restarts nothing (any intake token could otherwise requeue any watched job).
    r = env.post("hc", xid79())
    assert r.status_code == 200 and r.json()["trusted"] is False
    [event] = r.json()["events"]
    assert event["pointed"] == ["41"] and "restarts no running job" in event["note"]
    assert env.temporal.sent == []
    # The same event from the trusted sender afterwards is its own row and detection: an
    # untrusted sender cannot pre-empt a trusted one's report.
    env.post("nvs", xid79())
    assert [d.source for d in env.temporal.sent] == [DetectionSource.HEALTH_EVENT]
    # Once the job has ended abnormally, an untrusted event joins its recovery as a pointer.
    env.sched.set_job("41", state=JobState.FAILED)
    env.post("hc", xid79(message="XID 79 again"))
    [_, det] = env.temporal.sent
    assert det.source is DetectionSource.UNTRUSTED_HEALTH_EVENT and det.nodes == ["n2"]
    assert [r.data["trusted"] for r in env.rows()] == [False, True, False]


def test_healthy_non_fatal_store_only_and_unwatched_events_are_recorded_only(env: Env) -> None:
    recovered = xid79(isFatal=False, isHealthy=True, recommendedAction="NONE", errorCode=[])
    cases = [
        (recovered, "healthy: recorded, no action"),
        (xid79(isFatal=False, recommendedAction="CONTACT_SUPPORT"), "not fatal"),
        (xid79(processingStrategy="STORE_ONLY"), "STORE_ONLY"),
        (xid79("n3"), "no watched job runs on n3"),  # job 42 has not opted in
        (xid79("n9"), "no watched job runs on n9"),
    ]
    for body, note in cases:
        r = env.post("nvs", body)
        assert r.status_code == 200, r.text
        assert note in r.json()["events"][0]["note"]
    assert env.temporal.sent == []
    assert len(env.rows()) == len(cases)
    generic = {"node": "n2", "is_fatal": False, "is_healthy": True, "source": "nhc"}
    assert "healthy" in env.post("hc", generic).json()["events"][0]["note"]


# ------------------------------------------------------------------ as evidence


def _verdict_and_plan(env: Env, tmp_path: Path) -> tuple[Any, Any]:
    """The recorded events of job 41's nodes through the bundle, attribution and planning."""
    job = env.sched.jobs["41"]

    async def read() -> list[Any]:
        store = await AuditStore.open(env.url)
        try:
            return await health_evidence(store, env.cluster, job)
        finally:
            await store.close()

    health = asyncio.run(read())
    bundle_job = BundleJob(
        cluster=env.cluster,
        job_id="41",
        state="RUNNING",
        nodes=job.nodes,
        node_states=dict.fromkeys(job.nodes, "ALLOCATED"),
        observed_at=datetime.now(UTC),
        user="alice",
    )
    path = write_bundle(tmp_path / "bundle", bundle_job, "step=10 loss=0.5\n", health=health)
    verdict = attribute_bundle(read_bundle(path))
    evidence = EvidenceSummary(
        incident_id="i",
        bundle_path=str(path),
        job=JobSnapshot(job_id="41", partition="gpu", nodes=job.nodes, state="RUNNING"),
    )
    plan = make_plan(
        request_id="i/plan",
        verdict=verdict,
        evidence=evidence,
        policy=Policy(),
        history=PlanHistory(partition_size=20),
    )
    return verdict, plan


def test_a_trusted_event_convicts_its_node_with_the_event_cited(env: Env, tmp_path: Path) -> None:
    env.post("nvs", xid79())
    verdict, plan = _verdict_and_plan(env, tmp_path)
    assert verdict.category.value == "gpu_hardware" and verdict.culprit_nodes == ["n2"]
    assert verdict.corroboration == {"n2": ["health_event"]}
    assert verdict.action is Action.ISOLATE_AND_RESTART and verdict.remedies == {"n2": "reboot"}
    [line] = verdict.evidence
    assert line.source == "health.jsonl" and line.trusted and line.node == "n2"
    assert line.xid is not None and line.xid.code == 79 and "nvs" in line.text
    assert plan.action is Action.ISOLATE_AND_RESTART and plan.drain_nodes == ["n2"]


def test_an_untrusted_event_excludes_its_node_and_drains_nothing(env: Env, tmp_path: Path) -> None:
    env.post("hc", xid79())
    verdict, plan = _verdict_and_plan(env, tmp_path)
    assert verdict.culprit_nodes == ["n2"] and verdict.corroboration == {"n2": []}
    assert verdict.action is Action.EXCLUDE_AND_RESTART and verdict.confidence <= 0.7
    assert not verdict.evidence[0].trusted and verdict.evidence[0].source == (
        "health-untrusted.jsonl"
    )
    assert "untrusted sender" in verdict.summary
    # The sender is not the job's user: its naming a node is nobody's suspicion, so the jobs
    # of other users on that node can never add up to a conviction.
    assert suspects(verdict) == []
    assert plan.action is Action.EXCLUDE_AND_RESTART and plan.drain_nodes == []
    assert plan.exclude_nodes == ["n2"]
    assert any("not trusted" in reason for reason in plan.reasons), plan.reasons


def test_a_fqdn_from_kubernetes_names_the_slurm_node(env: Env, tmp_path: Path) -> None:
    """NVSentinel names the Kubernetes node, often a FQDN; Slurm names its first label."""
    r = env.post("nvs", xid79("n2.gpu.example.org"))
    assert r.status_code == 200, r.text
    [det] = env.temporal.sent
    assert det.nodes == ["n2"] and det.job_id == "41"
    [row] = env.rows()
    assert row.nodes == ["n2.gpu.example.org", "n2"]
    assert history_nodes(row.nodes) == ["n2"]
    verdict, _ = _verdict_and_plan(env, tmp_path)
    assert verdict.culprit_nodes == ["n2"] and verdict.corroboration == {"n2": ["health_event"]}


def test_relaunch_console_token_adds_a_token_trusted_with_health_events(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    runner = CliRunner()
    args = ["console", "token", "nvs", "--role", "intake", "--tokens-file", str(path)]
    made = runner.invoke(cli, [*args, "--trusted-health"])
    assert made.exit_code == 0, made.output
    other = runner.invoke(cli, ["console", "token", "hc", "--role", "intake"] + args[5:])
    assert other.exit_code == 0, other.output
    store = TokenStore(path)
    nvs = store.authenticate(made.stdout.strip().splitlines()[-1])
    hc = store.authenticate(other.stdout.strip().splitlines()[-1])
    assert nvs is not None and nvs.trusted_health and nvs.role is ConsoleRole.INTAKE
    assert hc is not None and not hc.trusted_health
    assert "trusted_health" not in json.loads(path.read_text())[1]  # left out at its default
    viewer = ["console", "token", "vera", "--role", "viewer", "--trusted-health"] + args[5:]
    refused = runner.invoke(cli, viewer)
    assert refused.exit_code == 2 and "for intake tokens" in refused.output
    again = runner.invoke(cli, args)
    assert again.exit_code == 2 and "already has a token named 'nvs'" in again.output
