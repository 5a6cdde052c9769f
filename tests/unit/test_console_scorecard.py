"""The console's scorecard page (`/scorecard`), its one-click promotions and demotions
(`POST /scorecard/mode`) and its `/metrics` series, on a real audit trail (an embedded
PostgreSQL) holding the story of tests/support/scorecard_story.py for cluster a and a smaller
one for cluster b."""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from relaunch.connectors.audit import AuditStore
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.routes_auth import LOGIN_NONCE_COOKIE
from relaunch.console.web import Services
from relaunch.models.recovery import Mode
from relaunch.models.rollout import ScopeKind, rollout_incident
from relaunch.rollout.policy import change_mode
from tests.support.postgres import embedded_postgres
from tests.support.scorecard_story import (
    HOSTILE_CATEGORY,
    Story,
    scorecard_config,
    write_other_cluster,
    write_story,
)

SECRET = "console-scorecard-test-secret-0123456789"
USERS = [
    ("vic", ConsoleRole.VIEWER),
    ("va", ConsoleRole.VIEWER),  # a only
    ("ana", ConsoleRole.APPROVER),
    ("root", ConsoleRole.ADMIN),
    ("rootb", ConsoleRole.ADMIN),  # b only
]
SCOPES = {"va": ["a"], "rootb": ["b"]}


@dataclass
class Env:
    client: TestClient
    tokens: dict[str, str]
    story: Story
    b_drains: list[str]
    pg_url: str

    def get(self, user: str, url: str) -> Any:
        return self.client.get(url, headers={"authorization": f"Bearer {self.tokens[user]}"})

    def post(self, user: str, url: str, **kw: Any) -> Any:
        headers = {"authorization": f"Bearer {self.tokens[user]}"}
        return self.client.post(url, headers=headers, **kw)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with embedded_postgres("relaunch-console-scorecard-") as url:
        story = asyncio.run(write_story(url, "a"))
        b_drains = asyncio.run(write_other_cluster(url, "b"))
        tmp = Path(tempfile.mkdtemp(prefix="relaunch-console-scorecard-cfg-"))
        tokens = write_tokens(tmp / "tokens.json", USERS, SCOPES)
        a, b = (scorecard_config(n, url, str(tmp / n)) for n in ("a", "b"))
        app = create_app(
            a,
            Services(),
            tokens_file=tmp / "tokens.json",
            secret=SECRET,
            other_clusters=[(b, Services())],
        )
        with TestClient(app, follow_redirects=False) as client:
            yield Env(client, tokens, story, b_drains, url)
        shutil.rmtree(tmp, ignore_errors=True)


def _section(html: str, cluster: str) -> str:
    start = html.find(f'<section data-test="scorecard" data-cluster="{cluster}">')
    assert start >= 0, f"no scorecard of {cluster}"
    return html[start : html.index("</section>", start)]


def _scope_row(section: str, scope: str, name: str) -> str:
    start = section.find(f'data-test="scope-row" data-scope="{scope}" data-name="{name}"')
    assert start >= 0, f"no row of {scope} {name}"
    return section[start : section.index("</tr>", start)]


def _cells(row: str) -> dict[str, str]:
    """Each numeric cell of a row by its data-test, as its text (tags removed)."""
    cells = re.findall(r'data-test="([a-z-]+)">(.*?)</td>', row)
    return {key: re.sub(r"<[^>]+>", "", value).strip() for key, value in cells}


