"""The console's view of node lifecycles (docs/lifecycle.md): each node's stage, its checks with
their (escaped, collapsed) output and Approve / Reject for the step it waits for on the nodes
page, lifecycle ids on the incident page, and the repair system's callback `POST /intake/repair`.

The console reads a real PostgreSQL (an embedded one, started for this module) holding the rows
a NodeLifecycleWorkflow writes; Slurm and Temporal are recording stand-ins, one per cluster, so
that a test sees which cluster's connection a request used.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.lifecycles import pending_of
from relaunch.console.routes_auth import LOGIN_NONCE_COOKIE
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import (
    NoLifecycleError,
    NotAwaitingRepairError,
    RepairReturn,
    lifecycle_id,
)
from relaunch.models.recovery import Approval, AuditRecord
from relaunch.models.scheduler import Node, NodeFlag, NodeState
from tests.support.fake_scheduler import FakeScheduler
from tests.support.postgres import embedded_postgres

SECRET = "console-lifecycle-test-secret-0123456789"
# a-n3 waits for its reboot to be approved; a-n4 was returned; a-n5's reboot was approved and
# it is rebooting (no stage row since the approval); b's b-n3 waits for its return.
WAITING = lifecycle_id("a", "a-n3", 1)
RETURNED = lifecycle_id("a", "a-n4", 1)
DECIDED = lifecycle_id("a", "a-n5", 1)
B_WAITING = lifecycle_id("b", "b-n3", 1)
HOSTILE = "<script>alert('node')</script>\nXid 79: GPU has fallen off the bus"
USERS = [
    ("ana", ConsoleRole.APPROVER),  # a only
    ("vic", ConsoleRole.VIEWER),
    ("root", ConsoleRole.ADMIN),
    ("bea", ConsoleRole.APPROVER),  # b only
    ("fix", ConsoleRole.REPAIR),  # the repair system, every cluster
    ("fix-b", ConsoleRole.REPAIR),  # b only
]
SCOPES = {"ana": ["a"], "bea": ["b"], "fix-b": ["b"]}


@dataclass
class Recorder:
    """One cluster's Temporal connection: decisions and repair signals sent through it;
    ``waiting`` says which node's lifecycle takes a repair (else what signal_repaired says)."""

    decisions: list[tuple[str, str, Approval]] = field(default_factory=list)
    repairs: list[tuple[str, RepairReturn]] = field(default_factory=list)
    waiting: dict[str, str | RelaunchError] = field(default_factory=dict)

    async def decide(self, incident: str, decision: str, approval: Approval) -> object:
        self.decisions.append((incident, decision, approval))
        return None

    async def repaired(self, node: str, repair: RepairReturn) -> str:
        outcome = self.waiting.get(node)
        if isinstance(outcome, RelaunchError):
            raise outcome
        if outcome is None:
            raise NoLifecycleError(f"no lifecycle of {node} is waiting for a repair")
        self.repairs.append((node, repair))
        return outcome


@dataclass
class Env:
    client: TestClient
    tokens: dict[str, str]
    tokens_file: Path
    config: dict[str, ClusterConfig]
    temporal: dict[str, Recorder]

    def auth(self, user: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[user]}"}

    def get(self, user: str, url: str) -> Any:
        return self.client.get(url, headers=self.auth(user))

    def post(self, user: str, url: str, **kw: Any) -> Any:
        return self.client.post(url, headers=self.auth(user), **kw)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-console-lifecycle-") as url:
        yield url


def _row(lid: str, node: str, kind: str, at: datetime, summary: str, **kw: Any) -> AuditRecord:
    return AuditRecord(
        incident_id=lid, kind=kind, at=at, nodes=[node], summary=summary, actor="relaunch", **kw
    )


