"""The console's versioned API, `/api/v1`: every resource, the console's roles and cluster
scopes, keyset pages, JSON errors, approve/reject exactly once under retries, and the OpenAPI
document (valid OpenAPI 3.1, listing every route, and describing what the routes answer).

The console reads a real PostgreSQL (an embedded one, started for this module). Temporal is a
stand-in per cluster that takes one decision per request, as the workflow's `decide` update
validator does, and records it in the audit trail as the workflow does (an ``approval`` /
``rejection`` row naming the request), right away or a little later.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest
from openapi_spec_validator import validate
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.temporal import TemporalUnavailableError
from relaunch.console.api import decisions
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.lifecycles import pending_of
from relaunch.console.routes_auth import LOGIN_NONCE_COOKIE
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import lifecycle_id
from relaunch.models.recovery import DRAIN_REASON_PREFIX, Approval, AuditRecord
from relaunch.models.scheduler import Node, NodeFlag, NodeState
from tests.support.fake_scheduler import FakeScheduler
from tests.support.postgres import embedded_postgres

SECRET = "api-v1-test-session-secret-0123456789"
API = "/api/v1"
USERS = [
    ("ana", ConsoleRole.APPROVER),  # a only
    ("vic", ConsoleRole.VIEWER),  # every cluster
    ("root", ConsoleRole.ADMIN),  # every cluster
    ("bea", ConsoleRole.APPROVER),  # b only
    ("am", ConsoleRole.INTAKE),  # every cluster
]
SCOPES = {"ana": ["a"], "bea": ["b"]}
# Pending plans of cluster a, one per test that decides (the workflow takes one decision each).
PENDING = {
    name: f"relaunch-a-{100 + i}-0"
    for i, name in enumerate(
        ["approve", "retry", "by_request", "crossing", "conflict", "key_reuse", "cookie", "down"]
    )
}
DONE_A = [f"relaunch-a-{200 + i}-0" for i in range(5)]  # finished recoveries, gpu_hardware
APP_ERROR_A = "relaunch-a-300-0"  # an application failure, held
B_PENDING = "relaunch-b-400-0"
LIFECYCLE = lifecycle_id("a", "a-n3", 1)
LIFECYCLE_WAITING = lifecycle_id("a", "a-n2", 1)  # its reboot waits for a decision


def _request(incident: str) -> str:
    return f"{incident}/plan"


@dataclass
class Temporal:
    """One cluster's decider: one decision per request (later ones refused as the validator
    refuses them), recorded as the workflow records it, at once or after ``row_delay_s``."""

    url: str
    calls: list[tuple[str, str, Approval]] = field(default_factory=list)
    decided: dict[str, str] = field(default_factory=dict)
    row_delay_s: float = 0.0
    down: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def decide(self, incident: str, decision: str, approval: Approval) -> object:
        if self.down:
            raise TemporalUnavailableError("cannot reach Temporal at 127.0.0.1:1")
        self.calls.append((incident, decision, approval))
        if incident in self.decided:
            raise RelaunchError(f"incident {incident}: {decision} refused: already decided")
        self.decided[incident] = decision
        if self.row_delay_s:
            self.tasks.append(asyncio.create_task(self._record(incident, decision, approval)))
        else:
            await self._record(incident, decision, approval)
        return None

    async def _record(self, incident: str, decision: str, approval: Approval) -> None:
        await asyncio.sleep(self.row_delay_s)
        store = await AuditStore.open(self.url)
        try:
            pending = pending_of(await store.events(incident), 3600)
            request = pending.request_id if pending else ""
            await store.record(
                AuditRecord(
                    incident_id=incident,
                    kind="approval" if decision == "approve" else "rejection",
                    at=datetime.now(UTC),
                    actor=approval.by,
                    summary=f"{decision} by {approval.by}",
                    data={
                        "decision": decision,
                        "by": approval.by,
                        "reason": approval.reason,
                        "request_id": request,
                    },
                ),
                dedupe_key=f"{incident}/decision",
            )
        finally:
            await store.close()


@dataclass
class Env:
    client: TestClient
    tokens: dict[str, str]
    temporal: dict[str, Temporal]
    url: str
    spec: dict[str, Any] = field(default_factory=dict)

    def auth(self, user: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[user]}"}

    def get(self, user: str, path: str, **kw: Any) -> Any:
        return self.client.get(API + path, headers=self.auth(user), **kw)

    def post(self, user: str, path: str, headers: dict[str, str] | None = None, **kw: Any) -> Any:
        return self.client.post(API + path, headers={**self.auth(user), **(headers or {})}, **kw)

    def rows(self, incident: str, kind: str) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "select count(*) from audit_events where incident_id = %s and kind = %s",
                (incident, kind),
            ).fetchone()
            return int(row[0]) if row else 0


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-api-v1-") as url:
        yield url


def _recovery(incident: str, node: str, t: datetime, **how: Any) -> list[AuditRecord]:
    category, action = how.get("category", "gpu_hardware"), how.get("action", "isolate_and_restart")
    rows = [
        AuditRecord(
            incident_id=incident,
            kind="detection",
            at=t,
            nodes=[node],
            summary=f"job_log: signature:xid_79 on {node}",
            data={"source": "job_log", "detection_latency_s": 0.5},
        ),
        AuditRecord(
            incident_id=incident,
            kind="verdict",
            at=t + timedelta(seconds=1),
            nodes=[node],
            summary=f"{category} on {node}",
            data={
                "category": category,
                "culprit_nodes": [node],
                "implicated": [node],
                "confidence": 0.9,
                "action": action,
                "evidence": [{"role": "root", "source": "job_log", "text": "Xid 79", "node": node}],
            },
        ),
        AuditRecord(
            incident_id=incident,
            kind="plan",
            at=t + timedelta(seconds=2),
            nodes=[node],
            summary=f"{action} (monitor), drain {node}",
            data={
                "request_id": _request(incident),
                "action": action,
                "mode": "monitor",
                "drain_nodes": [node],
                "reasons": ["Xid 79"],
                "guards": [{"guard": "blast_radius", "allowed": True}],
            },
        ),
        AuditRecord(
            incident_id=incident,
            kind="stage",
            stage="awaiting_approval",
            at=t + timedelta(seconds=3),
            summary=f"recommend {action}",
            data={"request_id": _request(incident)},
        ),
    ]
    if how.get("end"):
        rows.append(
            AuditRecord(
                incident_id=incident,
                kind="stage",
                stage=how["end"],
                at=t + timedelta(seconds=4),
                summary=how["end"],
            )
        )
    return rows


async def _seed(url: str) -> None:
    store = await AuditStore.open(url)
    t = datetime.now(UTC) - timedelta(hours=1)
    try:
        plan: list[tuple[str, str, str, dict[str, Any]]] = [
            *((i, "a", "a-n1", {"end": "done"}) for i in DONE_A),
            (
                APP_ERROR_A,
                "a",
                "a-n2",
                {"end": "held", "category": "application", "action": "hold"},
            ),
            *((i, "a", "a-n1", {}) for i in PENDING.values()),
            (B_PENDING, "b", "b-n1", {}),
        ]
        for n, (incident, cluster, node, how) in enumerate(plan):
            await store.ensure_incident(incident, cluster, incident.split("-")[2], 0)
            for row in _recovery(incident, node, t + timedelta(minutes=n), **how):
                await store.record(row)
        await store.record(
            AuditRecord(
                incident_id=DONE_A[0],
                kind="action",
                at=t + timedelta(seconds=5),
                nodes=["a-n1"],
                summary="drain a-n1: done",
                data={"step": "drain", "changed": True},
            )
        )
        await store.ensure_incident(LIFECYCLE_WAITING, "a", "", 1)
        await store.record(
            AuditRecord(
                incident_id=LIFECYCLE_WAITING,
                kind="stage",
                stage="awaiting_approval",
                at=t,
                nodes=["a-n2"],
                summary="recommend reboot a-n2: the checks failed",
                data={"request_id": f"{LIFECYCLE_WAITING}/1:reboot", "step": "reboot"},
            )
        )
        await store.ensure_incident(LIFECYCLE, "a", "", 1)
        await store.record(
            AuditRecord(
                incident_id=LIFECYCLE,
                kind="node_stage",
                stage="diagnosing",
                at=t,
                nodes=["a-n3"],
                summary="checking a-n3",
            )
        )
    finally:
        await store.close()


def _sched(name: str) -> FakeScheduler:
    drained = Node(
        name=f"{name}-n1",
        state=NodeState.IDLE,
        flags=[NodeFlag.DRAIN],
        reason=f"{DRAIN_REASON_PREFIX}relaunch-{name}-200-0",
    )
    idle = [Node(name=f"{name}-n{i}", state=NodeState.IDLE) for i in (2, 3)]
    return FakeScheduler(nodes=[drained, *idle])


@pytest.fixture(scope="module")
def env(pg_url: str) -> Iterator[Env]:
    asyncio.run(_seed(pg_url))
    tmp = Path(tempfile.mkdtemp(prefix="relaunch-api-v1-cfg-"))
    tokens = write_tokens(tmp / "tokens.json", USERS, SCOPES)
    config = {
        name: ClusterConfig(name=name, database_url=pg_url, bundle_dir=str(tmp / name))
        for name in ("a", "b")
    }
    temporal = {name: Temporal(pg_url) for name in config}

    def services(name: str) -> Services:
        return Services(decide=temporal[name].decide, scheduler=_sched(name))

    app = create_app(
        config["a"],
        services("a"),
        tokens_file=tmp / "tokens.json",
        secret=SECRET,
        other_clusters=[(config["b"], services("b"))],
    )
    with TestClient(app, follow_redirects=False) as client:
        spec = client.get(f"{API}/openapi.json").json()
        yield Env(client, tokens, temporal, pg_url, spec)
    shutil.rmtree(tmp, ignore_errors=True)


def conforms(env: Env, method: str, path: str, answer: Any, status: int = 200) -> None:
    """The answer validates against the OpenAPI document's schema for this path and status."""
    op = env.spec["paths"][API + path][method.lower()]
    schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
    jsonschema.validate(
        answer.json(),
        {**schema, "components": env.spec["components"]},
        cls=jsonschema.Draft202012Validator,
    )