def test_the_page_shows_the_numbers_of_the_trail(env: Env) -> None:
    page = env.get("vic", "/scorecard")
    assert page.status_code == 200, page.text
    assert 'data-test="nav-scorecard" class="active"' in page.text
    a = _section(page.text, "a")
    assert 'data-test="recommended-total">13<' in a
    # Precision with its counts: drains 3 right, 1 wrong (a healthy node drained), 1 pending.
    assert 'data-test="precision-drain" data-right="3" data-wrong="1" data-pending="1"' in a
    drains = a[a.index('data-test="precision-drain"') :].split("</div>")[0]
    assert "<b>75%</b>" in drains and "drains: 3 right, 1 wrong, 1 pending" in drains
    assert 'data-test="precision-restart" data-right="1" data-wrong="1" data-pending="0"' in a
    assert 'data-test="precision-hold" data-right="1" data-wrong="0" data-pending="0"' in a
    assert 'data-test="approved-right-total"><b>3/7</b>' in a
    network = _cells(_scope_row(a, "category", "network"))
    assert network["recommended"] == "3" and network["approved"] == "3"
    assert network["approved-right"] == "3/3 (100%)" and network["drains"] == "3/3"
    gpu = _cells(_scope_row(a, "category", "gpu_hardware"))
    assert (gpu["approved"], gpu["rejected"], gpu["approved-right"]) == ("2", "1", "0/3 (0%)")
    assert gpu["drains"] == "0/1 +1 pending"
    assert 'data-mode="autonomous"' in _scope_row(a, "category", "hang")  # ops promoted it
    hang = _cells(_scope_row(a, "category", "hang"))
    assert (hang["autonomous"], hang["not-asked"], hang["restarts"]) == ("2", "1", "1/2")
    application = _cells(_scope_row(a, "category", "application"))
    assert application["acted-differently"] == "1"
    ib = _cells(_scope_row(a, "partition", "ib"))
    assert (ib["recommended"], ib["approved-right"]) == ("5", "3/5 (60%)")
    # Suggestions, with why and the incidents they rest on.
    suggestions = re.findall(r'data-test="suggestion" data-change="(\w+)" data-scope="(\w+)" '
                             r'data-name="(\w+)"', a)  # fmt: skip
    assert suggestions == [("promote", "category", "network"), ("demote", "category", "hang")]
    assert "3 of 3 decisions approved and right (100% ≥ 95%" in a
    for incident in (*env.story.network, env.story.hang_wrong):
        assert f'href="/incidents/{incident}"' in a
    # The recent recommendations, newest first, each with its response, outcome and why.
    recs = re.findall(
        r'data-test="recommendation" data-incident="([^"]+)" data-response="(\w+)" '
        r'data-outcome="(\w+)"',
        a,
    )
    assert len(recs) == 13 and recs[0] == (env.story.newest, "approved", "pending")
    assert (env.story.hang_wrong, "autonomous", "wrong") in recs
    assert "x1 drained by someone else" in a
    # The audited mode change: who, what, why.
    assert 'data-test="mode-change-by">ops<' in a and "20 of 20 hang restarts right" in a
    # Cluster b's own numbers in its own section.
    b = _section(page.text, "b")
    assert 'data-test="precision-drain" data-right="2" data-wrong="0" data-pending="0"' in b
    assert 'data-test="no-suggestion"' in b


def test_since_narrows_the_window(env: Env) -> None:
    a = _section(env.get("vic", "/scorecard?cluster=a&since=20m").text, "a")
    assert 'data-test="recommended-total">1<' in a  # only the newest, a minute ago
    assert 'data-test="precision-drain" data-right="0" data-wrong="0" data-pending="1"' in a
    page = env.get("vic", "/scorecard?cluster=a&since=2000-01-01T00:00")
    assert 'data-test="recommended-total">13<' in _section(page.text, "a")
    for bad in ("yesterday", "1e9d", "99999999d"):
        assert env.get("vic", f"/scorecard?since={bad}").status_code == 400, bad