def _checks(purpose: str, node: str, gpu_ok: bool) -> dict[str, Any]:
    results = [
        {
            "id": "node-basics",
            "passed": True,
            "detail": "exit 0",
            "exit_code": 0,
            "output": "MemAvailable: 1000 kB",
            "seconds": 0.4,
        },
        {
            "id": "dev-gpu",
            "passed": gpu_ok,
            "detail": "exit 0" if gpu_ok else "exit 1",
            "exit_code": 0 if gpu_ok else 1,
            "output": "no GPU fault marked" if gpu_ok else HOSTILE,
            "seconds": 0.2,
        },
        {
            "id": "gpu-smi",
            "passed": False,
            "skipped": True,
            "detail": f"nvidia-smi is not installed on {node}",
        },
    ]
    return {"purpose": purpose, "results": results, "passed": gpu_ok, "state": "IDLE+DRAIN"}


async def _seed(url: str) -> None:
    store = await AuditStore.open(url)
    t = datetime.now(UTC) - timedelta(minutes=10)
    try:
        for lid, cluster, node, story in (
            (WAITING, "a", "a-n3", "waiting"),
            (RETURNED, "a", "a-n4", "returned"),
            (DECIDED, "a", "a-n5", "decided"),
            (B_WAITING, "b", "b-n3", "return"),
        ):
            await store.ensure_incident(lid, cluster, "", 1)
            step = "return" if story in {"returned", "return"} else "reboot"
            request = f"{lid}/1:{step}"
            rows = [
                _row(lid, node, "node_stage", t, f"{node}: lifecycle", stage="suspect"),
                _row(lid, node, "node_stage", t + timedelta(seconds=1), "out", stage="drained"),
                _row(
                    lid,
                    node,
                    "node_stage",
                    t + timedelta(seconds=2),
                    "checking",
                    stage="diagnosing",
                ),
                _row(
                    lid,
                    node,
                    "checks",
                    t + timedelta(seconds=3),
                    "diagnose: failed: 1 of 2 checks passed (dev-gpu: exit 1), 1 skipped",
                    data=_checks("diagnose", node, gpu_ok=False),
                ),
            ]
            if story in {"returned", "return"}:
                rows.append(
                    _row(
                        lid,
                        node,
                        "checks",
                        t + timedelta(seconds=4),
                        "validate after reboot: passed: 2 of 2 checks passed, 1 skipped",
                        data=_checks("validate after reboot", node, gpu_ok=True),
                    )
                )
            rows.append(
                _row(
                    lid,
                    node,
                    "node_stage",
                    t + timedelta(seconds=5),
                    f"awaiting approval: {step} {node}",
                    stage="remediating",
                )
            )
            rows.append(
                _row(
                    lid,
                    node,
                    "stage",
                    t + timedelta(seconds=6),
                    f"recommend {step} {node}: the checks say so",
                    stage="awaiting_approval",
                    data={"request_id": request, "step": step},
                )
            )
            if story in {"returned", "decided"}:
                rows.append(
                    _row(
                        lid,
                        node,
                        "approval",
                        t + timedelta(seconds=7),
                        f"{step} approved by ana",
                        data={"decision": "approve", "request_id": request, "step": step},
                    )
                )
            if story == "returned":
                rows.append(
                    _row(
                        lid, node, "node_stage", t + timedelta(seconds=8), "back", stage="returned"
                    )
                )
                rows.append(
                    _row(lid, node, "stage", t + timedelta(seconds=8), "back", stage="done")
                )
            if story == "decided":
                rows.append(
                    _row(
                        lid,
                        node,
                        "node_stage",
                        t + timedelta(seconds=8),
                        f"reboot {node}",
                        stage="remediating",
                    )
                )
            for row in rows:
                await store.record(row)
    finally:
        await store.close()


def _sched(name: str) -> FakeScheduler:
    drained = [NodeFlag.DRAIN]
    nodes = [
        Node(name=f"{name}-n3", state=NodeState.IDLE, flags=drained, reason="relaunch: checks"),
        Node(name=f"{name}-n4", state=NodeState.IDLE),
        Node(name=f"{name}-n5", state=NodeState.IDLE, flags=drained, reason="relaunch: reboot"),
    ]
    return FakeScheduler(nodes=nodes)