def _all_pages(env: Env, user: str, path: str, limit: int, **params: str) -> list[str]:
    ids: list[str] = []
    cursor: str | None = None
    for _ in range(100):
        query = {**params, "limit": str(limit), **({"cursor": cursor} if cursor else {})}
        r = env.get(user, path, params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= limit
        ids += [str(item["id"]) for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids
    raise AssertionError("the pages never ended")


# ------------------------------------------------------------------ reading


def test_every_resource_answers_a_viewer_as_its_document_says(env: Env) -> None:
    pending = PENDING["approve"]
    reads = {
        "/me": "/me",
        "/incidents": "/incidents",
        "/incidents/{incident_id}": f"/incidents/{pending}",
        "/incidents/{incident_id}/timeline": f"/incidents/{pending}/timeline",
        "/incidents/{incident_id}/verdict": f"/incidents/{pending}/verdict",
        "/incidents/{incident_id}/plan": f"/incidents/{pending}/plan",
        "/nodes": "/nodes",
        "/nodes/{node}": "/nodes/a-n1",
        "/audit": "/audit",
        "/scorecard": "/scorecard",
        "/rollout": "/rollout",
        "/pause": "/pause",
    }
    for template, path in reads.items():
        r = env.get("vic", path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"] == "application/json"
        conforms(env, "GET", template, r)
    # Every GET of the document is among them.
    gets = {p.removeprefix(API) for p, ops in env.spec["paths"].items() if "get" in ops}
    assert gets - set(reads) == {"/openapi.json"}

    detail = env.get("vic", f"/incidents/{pending}").json()
    assert detail["incident"]["cluster"] == "a" and detail["kind"] == "recovery"
    assert detail["stage"] == "awaiting_approval" and detail["awaiting_approval"] is True
    assert detail["request_id"] == _request(pending) and detail["mode"] == "monitor"
    assert detail["verdict"]["category"] == "gpu_hardware"
    assert detail["plan"]["action"] == "isolate_and_restart"
    assert detail["plan"]["drain_nodes"] == ["a-n1"]
    timeline = env.get("vic", f"/incidents/{pending}/timeline").json()["items"]
    assert [e["kind"] for e in timeline] == ["detection", "verdict", "plan", "stage"]
    verdict = env.get("vic", f"/incidents/{pending}/verdict").json()
    assert verdict["evidence_lines"][0]["decisive"] is True
    nodes = {n["name"]: n for n in env.get("vic", "/nodes").json()["items"]}
    assert nodes["a-n1"]["drained_by_relaunch"] is True
    assert nodes["a-n1"]["drain"]["incident_id"] == DONE_A[0]
    assert nodes["a-n1"]["reputation"]["incidents"] >= 1
    assert nodes["a-n3"]["lifecycle_stage"] == "diagnosing"
    assert nodes["a-n2"]["state"] == "IDLE" and nodes["a-n2"]["drained_by_relaunch"] is False
    cards = env.get("vic", "/scorecard").json()["items"]
    assert [c["cluster"] for c in cards] == ["a", "b"]
    assert (
        env.get("vic", "/scorecard", params={"cluster": "b"}).json()["items"][0]["cluster"] == "b"
    )


def test_an_incident_without_a_verdict_or_plan_and_an_unknown_one_are_404(env: Env) -> None:
    for path in (f"/incidents/{LIFECYCLE}/verdict", f"/incidents/{LIFECYCLE}/plan"):
        r = env.get("vic", path)
        assert r.status_code == 404 and r.json()["error"].startswith(f"incident {LIFECYCLE}")
    detail = env.get("vic", f"/incidents/{LIFECYCLE}").json()
    assert detail["kind"] == "lifecycle" and detail["node"] == "a-n3"
    assert detail["stage"] == "diagnosing"
    for path in ("/incidents/relaunch-a-999-0", "/incidents/intake-a", "/nodes/a-n99"):
        r = env.get("vic", path)
        assert r.status_code == 404 and set(r.json()) == {"error", "field"}
    r = env.get("vic", "/no/such/thing")
    assert r.status_code == 404 and "openapi.json" in r.json()["error"]
    assert env.client.delete(f"{API}/incidents", headers=env.auth("vic")).status_code == 405


def test_filters_narrow_the_incident_list(env: Env) -> None:
    def ids(**params: str) -> set[str]:
        r = env.get("vic", "/incidents", params=params)
        assert r.status_code == 200, r.text
        return {i["id"] for i in r.json()["items"]}

    assert ids(category="application") == {APP_ERROR_A}
    assert ids(stage="done") == set(DONE_A)
    assert ids(stage="held", cluster="a") == {APP_ERROR_A}
    assert ids(job="400") == {B_PENDING}
    assert ids(node="b-n1") == {B_PENDING}
    assert ids(cluster="b") == {B_PENDING}
    assert ids(until="2001-01-01T00:00:00Z") == set()
    assert B_PENDING in ids(since=(datetime.now(UTC) - timedelta(days=1)).isoformat())
    rows = env.get("vic", "/audit", params={"incident": APP_ERROR_A, "kind": "verdict"}).json()
    assert [(e["incident_id"], e["kind"]) for e in rows["items"]] == [(APP_ERROR_A, "verdict")]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"category": "cosmic_rays"}, "category"),
        ({"stage": "sleeping"}, "stage"),
        ({"since": "yesterday"}, "since"),
        ({"job": "1;rm -rf"}, "job"),
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"colour": "red"}, "colour"),
        ({"cluster": "../etc"}, "cluster"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(env: Env, params: dict[str, str], field: str) -> None:
    r = env.get("vic", "/incidents", params=params)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and r.json()["error"]


def test_a_cursor_of_another_list_is_refused(env: Env) -> None:
    page = env.get("vic", "/audit", params={"limit": "1"}).json()
    r = env.get("vic", "/incidents", params={"cursor": page["next_cursor"]})
    assert r.status_code == 400 and r.json()["field"] == "cursor"


def test_pages_of_two_walk_every_row_exactly_once(env: Env) -> None:
    everything = [
        i["id"] for i in env.get("vic", "/incidents", params={"limit": "500"}).json()["items"]
    ]
    assert len(everything) >= 15
    paged = _all_pages(env, "vic", "/incidents", 2)
    assert paged == everything and len(set(paged)) == len(paged)
    # Filtered lists page the same way.
    done = _all_pages(env, "vic", "/incidents", 2, stage="done")
    assert sorted(done) == sorted(DONE_A)
    # A timeline oldest first; the audit search newest first.
    incident = PENDING["approve"]
    whole = env.get("vic", f"/incidents/{incident}/timeline").json()["items"]
    assert _all_pages(env, "vic", f"/incidents/{incident}/timeline", 2) == [
        str(e["id"]) for e in whole
    ]
    audit = _all_pages(env, "vic", "/audit", 2, cluster="a", kind="verdict")
    assert len(audit) == len(set(audit)) == len(DONE_A) + 1 + len(PENDING)
    assert audit == sorted(audit, key=int, reverse=True)


# ------------------------------------------------------------------ who may


def test_without_a_token_every_call_is_401(env: Env) -> None:
    for r in (
        env.client.get(f"{API}/incidents"),
        env.client.get(f"{API}/incidents", headers={"authorization": "Bearer rl_nope"}),
        env.client.post(f"{API}/incidents/{PENDING['approve']}/approve", json={}),
    ):
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]
    # The document itself needs no sign-in.
    assert env.client.get(f"{API}/openapi.json").status_code == 200


