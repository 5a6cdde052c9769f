"""One console over several clusters: tokens scoped to clusters, every page, list, export,
stream and action limited to the clusters a token sees, and each cluster's own scheduler and
Temporal delivery behind its nodes, decisions and intake.

The console reads a real PostgreSQL (an embedded one, started for this module); Slurm and
Temporal are the recording stand-ins below, one per cluster, so that a test sees which
cluster's connection a request used.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from relaunch.cli import cli
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.pause import set_paused
from relaunch.console.app import ClustersConfigError, create_app
from relaunch.console.auth import ConsoleRole, TokensFileError, TokenStore, hash_token, write_tokens
from relaunch.console.live import Broadcaster, stream
from relaunch.console.queries import ConsoleDb
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import DRAIN_REASON_PREFIX, Approval, AuditRecord, Detection
from relaunch.models.scheduler import Job, JobState, Node, NodeFlag, NodeState
from tests.support.fake_scheduler import FakeScheduler
from tests.support.postgres import embedded_postgres

SECRET = "console-clusters-test-secret-0123456789"
A_PENDING = "relaunch-a-101-0"
B_PENDING = "relaunch-b-202-0"
# An id that reads as cluster a's, whose audit trail row says cluster b: the row decides.
B_BY_ROW = "relaunch-a-303-0"
USERS = [
    ("ana", ConsoleRole.APPROVER),  # a only
    ("vic", ConsoleRole.VIEWER),  # a only
    ("root", ConsoleRole.ADMIN),  # every cluster
    ("bea", ConsoleRole.ADMIN),  # b only
    ("am-a", ConsoleRole.INTAKE),  # a only
    ("am", ConsoleRole.INTAKE),  # every cluster
]
SCOPES = {"ana": ["a"], "vic": ["a"], "bea": ["b"], "am-a": ["a"]}


@dataclass
class Recorder:
    """One cluster's Temporal connection: the decisions and deliveries sent through it."""

    decisions: list[tuple[str, str, Approval]] = field(default_factory=list)
    deliveries: list[Detection] = field(default_factory=list)

    async def decide(self, incident: str, decision: str, approval: Approval) -> object:
        self.decisions.append((incident, decision, approval))
        return None

    async def deliver(self, det: Detection) -> bool:
        self.deliveries.append(det)
        return True


@dataclass
class Clusters:
    client: TestClient
    tokens: dict[str, str]
    tokens_file: Path
    config: dict[str, ClusterConfig]
    sched: dict[str, FakeScheduler]
    temporal: dict[str, Recorder]

    def auth(self, user: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[user]}"}

    def get(self, user: str, url: str) -> Any:
        return self.client.get(url, headers=self.auth(user))


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-console-clusters-") as url:
        yield url


async def _seed(url: str) -> None:
    store = await AuditStore.open(url)
    t = datetime.now(UTC) - timedelta(minutes=5)
    try:
        for incident, cluster, job, node in (
            (A_PENDING, "a", "101", "a-n1"),
            (B_PENDING, "b", "202", "b-n1"),
            (B_BY_ROW, "b", "303", "b-n2"),
        ):
            await store.ensure_incident(incident, cluster, job, 0)
            rows = [
                AuditRecord(
                    incident_id=incident,
                    kind="detection",
                    at=t,
                    nodes=[node],
                    summary=f"signature:xid_79 on {node}",
                    data={"source": "job_log", "detection_latency_s": 0.25},
                ),
                AuditRecord(
                    incident_id=incident,
                    kind="verdict",
                    at=t + timedelta(seconds=1),
                    nodes=[node],
                    summary=f"gpu_hardware on {node}",
                    data={"category": "gpu_hardware", "culprit_nodes": [node], "confidence": 0.9},
                ),
                AuditRecord(
                    incident_id=incident,
                    kind="plan",
                    at=t + timedelta(seconds=2),
                    nodes=[node],
                    summary=f"isolate_and_restart (monitor), drain {node}",
                    data={"action": "isolate_and_restart", "mode": "monitor"},
                ),
                AuditRecord(
                    incident_id=incident,
                    kind="stage",
                    stage="awaiting_approval",
                    at=t + timedelta(seconds=3),
                    summary="recommend isolate_and_restart",
                ),
            ]
            for row in rows:
                await store.record(row)
        # b-n1 drained by Relaunch for b's incident (what Resume may undo).
        await store.record(
            AuditRecord(
                incident_id=B_PENDING,
                kind="action",
                at=t + timedelta(seconds=4),
                nodes=["b-n1"],
                summary="drain b-n1: done",
                data={"step": "drain", "changed": True},
            )
        )
    finally:
        await store.close()