def test_hostile_text_is_shown_as_text(env: Env) -> None:
    html = env.get("root", "/scorecard?cluster=a").text
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#39;category&#39;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#39;partition&#39;)&lt;/script&gt;" in html
    assert "drained by someone else (&lt;script&gt;alert(&#39;why&#39;)&lt;/script&gt;)" in html
    # A hostile name in a form is refused, not recorded.
    r = env.post(
        "root",
        "/scorecard/mode",
        data={"cluster": "a", "scope": "category", "name": HOSTILE_CATEGORY, "mode": "monitor"},
    )
    assert r.status_code == 400 and "no category" in r.json()["detail"]
    r = env.post(
        "root",
        "/scorecard/mode",
        data={"cluster": "a", "scope": "partition", "name": "a b;rm", "mode": "monitor"},
    )
    assert r.status_code == 400


def test_a_token_limited_to_a_never_sees_b(env: Env) -> None:
    page = env.get("va", "/scorecard")
    assert page.status_code == 200
    assert 'data-cluster="a"' in page.text and 'data-cluster="b"' not in page.text
    assert "bpart" not in page.text and "node_failure" not in page.text
    assert not any(i in page.text for i in env.b_drains)
    assert env.get("va", "/scorecard?cluster=b").status_code == 403
    # And an unscoped viewer filtering on b sees b only.
    only_b = env.get("vic", "/scorecard?cluster=b").text
    assert 'data-cluster="b"' in only_b and 'data-cluster="a"' not in only_b


def test_only_an_admin_sees_the_buttons(env: Env) -> None:
    for user in ("vic", "ana"):
        html = env.get(user, "/scorecard?cluster=a").text
        assert 'data-test="suggestion-form"' not in html, user
        assert 'data-test="suggestion-readonly"' in html
    html = env.get("root", "/scorecard?cluster=a").text
    forms = re.findall(r'<form method="post" action="/scorecard/mode".*?</form>', html, re.S)
    assert len(forms) == 2
    assert (
        'name="name" value="network"' in forms[0] and 'name="mode" value="autonomous"' in forms[0]
    )
    assert 'data-test="suggestion-promote"' in forms[0]
    assert 'name="name" value="hang"' in forms[1] and 'name="mode" value="monitor"' in forms[1]