def test_an_intake_token_may_not_use_the_api(env: Env) -> None:
    incident = PENDING["approve"]
    for path in env.spec["paths"]:
        if path.endswith("openapi.json"):
            continue
        concrete = path.removeprefix(API).format(incident_id=incident, node="a-n1", cluster="a")
        for method in env.spec["paths"][path]:
            r = env.client.request(method, API + concrete, headers=env.auth("am"), json={})
            assert r.status_code == 403, (method, path, r.text)
            assert "intake" in r.json()["error"]
    assert env.temporal["a"].calls == []


def test_a_viewer_cannot_approve(env: Env) -> None:
    incident = PENDING["approve"]
    r = env.post("vic", f"/incidents/{incident}/approve", json={"reason": "looks right"})
    assert r.status_code == 403 and "approver" in r.json()["error"]
    assert not any(c[0] == incident for c in env.temporal["a"].calls)
    assert env.rows(incident, "approval") == 0


def test_a_token_limited_to_a_cluster_sees_only_that_cluster(env: Env) -> None:
    listed = {
        i["cluster"] for i in env.get("ana", "/incidents", params={"limit": "500"}).json()["items"]
    }
    assert listed == {"a"}
    assert env.get("ana", "/me").json()["clusters"] == ["a"]
    rows = env.get("ana", "/audit", params={"limit": "1000"}).json()["items"]
    assert rows and B_PENDING not in {e["incident_id"] for e in rows}
    assert [c["cluster"] for c in env.get("ana", "/scorecard").json()["items"]] == ["a"]
    # Asking for b: refused; b's incident: as if it did not exist.
    for path, params in (
        ("/incidents", {"cluster": "b"}),
        ("/audit", {"cluster": "b"}),
        ("/nodes", {"cluster": "b"}),
        ("/nodes/b-n1", {"cluster": "b"}),
        ("/scorecard", {"cluster": "b"}),
        ("/rollout", {"cluster": "b"}),
    ):
        r = env.get("ana", path, params=params)
        assert r.status_code == 403 and "limited to cluster a" in r.json()["error"], path
    for path in (f"/incidents/{B_PENDING}", f"/incidents/{B_PENDING}/timeline"):
        r = env.get("ana", path)
        assert r.status_code == 404
        assert r.json() == {"error": f"no incident {B_PENDING!r}", "field": None}
    r = env.post("ana", f"/incidents/{B_PENDING}/approve", json={})
    assert r.status_code == 404
    assert env.temporal["b"].calls == []
    # The nodes of the one cluster it sees, by default.
    assert env.get("ana", "/nodes").json()["cluster"] == "a"
    assert env.get("bea", "/nodes").json()["cluster"] == "b"