def _config(name: str, url: str, tmp: Path, **extra: Any) -> ClusterConfig:
    return ClusterConfig(name=name, database_url=url, bundle_dir=str(tmp / name), **extra)


def _cluster_sched(name: str) -> FakeScheduler:
    drained = Node(
        name=f"{name}-n1",
        state=NodeState.IDLE,
        flags=[NodeFlag.DRAIN],
        reason=f"{DRAIN_REASON_PREFIX}relaunch-{name}-x",
    )
    job = Job(
        job_id="9" if name == "a" else "8",
        state=JobState.RUNNING,
        nodes=[f"{name}-n2"],
        comment="relaunch=on",
    )
    return FakeScheduler(nodes=[drained, Node(name=f"{name}-n2")], jobs=[job])


@pytest.fixture(scope="module")
def env(pg_url: str) -> Iterator[Clusters]:
    asyncio.run(_seed(pg_url))
    tmp = Path(tempfile.mkdtemp(prefix="relaunch-console-clusters-cfg-"))
    tokens = write_tokens(tmp / "tokens.json", USERS, SCOPES)
    config = {
        "a": _config("a", pg_url, tmp),
        "b": _config("b", pg_url, tmp),
    }
    sched = {name: _cluster_sched(name) for name in config}
    temporal = {name: Recorder() for name in config}

    def services(name: str) -> Services:
        t = temporal[name]
        return Services(decide=t.decide, scheduler=sched[name], deliver=t.deliver)

    app = create_app(
        config["a"],
        services("a"),
        tokens_file=tmp / "tokens.json",
        secret=SECRET,
        other_clusters=[(config["b"], services("b"))],
    )
    with TestClient(app, follow_redirects=False) as client:
        yield Clusters(client, tokens, tmp / "tokens.json", config, sched, temporal)
    shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ the tokens file


def test_scoped_tokens_round_trip_through_the_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(
        path, [("ana", ConsoleRole.APPROVER), ("root", ConsoleRole.ADMIN)], {"ana": ["a", "b"]}
    )
    lines = {e["name"]: e for e in json.loads(path.read_text())}
    assert lines["ana"]["clusters"] == ["a", "b"]
    assert "clusters" not in lines["root"]  # unscoped: the line as before scopes existed
    store = TokenStore(path)
    ana, root = store.authenticate(tokens["ana"]), store.authenticate(tokens["root"])
    assert ana is not None and ana.clusters == ["a", "b"]
    assert ana.sees("a") and ana.sees("b") and not ana.sees("c")
    assert root is not None and root.clusters is None and root.sees("anything")
    # A session's user keeps the scope the file gives it now.
    assert (by_hash := store.by_hash("ana", ana.sha256)) is not None
    assert by_hash.clusters == ["a", "b"]


def test_a_tokens_file_without_scopes_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps([{"name": "vic", "role": "viewer", "sha256": hash_token("t0")}]))
    user = TokenStore(path).authenticate("t0")
    assert user is not None and user.clusters is None and user.sees("dev")


@pytest.mark.parametrize(
    ("clusters", "error"),
    [([], "at least one cluster"), (["a b"], "invalid cluster name"), (["-x"], "invalid")],
)
def test_a_bad_scope_is_a_clear_tokens_file_error(
    tmp_path: Path, clusters: list[str], error: str
) -> None:
    path = tmp_path / "tokens.json"
    line = {"name": "vic", "role": "viewer", "sha256": hash_token("t0"), "clusters": clusters}
    path.write_text(json.dumps([line]))
    with pytest.raises(TokensFileError, match=error):
        TokenStore(path)
    with pytest.raises(ValueError, match=error):
        write_tokens(path, [("vic", ConsoleRole.VIEWER)], {"vic": clusters})


# ------------------------------------------------------------------ incidents and decisions


def test_an_approver_scoped_to_a_is_refused_b_s_incident_and_its_approval(env: Clusters) -> None:
    sent = [list(t.decisions) for t in env.temporal.values()]
    for incident in (B_PENDING, B_BY_ROW):
        for url in (f"/incidents/{incident}", f"/fragments/incident/{incident}"):
            r = env.get("ana", url)
            assert r.status_code == 403, url
            assert r.json()["detail"] == "your token is limited to cluster a"
        r = env.client.post(
            f"/incidents/{incident}/approve", data={"reason": "ok"}, headers=env.auth("ana")
        )
        assert r.status_code == 403
    assert [t.decisions for t in env.temporal.values()] == sent  # nothing sent anywhere
    page = env.get("ana", f"/incidents/{A_PENDING}")
    assert page.status_code == 200
    assert 'data-test="incident-cluster">a<' in page.text
    assert env.get("ana", f"/fragments/incident/{A_PENDING}").status_code == 200


