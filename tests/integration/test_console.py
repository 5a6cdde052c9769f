"""The Recovery Console against the session's real PostgreSQL and Slurm: pages per role, sign-in,
CSRF, approvals, resume, audit export and paging, the live stream, and no secret on a page."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from starlette.testclient import TestClient

from relaunch.connectors.audit import AuditStore
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.devstack import procs
from relaunch.devstack.stack import Stack
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.recovery import Approval, AuditRecord

SECRET = "console-test-session-secret-0123456789"
USERS = [("vera", ConsoleRole.VIEWER), ("april", ConsoleRole.APPROVER), ("adam", ConsoleRole.ADMIN)]


@dataclass
class RecordingDecide:
    calls: list[tuple[str, str, Approval]] = field(default_factory=list)

    async def __call__(self, incident: str, decision: str, approval: Approval) -> object:
        self.calls.append((incident, decision, approval))
        return None


@dataclass
class Env:
    config: ClusterConfig
    tokens: dict[str, str]
    tokens_file: Path
    pending: str
    done: str
    job: str
    drained_node: str
    decide: RecordingDecide
    stack: Stack


async def _seed(config: ClusterConfig, pending: str, done: str, job: str, node: str) -> None:
    store = await AuditStore.open(config.database_url)
    t = datetime.now(UTC) - timedelta(minutes=5)

    async def row(incident: str, kind: str, dt: float, **kw: Any) -> None:
        await store.record(
            AuditRecord(incident_id=incident, kind=kind, at=t + timedelta(seconds=dt), **kw)
        )

    try:
        for attempt, incident in enumerate((done, pending)):
            await store.ensure_incident(incident, config.name, job, attempt)
            base = attempt * 100.0
            await row(
                incident,
                "detection",
                base,
                summary="job_log: signature:xid_79",
                nodes=[node],
                data={
                    "source": "job_log",
                    "detection_latency_s": 0.25,
                    "fault_time": (t + timedelta(seconds=base - 0.25)).isoformat(),
                },
            )
            await row(incident, "stage", base + 0.1, stage="gathering", summary="gathering")
            await row(
                incident,
                "evidence",
                base + 0.5,
                summary="job evidence",
                nodes=[node],
                data={
                    "job": {
                        "job_id": job,
                        "comment": "relaunch=on",
                        "last_checkpoint_step": 400 + attempt,
                    },
                    "log_excerpt": ["step 400", "NVRM: Xid 79, GPU has fallen off the bus"],
                },
            )
            await row(
                incident,
                "verdict",
                base + 0.6,
                nodes=[node],
                summary=f"gpu_hardware on {node} (confidence 0.95)",
                data={
                    "category": "gpu_hardware",
                    "culprit_nodes": [node],
                    "confidence": 0.95,
                    "action": "isolate_and_restart",
                    "summary": "Xid 79",
                    "implicated": [node],
                    "evidence": [
                        {
                            "source": "job_log",
                            "line_no": 2,
                            "signature": "xid_79",
                            "text": "NVRM: Xid 79, GPU has fallen off the bus",
                            "role": "root",
                            "node": node,
                            "count": 1,
                            "xid": {
                                "code": 79,
                                "words": "GPU has fallen off the bus",
                                "action": "RESTART_BM",
                                "outcome": "drain",
                                "remedy": "reboot",
                                "detail": "immediate action RESTART_BM",
                                "implicates": "node",
                            },
                        },
                        {
                            "source": "job_log",
                            "line_no": 9,
                            "signature": "nccl_watchdog",
                            "text": "NCCL watchdog",
                            "role": "cascade",
                            "node": None,
                            "count": 3,
                        },
                    ],
                },
            )
            await row(
                incident,
                "plan",
                base + 0.7,
                nodes=[node],
                summary=f"isolate_and_restart (monitor), drain {node}",
                data={
                    "action": "isolate_and_restart",
                    "mode": "monitor",
                    "drain_nodes": [node],
                    "reasons": ["gpu_hardware"],
                    "guards": [],
                },
            )
            await row(
                incident,
                "stage",
                base + 0.8,
                stage="awaiting_approval",
                summary="recommend isolate_and_restart",
            )
        await row(
            done,
            "approval",
            10,
            actor="april",
            summary="approved by april",
            data={"decision": "approve", "by": "april"},
        )
        await row(done, "stage", 10.1, stage="isolating", summary="isolating")
        await row(
            done,
            "action",
            10.5,
            nodes=[node],
            summary=f"drain {node}: done",
            data={"step": "drain", "action": "drain", "target": node, "changed": True},
        )
        await row(
            done,
            "action",
            11,
            summary=f"requeue {job}: done",
            data={"step": "restart", "action": "requeue", "target": job, "changed": True},
        )
        await row(done, "verify", 30, summary="RUNNING on n1", data={"job_id": job})
        await row(done, "stage", 30.1, stage="done", summary="recovered")
    finally:
        await store.close()


@pytest.fixture(scope="module")
def env(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("console")
    name = f"con{os.getpid() % 10000}"
    tokens_file = tmp / "tokens.json"
    tokens = write_tokens(tokens_file, USERS)
    config = ClusterConfig(
        name=name,
        **stack.slurm.config_fields,
        temporal_address=stack.temporal_address,
        temporal_ui=stack.temporal_ui,
        database_url=stack.database_url,
        bundle_dir=str(tmp / "bundles"),
        console=ConsoleSettings(tokens_file=str(tokens_file)),
    )
    job = f"9{os.getpid() % 100000}"
    node = stack.slurm.nodes[-1]
    pending, done = f"relaunch-{name}-{job}-1", f"relaunch-{name}-{job}-0"
    asyncio.run(_seed(config, pending, done, job, node))
    # Drained the way the isolate activity drains: the reason names the incident.
    asyncio.run(stack.scheduler().drain_node(node, f"relaunch incident {done}"))
    try:
        yield Env(config, tokens, tokens_file, pending, done, job, node, RecordingDecide(), stack)
    finally:
        asyncio.run(stack.scheduler().resume_node(node))


@pytest.fixture
def client(env: Env) -> Iterator[TestClient]:
    env.decide.calls.clear()
    app = create_app(
        env.config,
        Services(decide=env.decide, scheduler=env.stack.scheduler()),
        secret=SECRET,
    )
    with TestClient(app, follow_redirects=False) as c:
        yield c


def sign_in(client: TestClient, env: Env, name: str) -> None:
    page = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text
    r = client.post("/login", data={"token": env.tokens[name], "csrf": csrf[1], "next": "/"})
    assert r.status_code == 303, r.text
    assert "httponly" in r.headers["set-cookie"].lower()
    assert "samesite=strict" in r.headers["set-cookie"].lower()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found
    return found[1]


def audit_count(env: Env, incident: str) -> int:
    with psycopg.connect(env.config.database_url) as conn:
        row = conn.execute(
            "select count(*) from audit_events where incident_id = %s", (incident,)
        ).fetchone()
        return int(row[0]) if row else 0


def pages(env: Env) -> list[str]:
    return [
        "/",
        "/?window=7d",
        "/?window=30d",
        "/fragments/incidents",
        f"/incidents/{env.pending}",
        f"/incidents/{env.done}",
        f"/fragments/incident/{env.pending}",
        "/nodes",
        "/jobs",
        f"/jobs/{env.job}?cluster={env.config.name}",
        "/audit",
        f"/audit?job={env.job}&cluster={env.config.name}",
        "/audit?category=gpu_hardware&kind=verdict",
        "/audit.json",
        "/audit.csv",
    ]


def test_unauthenticated_requests_go_to_sign_in(client: TestClient, env: Env) -> None:
    r = client.get(f"/incidents/{env.pending}")
    assert r.status_code == 303
    assert r.headers["location"].startswith("/login?next=%2Fincidents%2F")
    assert client.get("/audit.json").status_code == 401
    bad = client.get("/", headers={"authorization": "Bearer rl_wrong"})
    assert bad.status_code == 401


def test_sign_in_refuses_an_unknown_token_and_a_forged_form(client: TestClient, env: Env) -> None:
    page = client.get("/login")
    r = client.post("/login", data={"token": "rl_wrong", "csrf": csrf_of(page.text)})
    assert r.status_code == 401 and "unknown token" in r.text
    r = client.post("/login", data={"token": env.tokens["vera"], "csrf": "forged"})
    assert r.status_code == 403 and "relaunch_session" not in r.headers.get("set-cookie", "")


@pytest.mark.parametrize("name", [n for n, _ in USERS])
def test_every_page_renders_for_each_role(client: TestClient, env: Env, name: str) -> None:
    sign_in(client, env, name)
    for path in pages(env):
        r = client.get(path)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:500]}"
    incident = client.get(f"/incidents/{env.pending}").text
    assert 'data-test="timeline"' in incident and 'data-test="evidence-line"' in incident
    assert 'data-decisive="true"' in incident  # the root-cause line is highlighted
    # What NVIDIA's Xid catalogue says of the line, and the rung the node needs.
    assert "immediate action RESTART_BM → drain, remedy reboot" in incident
    assert "workflows/" + env.pending in incident  # the Temporal UI link
    nodes = client.get("/nodes").text
    role = dict(USERS)[name]
    assert ('data-test="approve"' in incident) == (role is not ConsoleRole.VIEWER)
    assert ('data-test="reject"' in incident) == (role is not ConsoleRole.VIEWER)
    assert ('data-test="resume"' in nodes) == (role is ConsoleRole.ADMIN)
    overview = client.get("/").text
    assert 'data-test="pending-approvals"' in overview and env.pending in overview


def test_job_page_shows_lineage_checkpoints_and_restarts(client: TestClient, env: Env) -> None:
    sign_in(client, env, "vera")
    html = client.get(f"/jobs/{env.job}?cluster={env.config.name}").text
    assert html.count('data-test="attempt-row"') == 2
    assert ">401<" in html  # the latest checkpoint step of the evidence
    assert re.search(r'data-test="job-restarts"><b>1<', html)


def test_viewer_cannot_approve(client: TestClient, env: Env) -> None:
    sign_in(client, env, "vera")
    csrf = csrf_of(client.get(f"/incidents/{env.pending}").text)
    before = audit_count(env, env.pending)
    r = client.post(f"/incidents/{env.pending}/approve", data={"csrf": csrf, "reason": "x"})
    assert r.status_code == 403
    assert env.decide.calls == [] and audit_count(env, env.pending) == before


def test_missing_or_wrong_csrf_changes_nothing(client: TestClient, env: Env) -> None:
    sign_in(client, env, "april")
    before = audit_count(env, env.pending)
    for data in ({"reason": "no token"}, {"reason": "forged", "csrf": "0" * 64}):
        for decision in ("approve", "reject"):
            r = client.post(f"/incidents/{env.pending}/{decision}", data=data)
            assert r.status_code == 403, r.text
            assert "CSRF" in r.text
    sign_in(client, env, "adam")
    r = client.post(f"/nodes/{env.drained_node}/resume", data={"csrf": "0" * 64})
    assert r.status_code == 403
    assert env.decide.calls == [] and audit_count(env, env.pending) == before


def test_approve_names_the_person(client: TestClient, env: Env) -> None:
    sign_in(client, env, "april")
    csrf = csrf_of(client.get(f"/incidents/{env.pending}").text)
    r = client.post(
        f"/incidents/{env.pending}/approve", data={"csrf": csrf, "reason": "Xid 79 is real"}
    )
    assert r.status_code == 303
    assert r.headers["location"] == f"/incidents/{env.pending}?decided=approve"
    assert env.decide.calls == [
        (env.pending, "approve", Approval(by="april", reason="Xid 79 is real"))
    ]


def test_a_node_decision_page_says_what_one_approval_covers(client: TestClient, env: Env) -> None:
    """A node decision awaiting approval shows its node and the jobs it covers; a job whose
    recovery joined it links to it."""
    name = env.config.name
    decision = f"relaunch-{name}-node-n7-1"
    jobs = [f"relaunch-{name}-{j}-0" for j in (9001, 9002)]

    async def seed() -> None:
        store = await AuditStore.open(env.config.database_url)
        try:
            await store.ensure_incident(decision, name, "", 1)
            for job_id, incident in zip(("9001", "9002"), jobs, strict=True):
                await store.ensure_incident(incident, name, job_id, 0)
                await store.record(
                    AuditRecord(
                        incident_id=incident,
                        kind="node_decision",
                        at=datetime.now(UTC),
                        nodes=["n7"],
                        summary=f"joined the node decision of n7: {decision}",
                        data={"decisions": {"n7": decision}, "requeue_by": decision},
                    )
                )
            for kind, stage, data in (
                ("stage", "planning", {}),
                ("plan", None, {"action": "isolate_and_restart", "drain_nodes": ["n7"]}),
                ("stage", "awaiting_approval", {}),
            ):
                await store.record(
                    AuditRecord(
                        incident_id=decision,
                        kind=kind,
                        at=datetime.now(UTC),
                        stage=stage,
                        nodes=["n7"],
                        summary=f"{kind} {stage or ''}",
                        data=data,
                    )
                )
        finally:
            await store.close()

    asyncio.run(seed())
    sign_in(client, env, "april")
    page = client.get(f"/incidents/{decision}")
    assert page.status_code == 200, page.text
    covers = re.search(r'data-test="decision-covers">(.*?)</p>', page.text, re.S)
    assert covers is not None and "<b>n7</b>" in covers.group(1), page.text
    assert "covers <b>2</b> jobs" in covers.group(1)
    assert all(f"/incidents/{i}" in page.text for i in jobs)
    assert 'data-test="approve-form"' in page.text  # one approval, for every job it covers
    joined = client.get(f"/incidents/{jobs[0]}").text
    assert f'href="/incidents/{decision}"' in joined and 'data-test="joined"' in joined


def test_user_errors_are_clear_4xx_pages(client: TestClient, env: Env) -> None:
    sign_in(client, env, "vera")
    cases = {
        "/incidents/relaunch-nope-1-0": 404,
        "/?window=1y": 400,
        "/audit?category=cosmic_rays": 400,
        "/audit?before=abc": 400,
        "/audit?since=yesterday": 400,
        "/audit.json?limit=0": 400,
        "/no/such/page": 404,
    }
    for path, status in cases.items():
        r = client.get(path)
        assert r.status_code == status, path
        assert "Traceback" not in r.text


def test_export_and_paging_return_the_right_rows(client: TestClient, env: Env) -> None:
    auth = {"authorization": f"Bearer {env.tokens['vera']}"}
    everything = client.get(f"/audit.json?incident={env.done}", headers=auth).json()
    ids = [r["id"] for r in everything["rows"]]
    assert len(ids) == audit_count(env, env.done) and ids == sorted(ids, reverse=True)
    paged: list[int] = []
    before: int | None = None
    while True:
        q = f"/audit.json?incident={env.done}&limit=3" + (f"&before={before}" if before else "")
        page = client.get(q, headers=auth).json()
        paged += [r["id"] for r in page["rows"]]
        before = page["next_before"]
        if before is None:
            break
    assert paged == ids
    actions = client.get(f"/audit.json?incident={env.done}&action=drain", headers=auth).json()
    assert [r["kind"] for r in actions["rows"]] == ["action"]
    csv = client.get(f"/audit.csv?incident={env.done}&actor=april", headers=auth)
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.strip().splitlines()
    assert lines[0].startswith("id,at,incident_id,kind") and len(lines) == 2
    assert ",approval," in lines[1]
    html = client.get(f"/audit?incident={env.done}", headers=auth).text
    assert html.count('data-test="audit-row"') == len(ids)


def test_resume_is_for_admins_and_relaunch_drains_only(client: TestClient, env: Env) -> None:
    node = env.drained_node
    sign_in(client, env, "april")
    csrf = csrf_of(client.get("/nodes").text)
    assert client.post(f"/nodes/{node}/resume", data={"csrf": csrf}).status_code == 403
    sign_in(client, env, "adam")
    html = client.get("/nodes").text
    assert f"relaunch incident {env.done}" in html
    other = env.stack.slurm.nodes[0]
    r = client.post(f"/nodes/{other}/resume", data={"csrf": csrf_of(html)})
    assert r.status_code == 409  # not drained by Relaunch: left to Slurm's tools
    r = client.post(f"/nodes/{node}/resume", data={"csrf": csrf_of(html)})
    assert r.status_code == 303, r.text
    assert not asyncio.run(env.stack.scheduler().get_node(node)).drain_flag
    with psycopg.connect(env.config.database_url) as conn:
        row = conn.execute(
            "select actor, data->>'step' from audit_events where incident_id = %s"
            " and kind = 'action' order by id desc limit 1",
            (env.done,),
        ).fetchone()
    assert row == ("adam", "resume")
    asyncio.run(env.stack.scheduler().drain_node(node, f"relaunch incident {env.done}"))


def test_no_secret_reaches_a_page(client: TestClient, env: Env) -> None:
    sign_in(client, env, "adam")
    bodies = [client.get(p).text for p in pages(env)]
    bodies.append(client.get("/login").text)
    for body in bodies:
        for token in env.tokens.values():
            assert token not in body
        assert SECRET not in body
        assert env.config.database_url not in body
        assert "postgresql://" not in body


def test_database_down_is_a_503_page(env: Env) -> None:
    port = procs.free_port()
    config = env.config.model_copy(
        update={"database_url": f"postgresql://relaunch:hunter2pw@127.0.0.1:{port}/audit"}
    )
    app = create_app(config, Services(), secret=SECRET)
    with TestClient(app, follow_redirects=False) as c:
        auth = {"authorization": f"Bearer {env.tokens['vera']}"}
        r = c.get("/", headers={**auth, "accept": "text/html"})
        assert r.status_code == 503
        assert "hunter2pw" not in r.text
        r = c.get(f"/incidents/{env.pending}", headers=auth)
        assert r.status_code == 503 and "hunter2pw" not in r.text


def test_live_stream_delivers_a_new_audit_row(env: Env) -> None:
    app = create_app(env.config, Services(), secret=SECRET, live_interval=0.2)
    port = procs.free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        summary = f"live test row {time.time()}"
        headers = {"authorization": f"Bearer {env.tokens['vera']}"}
        seen: list[str] = []
        with (
            httpx.Client(timeout=15) as http,
            http.stream("GET", f"http://127.0.0.1:{port}/events", headers=headers) as r,
        ):
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            assert next(lines).startswith("retry:")  # subscribed: rows from now on arrive

            async def record() -> None:
                store = await AuditStore.open(env.config.database_url)
                try:
                    await store.record(
                        AuditRecord(
                            incident_id=env.pending,
                            kind="stage",
                            stage="awaiting_approval",
                            at=datetime.now(UTC),
                            summary=summary,
                        )
                    )
                finally:
                    await store.close()

            asyncio.run(record())
            for line in lines:
                seen.append(line)
                if summary in line:
                    break
                assert time.monotonic() < deadline, seen
        assert any(line.startswith("event: audit") for line in seen)
        assert any(summary in line and env.pending in line for line in seen)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