def test_a_session_cookie_reads_and_decides_with_its_csrf_token(env: Env) -> None:
    client = TestClient(env.client.app, follow_redirects=False)
    nonce = client.get("/login").cookies.get(LOGIN_NONCE_COOKIE) or ""
    client.cookies.clear()
    r = client.post(
        "/login",
        data={"csrf": nonce, "token": env.tokens["ana"], "next": "/"},
        headers={"cookie": f"{LOGIN_NONCE_COOKIE}={nonce}"},
    )
    assert r.status_code == 303
    me = client.get(f"{API}/me").json()
    assert me["name"] == "ana" and me["csrf_token"]
    incident = PENDING["cookie"]
    path = f"{API}/incidents/{incident}/approve"
    r = client.post(path, json={"reason": "ok"})
    assert r.status_code == 403 and "CSRF" in r.json()["error"]
    r = client.post(path, json={"reason": "ok"}, headers={"x-csrf-token": "0" * 64})
    assert r.status_code == 403
    assert env.rows(incident, "approval") == 0
    r = client.post(path, json={"reason": "ok"}, headers={"x-csrf-token": me["csrf_token"]})
    assert r.status_code == 200, r.text
    assert env.rows(incident, "approval") == 1
    assert env.get("ana", "/me").json()["csrf_token"] is None  # a Bearer token needs none