def test_decisions_go_through_the_incident_s_own_cluster(env: Clusters) -> None:
    a, b = env.temporal["a"].decisions, env.temporal["b"].decisions
    before_a, before_b = len(a), len(b)
    r = env.client.post(
        f"/incidents/{A_PENDING}/approve", data={"reason": "a"}, headers=env.auth("ana")
    )
    assert r.status_code == 303
    r = env.client.post(f"/incidents/{B_BY_ROW}/reject", data={}, headers=env.auth("root"))
    assert r.status_code == 303
    assert [(i, d, x.by) for i, d, x in a[before_a:]] == [(A_PENDING, "approve", "ana")]
    assert [(i, d, x.by) for i, d, x in b[before_b:]] == [(B_BY_ROW, "reject", "root")]


# ------------------------------------------------------------------ lists


def _incidents(html: str) -> set[str]:
    found = set()
    for incident in (A_PENDING, B_PENDING, B_BY_ROW):
        if f'data-incident="{incident}"' in html:
            found.add(incident)
    return found


def test_a_viewer_scoped_to_a_sees_only_a_in_lists_and_exports(env: Clusters) -> None:
    overview = env.get("vic", "/").text
    assert _incidents(overview) == {A_PENDING}
    assert overview.count('data-test="cluster-row"') == 1  # the clusters table: a alone
    assert 'data-test="kpi-incidents"><b>1</b>' in overview  # the KPIs count a's alone
    assert _incidents(env.get("vic", "/fragments/incidents").text) == {A_PENDING}
    rows = env.get("vic", "/audit.json").json()["rows"]
    assert rows and {r["incident_id"] for r in rows} <= {A_PENDING, "intake-a"}
    csv = env.get("vic", "/audit.csv").text
    assert A_PENDING in csv and B_PENDING not in csv and B_BY_ROW not in csv
    jobs = env.get("vic", "/jobs").text
    assert 'data-job="101"' in jobs and 'data-job="202"' not in jobs
    # Naming b outright is refused, not answered empty.
    for url in ("/?cluster=b", "/audit.json?cluster=b", "/jobs/202?cluster=b", "/nodes?cluster=b"):
        assert env.get("vic", url).status_code == 403, url


def test_an_unscoped_admin_sees_every_cluster_and_may_filter(env: Clusters) -> None:
    overview = env.get("root", "/").text
    assert _incidents(overview) == {A_PENDING, B_PENDING, B_BY_ROW}
    assert 'data-test="cluster-nav"' in overview  # several clusters: the filter in the header
    assert 'data-test="kpi-incidents"><b>3</b>' in overview
    ids = {r["incident_id"] for r in env.get("root", "/audit.json").json()["rows"]}
    assert {A_PENDING, B_PENDING, B_BY_ROW} <= ids
    assert _incidents(env.get("root", "/?cluster=b").text) == {B_PENDING, B_BY_ROW}
    assert _incidents(env.get("root", "/fragments/incidents?cluster=b").text) == {
        B_PENDING,
        B_BY_ROW,
    }
    ids = {r["incident_id"] for r in env.get("root", "/audit.json?cluster=b").json()["rows"]}
    assert ids and ids <= {B_PENDING, B_BY_ROW, "intake-b"}


def test_metrics_count_only_the_token_s_clusters(env: Clusters) -> None:
    def pending(user: str) -> float:
        text = env.get(user, "/metrics").text
        return {
            cluster: float(value)
            for cluster, value in re.findall(
                r'^relaunch_approvals_pending\{cluster="([a-z]+)"\} (\S+)$', text, re.M
            )
        }

    assert pending("vic") == {"a": 1.0}  # a's one incident awaiting approval
    assert pending("root") == {"a": 1.0, "b": 2.0}


async def test_the_live_stream_sends_each_viewer_only_their_clusters_rows(
    env: Clusters, pg_url: str
) -> None:
    db = ConsoleDb(pg_url)
    await db.start()
    try:
        rows = await db.events_after(0)
    finally:
        await db.close()
    assert {r["cluster"] for r in rows} >= {"a", "b"}
    vic = TokenStore(env.tokens_file).authenticate(env.tokens["vic"])
    assert vic is not None
    broadcaster = Broadcaster(ConsoleDb(pg_url))
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for row in sorted(rows, key=lambda r: r["cluster"] == "a"):  # b's rows first
        queue.put_nowait(row)
    body = cast(AsyncGenerator[str, None], stream(broadcaster, queue, vic.sees))
    assert (await anext(body)).startswith("retry:")
    sent = [await anext(body) for _ in [r for r in rows if r["cluster"] == "a"]]
    await body.aclose()
    assert sent and all(A_PENDING in s or "intake-a" in s for s in sent)
    assert all(B_PENDING not in s and B_BY_ROW not in s for s in sent)