@pytest.fixture(scope="module")
def env(pg_url: str) -> Iterator[Env]:
    asyncio.run(_seed(pg_url))
    tmp = Path(tempfile.mkdtemp(prefix="relaunch-console-lifecycle-cfg-"))
    tokens = write_tokens(tmp / "tokens.json", USERS, SCOPES)
    config = {
        name: ClusterConfig(name=name, database_url=pg_url, bundle_dir=str(tmp / name))
        for name in ("a", "b")
    }
    temporal = {name: Recorder() for name in config}

    def services(name: str) -> Services:
        t = temporal[name]
        return Services(decide=t.decide, scheduler=_sched(name), repaired=t.repaired)

    app = create_app(
        config["a"],
        services("a"),
        tokens_file=tmp / "tokens.json",
        secret=SECRET,
        other_clusters=[(config["b"], services("b"))],
    )
    with TestClient(app, follow_redirects=False) as client:
        yield Env(client, tokens, tmp / "tokens.json", config, temporal)
    shutil.rmtree(tmp, ignore_errors=True)


def _lifecycle_row(html: str, node: str) -> str:
    """The lifecycle row under ``node``'s row on the nodes page (up to the next node's row)."""
    start = html.find(f'<tr class="lifecycle" data-test="lifecycle" data-node="{node}"')
    assert start >= 0, f"no lifecycle row for {node}"
    end = html.find('<tr data-test="node-row"', start)
    return html[start : end if end >= 0 else len(html)]


# ------------------------------------------------------------------ what is pending


def _event(i: int, kind: str, stage: str | None = None, **data: Any) -> StoredEvent:
    return StoredEvent(
        id=i, incident_id="x", kind=kind, at=datetime.now(UTC), stage=stage, data=data
    )


def test_a_step_is_pending_until_a_decision_answers_it() -> None:
    asked = _event(5, "stage", "awaiting_approval", request_id="x/1:reboot", step="reboot")
    pending = pending_of([asked], 60)
    assert pending is not None and (pending.step, pending.request_id) == ("reboot", "x/1:reboot")
    assert pending.expires_at == asked.at + timedelta(seconds=60)
    # Decided (the lifecycle writes no stage row until its next step): no longer pending.
    assert pending_of([asked, _event(6, "approval", request_id="x/1:reboot")], 60) is None
    assert pending_of([asked, _event(6, "rejection")], 60) is None
    # The decision of an earlier request does not answer this one.
    earlier = _event(4, "approval", request_id="x/0:gpu_reset")
    assert pending_of([earlier, asked], 60) is not None
    # A later stage (done, held) ends the wait too.
    assert pending_of([asked, _event(7, "stage", "held")], 60) is None


# ------------------------------------------------------------------ the nodes page


def test_the_nodes_page_shows_each_node_s_lifecycle_and_its_checks(env: Env) -> None:
    page = env.get("vic", "/nodes")
    assert page.status_code == 200, page.text
    html = page.text
    assert re.search(
        r'data-node="a-n3">.*?data-test="lifecycle-stage" data-stage="remediating"', html, re.S
    )
    row = _lifecycle_row(html, "a-n3")
    assert f'href="/incidents/{WAITING}"' in row
    assert 'data-test="lifecycle-pending" data-step="reboot"' in row
    assert "Checks <b>diagnose</b>" in row and 'data-test="checks-outcome">failed<' in row
    # Each check with its result; the output collapsed, and escaped: text a node printed.
    assert 'data-check="dev-gpu" data-result="failed"' in row
    assert 'data-check="gpu-smi" data-result="skipped"' in row
    assert "nvidia-smi is not installed on a-n3" in row
    assert '<details data-test="check-output-toggle"><summary>' in row
    assert "&lt;script&gt;alert(&#39;node&#39;)&lt;/script&gt;" in row
    assert "<script>alert" not in html
    assert "Xid 79: GPU has fallen off the bus" in row
    # A lifecycle in progress shows its checks open; a returned one keeps them folded.
    assert 'data-test="lifecycle-checks" open' in row
    done = _lifecycle_row(html, "a-n4")
    assert 'data-stage="returned"' in done and 'data-test="lifecycle-checks" open' not in done
    assert "Checks <b>validate after reboot</b>" in done  # the latest run
    # Other clusters' lifecycles stay on their own page.
    assert "b-n3" not in html
    assert 'data-node="b-n3"' in env.get("root", "/nodes?cluster=b").text