# ------------------------------------------------------------------ deciding


def test_an_approver_approves_through_the_console_s_decider(env: Env) -> None:
    incident = PENDING["approve"]
    r = env.post("ana", f"/incidents/{incident}/approve", json={"reason": "Xid 79, drain it"})
    assert r.status_code == 200, r.text
    conforms(env, "POST", "/incidents/{incident_id}/approve", r)
    assert r.json() == {
        "incident_id": incident,
        "cluster": "a",
        "request_id": _request(incident),
        "decision": "approve",
        "by": "ana",
        "reason": "Xid 79, drain it",
    }
    calls = [c for c in env.temporal["a"].calls if c[0] == incident]
    assert [(d, a.by, a.reason) for _, d, a in calls] == [("approve", "ana", "Xid 79, drain it")]
    detail = env.get("vic", f"/incidents/{incident}").json()
    assert detail["awaiting_approval"] is False and detail["request_id"] is None
    assert [(d["decision"], d["by"]) for d in detail["decisions"]] == [("approve", "ana")]
    # Nothing waits any more: a second approval without a request id or key is a 409.
    r = env.post("root", f"/incidents/{incident}/approve", json={})
    assert r.status_code == 409 and "nothing waits" in r.json()["error"]


def test_an_approve_retried_with_one_idempotency_key_is_taken_once(env: Env) -> None:
    incident = PENDING["retry"]
    key = {"idempotency-key": "6f1c2a9e-retry-1"}
    answers = [
        env.post("ana", f"/incidents/{incident}/approve", headers=key, json={"reason": "go"})
        for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert answers[0].json() == answers[1].json() == answers[2].json()
    assert answers[0].json()["request_id"] == _request(incident)
    assert "idempotent-replayed" not in answers[0].headers
    assert [a.headers.get("idempotent-replayed") for a in answers[1:]] == ["true", "true"]
    assert len([c for c in env.temporal["a"].calls if c[0] == incident]) == 1
    assert env.rows(incident, "approval") == 1
    assert env.rows(incident, "decision_request") == 1
    # The same key with another request is refused; another person's approval is a 409.
    r = env.post("ana", f"/incidents/{incident}/reject", headers=key, json={"reason": "go"})
    assert r.status_code == 422 and r.json()["field"] == "Idempotency-Key"
    body = {"request_id": _request(incident)}
    r = env.post("root", f"/incidents/{incident}/approve", json=body)
    assert r.status_code == 409 and "already approved by ana" in r.json()["error"]
    r = env.post("ana", f"/incidents/{incident}/reject", json=body)
    assert r.status_code == 409 and "already approved by ana" in r.json()["error"]
    assert len([c for c in env.temporal["a"].calls if c[0] == incident]) == 1


def test_a_retry_naming_the_request_is_answered_as_the_first(env: Env) -> None:
    incident = PENDING["by_request"]
    body = {"reason": "bad link", "request_id": _request(incident)}
    first = env.post("ana", f"/incidents/{incident}/reject", json=body)
    again = env.post("ana", f"/incidents/{incident}/reject", json=body)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() and first.json()["decision"] == "reject"
    assert env.rows(incident, "rejection") == 1
    assert len([c for c in env.temporal["a"].calls if c[0] == incident]) == 1


def test_a_retry_that_crosses_the_first_call_gets_its_answer(env: Env) -> None:
    """The decision taken, its row not yet written: the workflow refuses the retry, and the
    retry is answered from the row once it is there."""
    incident = PENDING["crossing"]
    temporal = env.temporal["a"]
    temporal.row_delay_s = 0.5
    try:
        key = {"idempotency-key": "crossing-1"}
        first = env.post("ana", f"/incidents/{incident}/approve", headers=key, json={})
        second = env.post("ana", f"/incidents/{incident}/approve", headers=key, json={})
    finally:
        temporal.row_delay_s = 0.0
    assert first.status_code == second.status_code == 200, second.text
    assert first.json() == second.json()
    assert second.headers.get("idempotent-replayed") == "true"
    # Sent twice (the second refused, as the validator refuses it), taken once.
    assert len([c for c in temporal.calls if c[0] == incident]) == 2
    assert env.rows(incident, "approval") == 1


def test_a_node_lifecycle_s_step_is_decided_the_same_way(env: Env) -> None:
    detail = env.get("vic", f"/incidents/{LIFECYCLE_WAITING}").json()
    assert detail["kind"] == "lifecycle" and detail["pending"]["step"] == "reboot"
    body = {"reason": "reboot it", "request_id": detail["request_id"]}
    key = {"idempotency-key": "lifecycle-1"}
    first = env.post("ana", f"/incidents/{LIFECYCLE_WAITING}/approve", headers=key, json=body)
    again = env.post("ana", f"/incidents/{LIFECYCLE_WAITING}/approve", headers=key, json=body)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert first.json()["request_id"] == f"{LIFECYCLE_WAITING}/1:reboot"
    assert len([c for c in env.temporal["a"].calls if c[0] == LIFECYCLE_WAITING]) == 1


def test_a_stale_or_foreign_request_is_a_409(env: Env) -> None:
    incident = PENDING["conflict"]
    r = env.post(
        "ana", f"/incidents/{incident}/approve", json={"request_id": "relaunch-a-1-0/plan"}
    )
    assert r.status_code == 409 and "not waiting" in r.json()["error"]
    r = env.post("ana", f"/incidents/{DONE_A[0]}/approve", json={})
    assert r.status_code == 409
    assert not any(c[0] in (incident, DONE_A[0]) for c in env.temporal["a"].calls)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "x" * 501}, "reason"),
        ({"reason": "ok", "approved": True}, "approved"),
        ({"request_id": ""}, "request_id"),
    ],
)
def test_a_bad_decision_body_is_a_400(env: Env, body: dict[str, Any], field: str) -> None:
    incident = PENDING["key_reuse"]
    r = env.post("ana", f"/incidents/{incident}/approve", json=body)
    assert r.status_code == 400 and r.json()["field"] == field
    r = env.post("ana", f"/incidents/{incident}/approve", content=b"{not json")
    assert r.status_code == 400 and r.json()["field"] == "body"
    r = env.post("ana", f"/incidents/{incident}/approve", headers={"idempotency-key": "a b"})
    assert r.status_code == 400 and r.json()["field"] == "Idempotency-Key"
    assert env.rows(incident, "approval") == 0