# ------------------------------------------------------------------ nodes


def test_the_nodes_page_reads_the_asked_cluster_s_scheduler(env: Clusters) -> None:
    before_a = len(env.sched["a"].calls_to("list_nodes"))
    before_b = len(env.sched["b"].calls_to("list_nodes"))
    page = env.get("root", "/nodes?cluster=b").text
    assert 'data-node="b-n1"' in page and 'data-node="a-n1"' not in page
    assert len(env.sched["b"].calls_to("list_nodes")) == before_b + 1
    assert len(env.sched["a"].calls_to("list_nodes")) == before_a
    assert 'data-node="a-n1"' in env.get("root", "/nodes").text  # default: the primary
    # Scoped to b: b is the first cluster it sees, and a is not its to see.
    assert 'data-node="b-n1"' in env.get("bea", "/nodes").text
    assert env.get("bea", "/nodes?cluster=a").status_code == 403
    assert env.get("root", "/nodes?cluster=c").status_code == 404  # not served here


def test_resume_acts_through_the_node_s_cluster_and_only_in_scope(env: Clusters) -> None:
    r = env.client.post("/nodes/a-n1/resume", data={"cluster": "a"}, headers=env.auth("bea"))
    assert r.status_code == 403
    assert env.sched["a"].resumes == []
    r = env.client.post("/nodes/b-n1/resume", data={"cluster": "b"}, headers=env.auth("bea"))
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/nodes?cluster=b"
    assert env.sched["b"].resumes == ["b-n1"] and env.sched["a"].resumes == []
    rows = env.get("root", "/audit.json?cluster=b&action=resume").json()["rows"]
    assert [(r["incident_id"], r["actor"]) for r in rows] == [(B_PENDING, "bea")]


def test_resume_is_refused_while_the_cluster_is_paused(env: Clusters, pg_url: str) -> None:
    async def pause(paused: bool) -> None:
        store = await AuditStore.open(pg_url)
        try:
            await set_paused(store, "b", paused, by="ops", reason="rack 7 maintenance")
        finally:
            await store.close()

    sched = env.sched["b"]
    sched.resumes.clear()
    looked = len(sched.calls_to("get_node"))
    asyncio.run(pause(True))
    try:
        r = env.client.post("/nodes/b-n1/resume", data={"cluster": "b"}, headers=env.auth("root"))
        assert r.status_code == 409, r.text
        assert "paused" in r.text and "rack 7 maintenance" in r.text
        assert sched.resumes == [] and len(sched.calls_to("get_node")) == looked
    finally:
        asyncio.run(pause(False))
    # Unpaused: past the kill switch (to the node's own checks; an earlier test of this module's
    # console resumed it already).
    r = env.client.post("/nodes/b-n1/resume", data={"cluster": "b"}, headers=env.auth("root"))
    assert "paused" not in r.text and len(sched.calls_to("get_node")) == looked + 1, r.text


# ------------------------------------------------------------------ intake


def _node_down(node: str, **extra: object) -> dict[str, object]:
    return {"event": "node_down", "node": node, "time": datetime.now(UTC).isoformat(), **extra}


def test_intake_refuses_a_cluster_outside_the_token_s_scope(env: Clusters) -> None:
    r = env.client.post(
        "/intake/slurm?cluster=b", json=_node_down("b-n2"), headers=env.auth("am-a")
    )
    assert r.status_code == 403 and r.json()["field"] == "cluster"
    r = env.client.post(
        "/intake/slurm", json=_node_down("b-n2", cluster="b"), headers=env.auth("am-a")
    )
    assert r.status_code == 403
    r = env.client.post(
        "/intake/alertmanager?cluster=b",
        json={"version": "4", "status": "firing", "alerts": []},
        headers=env.auth("am-a"),
    )
    assert r.status_code == 403
    assert env.temporal["b"].deliveries == []
    rows = env.get("root", "/audit.json?incident=intake-b").json()["rows"]
    assert rows == []  # refused before anything was recorded