def _metrics(env: Env, user: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = env.get(user, "/metrics").text
    out = {}
    for name, labels, value in re.findall(r"^(relaunch_\w+)\{(.*)\} (\S+)$", text, re.M):
        pairs = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        out[(name, pairs)] = float(value)
    return out


def _series(family: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return family, frozenset(labels.items())


def test_metrics_carry_the_scorecard_of_each_visible_cluster(env: Env) -> None:
    m = _metrics(env, "root")
    judged = "relaunch_actions_judged"
    assert m[_series(judged, cluster="a", action="drain", outcome="right")] == 3
    assert m[_series(judged, cluster="a", action="drain", outcome="wrong")] == 1
    assert m[_series(judged, cluster="a", action="drain", outcome="pending")] == 1
    assert m[_series(judged, cluster="a", action="restart", outcome="wrong")] == 1
    assert m[_series(judged, cluster="a", action="hold", outcome="wrong")] == 0
    assert m[_series(judged, cluster="b", action="drain", outcome="right")] == 2
    recs = "relaunch_recommendations"
    net = _series(recs, cluster="a", category="network", partition="ib", response="approved")
    assert m[net] == 3
    hang = _series(recs, cluster="a", category="hang", partition="cpu", response="autonomous")
    assert m[hang] == 2
    assert sum(v for (n, ls), v in m.items() if n == recs and ("cluster", "a") in ls) == 13
    s = "relaunch_rollout_suggestions"
    assert m[_series(s, cluster="a", change="promote", scope="category", name="network")] == 1
    assert m[_series(s, cluster="a", change="demote", scope="category", name="hang")] == 1
    assert not [k for k in m if k[0] == s and ("cluster", "b") in k[1]]
    # A token limited to a scrapes a's scorecard only; the older series are still there.
    scoped = _metrics(env, "va")
    assert scoped[_series(judged, cluster="a", action="drain", outcome="right")] == 3
    ours = (judged, recs, s)
    assert not [k for k in scoped if k[0] in ours and ("cluster", "b") in k[1]]
    assert any(k[0] == "relaunch_approvals_pending" for k in scoped)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found
    return found[1]


def _signed_in(env: Env, user: str) -> TestClient:
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


async def _mode_changes(url: str, cluster: str) -> list[tuple[str, str, dict[str, Any]]]:
    store = await AuditStore.open(url)
    try:
        rows = await store.events(rollout_incident(cluster))
        return [(r.kind, r.actor, r.data) for r in rows]
    finally:
        await store.close()


async def _restore(url: str) -> None:
    """Cluster a's modes as the story left them: network as configured, hang autonomous."""
    store = await AuditStore.open(url)
    try:
        await change_mode(store, "a", ScopeKind.CATEGORY, "network", None, by="test")
        await change_mode(store, "a", ScopeKind.CATEGORY, "hang", Mode.AUTONOMOUS, by="test")
    finally:
        await store.close()


def test_an_admin_promotes_from_the_page_and_nobody_else_may(env: Env) -> None:
    before = asyncio.run(_mode_changes(env.pg_url, "a"))
    form = {"cluster": "a", "scope": "category", "name": "network", "mode": "autonomous"}
    # Neither a viewer nor an approver may; nor an admin limited to another cluster.
    for user in ("vic", "ana", "rootb"):
        assert env.post(user, "/scorecard/mode", data=form).status_code == 403, user
    # A cookie session without its CSRF token, or with a wrong one, is refused.
    root = _signed_in(env, "root")
    html = root.get("/scorecard?cluster=a&since=7d").text
    assert root.post("/scorecard/mode", data=form).status_code == 403
    assert root.post("/scorecard/mode", data={**form, "csrf": "0" * 43}).status_code == 403
    # A bad field is a 400 before anything is recorded.
    for bad in ({"scope": "rack"}, {"mode": "yolo"}, {"since": "nope"}, {"cluster": "c"}):
        status = env.post("root", "/scorecard/mode", data={**form, **bad}).status_code
        assert status == (404 if "cluster" in bad else 400), bad
    assert asyncio.run(_mode_changes(env.pg_url, "a")) == before
    # The page's own form: recorded with the admin as actor and the suggestion's why.
    why = re.search(r'name="why" value="([^"]+)"', html)
    assert why and why[1].startswith("3 of 3 decisions approved and right")
    try:
        sent = {**form, "csrf": _csrf(html), "why": "3 of 3 decisions approved", "since": "7d"}
        r = root.post("/scorecard/mode", data=sent)
        assert r.status_code == 303, r.text
        assert r.headers["location"] == "/scorecard?cluster=a&since=7d"
        after = asyncio.run(_mode_changes(env.pg_url, "a"))
        assert after[len(before) :] == [
            (
                "mode_change",
                "root",
                {
                    "scope": "category",
                    "name": "network",
                    "mode": "autonomous",
                    "reason": "3 of 3 decisions approved",
                },
            )
        ]
        # The page now says so: network autonomous, the suggestion gone, the change listed.
        a = _section(root.get(r.headers["location"]).text, "a")
        assert 'data-mode="autonomous"' in _scope_row(a, "category", "network")
        assert 'data-name="network"' not in "".join(re.findall(r'data-test="suggestion".*?>', a))
        assert 'data-test="mode-change-by">root<' in a
        # A reason typed in the form wins over the suggestion's why.
        demote = {"cluster": "a", "scope": "category", "name": "hang", "mode": "monitor"}
        r = env.post("root", "/scorecard/mode", data={**demote, "why": "w", "reason": "typed"})
        assert r.status_code == 303 and r.headers["location"] == "/scorecard?cluster=a"
        last = asyncio.run(_mode_changes(env.pg_url, "a"))[-1]
        assert (last[1], last[2]["name"], last[2]["reason"]) == ("root", "hang", "typed")
    finally:
        asyncio.run(_restore(env.pg_url))