def test_approve_and_reject_are_there_only_for_those_who_may_decide(env: Env) -> None:
    viewer = _lifecycle_row(env.get("vic", "/nodes").text, "a-n3")
    assert 'data-test="lifecycle-approve"' not in viewer
    assert 'data-test="lifecycle-reject"' not in viewer
    assert 'data-test="lifecycle-readonly"' in viewer
    for user in ("ana", "root"):
        html = env.get(user, "/nodes").text
        row = _lifecycle_row(html, "a-n3")
        assert 'data-test="lifecycle-approve"' in row and 'data-test="lifecycle-reject"' in row
        assert f'name="lifecycle" value="{WAITING}"' in row
        assert f'name="request_id" value="{WAITING}/1:reboot"' in row
        assert 'action="/nodes/a-n3/lifecycle/approve"' in row
        # Returned, or decided and on its way: nothing to decide.
        for node in ("a-n4", "a-n5"):
            assert 'data-test="lifecycle-approve"' not in _lifecycle_row(html, node)
        assert 'data-test="resume"' not in row or user == "root"  # Resume stays the admin's


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found
    return found[1]


def _signed_in(env: Env, user: str) -> TestClient:
    """A cookie session of ``user`` (the browser's way: its form POSTs need the CSRF token), on
    the running app (no second lifespan)."""
    client = TestClient(env.client.app, follow_redirects=False)
    nonce = client.get("/login").cookies.get(LOGIN_NONCE_COOKIE) or ""
    client.cookies.clear()
    r = client.post(
        "/login",
        data={"csrf": nonce, "token": env.tokens[user], "next": "/"},
        headers={"cookie": f"{LOGIN_NONCE_COOKIE}={nonce}"},
    )
    assert r.status_code == 303, r.text
    return client


def test_a_decision_from_the_nodes_page_follows_the_incident_page_s_rules(env: Env) -> None:
    a, b = env.temporal["a"].decisions, env.temporal["b"].decisions
    form = {"lifecycle": WAITING, "request_id": f"{WAITING}/1:reboot", "reason": "go"}
    # A viewer may not decide.
    assert env.post("vic", "/nodes/a-n3/lifecycle/approve", data=form).status_code == 403
    # A cookie session without its CSRF token is refused; with it, the decision goes through.
    ana = _signed_in(env, "ana")
    html = ana.get("/nodes").text
    assert ana.post("/nodes/a-n3/lifecycle/approve", data=form).status_code == 403
    forged = {**form, "csrf": "0" * 64}
    assert ana.post("/nodes/a-n3/lifecycle/approve", data=forged).status_code == 403
    assert a == [] and b == []
    r = ana.post("/nodes/a-n3/lifecycle/approve", data={**form, "csrf": _csrf(html)})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/nodes?cluster=a"
    assert [(i, d, x.by, x.reason) for i, d, x in a] == [(WAITING, "approve", "ana", "go")]
    # A stale page: the request it names no longer waits (a-n5's was decided): 409, nothing sent.
    stale = {"lifecycle": DECIDED, "request_id": f"{DECIDED}/1:reboot"}
    r = env.post("root", "/nodes/a-n5/lifecycle/reject", data=stale)
    assert r.status_code == 409 and "no longer waiting" in r.json()["detail"]
    # The lifecycle must be the node's, and the form must say which request it decides.
    r = env.post("root", "/nodes/a-n4/lifecycle/approve", data=form)
    assert r.status_code == 400
    r = env.post("root", "/nodes/a-n3/lifecycle/approve", data={"lifecycle": WAITING})
    assert r.status_code == 400
    assert env.post("root", "/nodes/a-n3/lifecycle/maybe", data=form).status_code == 404
    assert len(a) == 1 and b == []
    # Another cluster's lifecycle: refused outside the token's scope; else through its own
    # cluster's Temporal connection.
    other = {"lifecycle": B_WAITING, "request_id": f"{B_WAITING}/1:return"}
    assert env.post("ana", "/nodes/b-n3/lifecycle/approve", data=other).status_code == 403
    r = env.post("bea", "/nodes/b-n3/lifecycle/reject", data=other)
    assert r.status_code == 303 and r.headers["location"] == "/nodes?cluster=b"
    assert [(i, d, x.by) for i, d, x in b] == [(B_WAITING, "reject", "bea")]
    assert len(a) == 1