def test_intake_delivers_only_through_the_addressed_cluster(env: Clusters) -> None:
    # What an intake says of Slurm is delivered only where Slurm's own view bears it out.
    up = env.client.post("/intake/slurm", json=_node_down("a-n2"), headers=env.auth("am-a"))
    assert up.status_code == 200 and "not borne out" in up.json()["note"], up.text
    assert env.temporal["a"].deliveries == []
    for name in ("a", "b"):
        env.sched[name].set_node(
            f"{name}-n2", state=NodeState.DOWN, flags=[NodeFlag.NOT_RESPONDING]
        )
    try:
        _delivers_only_through_the_addressed_cluster(env)
    finally:
        for name in ("a", "b"):
            env.sched[name].set_node(f"{name}-n2", state=NodeState.UNKNOWN, flags=[])


def _delivers_only_through_the_addressed_cluster(env: Clusters) -> None:
    r = env.client.post("/intake/slurm", json=_node_down("a-n2"), headers=env.auth("am-a"))
    assert r.status_code == 200, r.text
    r = env.client.post("/intake/slurm?cluster=b", json=_node_down("b-n2"), headers=env.auth("am"))
    assert r.status_code == 200, r.text
    assert [(d.cluster, d.job_id, d.nodes) for d in env.temporal["a"].deliveries] == [
        ("a", "9", ["a-n2"])
    ]
    assert [(d.cluster, d.job_id, d.nodes) for d in env.temporal["b"].deliveries] == [
        ("b", "8", ["b-n2"])
    ]
    # A node named on the wrong cluster concerns none of its jobs: recorded, nothing delivered.
    r = env.client.post("/intake/slurm?cluster=b", json=_node_down("a-n2"), headers=env.auth("am"))
    assert r.status_code == 200 and not r.json().get("detections")
    assert len(env.temporal["b"].deliveries) == 1 and len(env.temporal["a"].deliveries) == 1
    bad = env.client.post(
        "/intake/slurm?cluster=a", json=_node_down("a-n2", cluster="b"), headers=env.auth("am")
    )
    assert bad.status_code == 422 and bad.json()["field"] == "cluster"
    unknown = env.client.post(
        "/intake/slurm?cluster=c", json=_node_down("a-n2"), headers=env.auth("am")
    )
    assert unknown.status_code == 422 and "does not serve cluster 'c'" in unknown.json()["error"]


# ------------------------------------------------------------------ one console, one cluster


def test_a_console_of_one_cluster_shows_the_trail_as_before(env: Clusters, pg_url: str) -> None:
    app = create_app(env.config["a"], Services(), tokens_file=env.tokens_file, secret=SECRET)
    with TestClient(app, follow_redirects=False) as client:
        html = client.get("/", headers=env.auth("root")).text
        assert _incidents(html) == {A_PENDING, B_PENDING, B_BY_ROW}
        assert 'data-test="cluster-nav"' not in html
        assert "<th>cluster</th><th>incident</th>" not in html
        assert client.get("/nodes?cluster=b", headers=env.auth("root")).status_code == 404
        # b's incident is shown, but a's configuration does not act on it.
        page = client.get(f"/incidents/{B_PENDING}", headers=env.auth("root")).text
        assert 'data-test="decision-elsewhere"' in page and 'data-test="approve"' not in page
        sent = list(env.temporal["b"].decisions)
        r = client.post(f"/incidents/{B_PENDING}/approve", data={}, headers=env.auth("root"))
        assert r.status_code == 409 and env.temporal["b"].decisions == sent


# ------------------------------------------------------------------ configuration


def test_clusters_that_do_not_share_a_control_plane_are_refused(tmp_path: Path) -> None:
    url = "postgresql://relaunch:s3cret@db/relaunch"
    a = _config("a", url, tmp_path)
    for other in (
        _config("b", "postgresql://relaunch:s3cret@elsewhere/relaunch", tmp_path),
        _config("b", url, tmp_path, temporal_address="temporal.elsewhere:7233"),
        _config("a", url, tmp_path),
    ):
        with pytest.raises(ClustersConfigError) as refused:
            create_app(
                a,
                Services(),
                tokens_file=tmp_path / "t.json",
                secret=SECRET,
                other_clusters=[(other, Services())],
            )
        assert "s3cret" not in str(refused.value)


def test_the_cli_refuses_a_cluster_config_on_another_database(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(_config("a", "postgresql://db/one", tmp_path).model_dump_json())
    b.write_text(_config("b", "postgresql://db/two", tmp_path).model_dump_json())
    result = CliRunner().invoke(cli, ["console", "--config", str(a), "--cluster-config", str(b)])
    assert result.exit_code != 0
    assert "cluster b has another database_url than cluster a" in result.output