def test_when_temporal_does_not_answer_the_call_is_a_503_and_a_retry_works(env: Env) -> None:
    incident = PENDING["down"]
    key = {"idempotency-key": "down-1"}
    env.temporal["a"].down = True
    try:
        r = env.post("ana", f"/incidents/{incident}/approve", headers=key, json={})
    finally:
        env.temporal["a"].down = False
    assert r.status_code == 503 and "Temporal" in r.json()["error"]
    r = env.post("ana", f"/incidents/{incident}/approve", headers=key, json={})
    assert r.status_code == 200 and "idempotent-replayed" not in r.headers
    assert env.rows(incident, "approval") == 1 and env.rows(incident, "decision_request") == 1


def test_a_refusal_nobody_answers_is_a_409_after_a_short_wait(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workflow refuses and no decision row comes: the workflow's reason, as a 409."""
    monkeypatch.setattr(decisions, "DECIDED_WAIT_S", 0.3)
    incident = PENDING["key_reuse"]
    env.temporal["a"].decided[incident] = "approve"  # decided by a signal that left no row
    try:
        r = env.post("ana", f"/incidents/{incident}/reject", json={})
    finally:
        del env.temporal["a"].decided[incident]
    assert r.status_code == 409 and "already decided" in r.json()["error"]


def test_when_the_database_does_not_answer_the_api_says_503(env: Env, tmp_path: Path) -> None:
    config = ClusterConfig(
        name="a",
        database_url="postgresql://relaunch:hunter2pw@127.0.0.1:1/audit",
        bundle_dir=str(tmp_path),
    )
    tokens = write_tokens(tmp_path / "tokens.json", [("vic", ConsoleRole.VIEWER)])
    app = create_app(config, Services(), tokens_file=tmp_path / "tokens.json", secret=SECRET)
    with TestClient(app) as client:
        r = client.get(f"{API}/incidents", headers={"authorization": f"Bearer {tokens['vic']}"})
    assert r.status_code == 503 and "hunter2pw" not in r.text
    assert set(r.json()) == {"error", "field"}


# ------------------------------------------------------------------ the document


def test_the_openapi_document_is_valid_and_lists_every_route(env: Env) -> None:
    validate(env.spec)
    assert env.spec["openapi"].startswith("3.1")
    mount = next(
        r
        for r in env.client.app.routes
        if isinstance(r, Mount) and r.path == API  # type: ignore[attr-defined]
    )
    served = {
        (API + route.path, method.lower())
        for route in mount.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(p, m) for p, ops in env.spec["paths"].items() for m in ops}
    assert served == documented
    approve = env.spec["paths"][f"{API}/incidents/{{incident_id}}/approve"]["post"]
    assert approve["x-relaunch-role"] == "approver"
    assert {p["name"] for p in approve["parameters"]} >= {"incident_id", "Idempotency-Key"}
    assert approve["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/DecisionBody"
    }