# ------------------------------------------------------------------ the incident page


def test_a_lifecycle_s_incident_page_shows_its_node_stages_checks_and_step(env: Env) -> None:
    page = env.get("ana", f"/incidents/{WAITING}")
    assert page.status_code == 200, page.text
    html = page.text
    assert 'data-test="lifecycle-node">a-n3<' in html
    assert 'data-test="job-link"' not in html  # a lifecycle has no job
    assert 'data-test="verdict"' not in html and 'data-test="evidence"' not in html
    assert 'data-stage="diagnosing"' in html and 'data-stage="remediating"' in html
    assert 'data-test="lifecycle-step">reboot<' in html
    assert f'name="request_id" value="{WAITING}/1:reboot"' in html
    assert 'data-test="approve"' in html
    assert "&lt;script&gt;" in html and "<script>alert" not in html
    assert 'data-test="check-run"' in html
    fragment = env.get("ana", f"/fragments/incident/{WAITING}").text
    assert 'data-test="lifecycle-checks"' in fragment and 'data-test="approve"' in fragment
    # Decided and rebooting: no buttons, though its latest stage row still asks.
    decided = env.get("root", f"/incidents/{DECIDED}").text
    assert 'data-test="approve"' not in decided and 'data-test="decision-row"' in decided
    assert env.get("ana", f"/incidents/{B_WAITING}").status_code == 403
    # The incident page's own form, with the request it names, decides the same way.
    sent = list(env.temporal["a"].decisions)
    form = {"request_id": f"{DECIDED}/1:reboot"}
    assert env.post("root", f"/incidents/{DECIDED}/approve", data=form).status_code == 409
    assert env.temporal["a"].decisions == sent


def test_the_overview_and_metrics_count_only_lifecycles_still_waiting(env: Env) -> None:
    overview = env.get("root", "/").text
    pending = set(re.findall(r'data-test="pending-row" data-incident="([^"]+)"', overview))
    assert pending == {WAITING, B_WAITING}
    # A lifecycle has no job and no plan: its row says what it recommends.
    row = overview[overview.index(f'data-incident="{WAITING}"') :].split("</tr>")[0]
    assert "recommend reboot a-n3" in row and 'data-test="job-link"' not in row
    metrics = env.get("root", "/metrics").text
    counts = dict(
        re.findall(r'^relaunch_approvals_pending\{cluster="(\w+)"\} (\S+)$', metrics, re.M)
    )
    assert counts == {"a": "1.0", "b": "1.0"}


# ------------------------------------------------------------------ POST /intake/repair


def test_the_repair_callback_signals_the_lifecycle_waiting_for_the_node(env: Env) -> None:
    a = env.temporal["a"]
    a.waiting["a-n5"] = lifecycle_id("a", "a-n5", 1)
    body = {"node": "a-n5", "by": "tech", "ticket": "REP-7", "note": "GPU 3 replaced\nall good"}
    r = env.post("fix", "/intake/repair", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["lifecycle"] == lifecycle_id("a", "a-n5", 1)
    assert r.json()["cluster"] == "a" and r.json()["node"] == "a-n5"
    node, told = a.repairs[-1]
    assert (node, told.by, told.ticket, told.note) == ("a-n5", "tech", "REP-7", body["note"])
    rows = env.get("root", "/audit.json?incident=intake-a&kind=intake").json()["rows"]
    row = next(r for r in rows if r["data"].get("source") == "repair")
    assert row["data"]["sender"] == "fix" and row["nodes"] == ["a-n5"]
    # Addressed to b: b's connection only.
    env.temporal["b"].waiting["b-n3"] = B_WAITING
    r = env.post("fix-b", "/intake/repair", json={"node": "b-n3", "by": "tech", "cluster": "b"})
    assert r.status_code == 202 and r.json()["lifecycle"] == B_WAITING
    assert [n for n, _ in env.temporal["b"].repairs] == ["b-n3"]
    assert len(a.repairs) == 1


def test_the_repair_callback_says_when_nothing_waits_for_the_node(env: Env) -> None:
    a = env.temporal["a"]
    r = env.post("fix", "/intake/repair", json={"node": "a-n9", "by": "tech"})
    assert r.status_code == 404 and "no lifecycle of a-n9" in r.json()["error"]
    a.waiting["a-n3"] = NotAwaitingRepairError(
        f"a-n3's lifecycle {WAITING} is remediating, not waiting for a repair"
    )
    r = env.post("fix", "/intake/repair", json={"node": "a-n3", "by": "tech"})
    assert r.status_code == 409 and "not waiting for a repair" in r.json()["error"]
    busy = RelaunchError("Temporal does not answer")
    busy.retryable = True
    a.waiting["a-n3"] = busy
    assert env.post("fix", "/intake/repair", json={"node": "a-n3", "by": "x"}).status_code == 503


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node": "a-n3;reboot", "by": "tech"}, "node"),
        ({"node": "", "by": "tech"}, "node"),
        ({"node": "a-n3"}, "by"),
        ({"node": "a-n3", "by": "  "}, "by"),
        ({"node": "a-n3", "by": 7}, "by"),
        ({"node": "a-n3", "by": "tech", "ticket": "T" * 65}, "ticket"),
        ({"node": "a-n3", "by": "tech\x1b[31m"}, "by"),
        ({"node": "a-n3", "by": "tech", "note": "n" * 501}, "note"),
        ({"node": "a-n3", "by": "tech", "force": True}, "force"),
        (["a-n3"], "body"),
    ],
)
def test_the_repair_callback_refuses_bad_input(env: Env, body: Any, field: str) -> None:
    sent = sum(len(t.repairs) for t in env.temporal.values())
    r = env.post("fix", "/intake/repair", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and r.json()["error"]
    assert sum(len(t.repairs) for t in env.temporal.values()) == sent


def test_the_repair_callback_is_for_intake_tokens_in_scope(env: Env) -> None:
    body = {"node": "a-n3", "by": "tech"}
    r = env.client.post("/intake/repair", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = env.client.post("/intake/repair", json=body, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401
    for person in ("vic", "ana", "root"):  # no person's role may post to the intake
        assert env.post(person, "/intake/repair", json=body).status_code == 403
    r = env.post("fix-b", "/intake/repair", json=body)  # a's node, a b-only token
    assert r.status_code == 403 and r.json()["field"] == "cluster"
    r = env.post("fix", "/intake/repair?cluster=c", json=body)
    assert r.status_code == 422  # not served here
    bad = env.client.post("/intake/repair", content=b"{not json", headers={**env.auth("fix")})
    assert bad.status_code == 400 and bad.json()["field"] == "body"


def test_without_temporal_the_repair_callback_asks_for_a_retry(env: Env, pg_url: str) -> None:
    app = create_app(env.config["a"], Services(), tokens_file=env.tokens_file, secret=SECRET)
    with TestClient(app) as client:
        r = client.post("/intake/repair", json={"node": "a-n3", "by": "t"}, headers=env.auth("fix"))
    assert r.status_code == 503
