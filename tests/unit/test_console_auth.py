"""Console access: token hashing, roles, sessions and CSRF tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from httpx import Response
from starlette.testclient import TestClient

from relaunch.console.app import create_app
from relaunch.console.auth import (
    ConsoleRole,
    Sessions,
    TokensFileError,
    TokenStore,
    hash_token,
    write_tokens,
)
from relaunch.console.routes_auth import LOGIN_BODY_LIMIT, LOGIN_NONCE_COOKIE
from relaunch.models.config import ClusterConfig, ConsoleSettings


def test_roles_are_ordered_viewer_approver_admin() -> None:
    assert ConsoleRole.ADMIN.allows(ConsoleRole.APPROVER) and ConsoleRole.ADMIN.allows(
        ConsoleRole.VIEWER
    )
    assert ConsoleRole.APPROVER.allows(ConsoleRole.VIEWER) and not ConsoleRole.APPROVER.allows(
        ConsoleRole.ADMIN
    )
    assert not ConsoleRole.VIEWER.allows(ConsoleRole.APPROVER)


def test_tokens_file_holds_only_hashes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(path, [("ana", ConsoleRole.APPROVER), ("vic", ConsoleRole.VIEWER)])
    text = path.read_text()
    for token in tokens.values():
        assert token not in text
        assert hash_token(token) in text
    assert {e["name"]: e["role"] for e in json.loads(text)} == {"ana": "approver", "vic": "viewer"}


def test_authenticate_finds_the_user_of_a_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(path, [("ana", ConsoleRole.APPROVER), ("root", ConsoleRole.ADMIN)])
    store = TokenStore(path)
    user = store.authenticate(tokens["ana"] + "\n")  # pasted with a newline
    assert user is not None and user.name == "ana" and user.role is ConsoleRole.APPROVER
    assert store.authenticate("rl_not-a-token") is None
    assert store.authenticate("") is None


def test_removing_a_line_revokes_the_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(path, [("ana", ConsoleRole.APPROVER)])
    store = TokenStore(path)
    user = store.authenticate(tokens["ana"])
    assert user is not None and store.by_hash("ana", user.sha256) is not None
    path.write_text("[]")
    import os

    os.utime(path, (1, 1))  # a different mtime even on a coarse clock
    assert store.authenticate(tokens["ana"]) is None
    assert store.by_hash("ana", user.sha256) is None


def test_a_malformed_tokens_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text('[{"name": "ana", "role": "superuser", "sha256": "x"}]')
    with pytest.raises(TokensFileError, match="tokens.json"):
        TokenStore(path)
    with pytest.raises(TokensFileError, match="cannot read"):
        TokenStore(tmp_path / "missing.json")


def test_session_cookie_round_trip_and_tampering(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "t.json", [("ana", ConsoleRole.APPROVER)])
    user = TokenStore(tmp_path / "t.json").authenticate(tokens["ana"])
    assert user is not None
    sessions = Sessions("s" * 32)
    cookie = sessions.dump(user)
    assert tokens["ana"] not in cookie
    loaded = sessions.load(cookie)
    assert loaded is not None and loaded[:2] == ("ana", user.sha256)
    assert sessions.load(cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB")) is None
    assert Sessions("o" * 32).load(cookie) is None  # signed with another secret


def test_csrf_token_is_bound_to_the_session() -> None:
    sessions = Sessions("s" * 32)
    token = sessions.csrf_token("sid-1")
    assert sessions.csrf_ok("sid-1", token)
    assert not sessions.csrf_ok("sid-2", token)
    assert not sessions.csrf_ok("sid-1", None)
    assert not sessions.csrf_ok("sid-1", "")
    assert not sessions.csrf_ok("sid-1", token[:-1] + "0")
    assert Sessions("o" * 32).csrf_token("sid-1") != token


def test_login_nonce_is_double_submit() -> None:
    sessions = Sessions("s" * 32)
    assert sessions.login_csrf_ok("abc", "abc")
    assert not sessions.login_csrf_ok("abc", "abd")
    assert not sessions.login_csrf_ok(None, "abc")
    assert not sessions.login_csrf_ok("abc", None)


# ------------------------------------------------------------------ the sign-in route


def console_client(tmp_path: Path, *, behind_tls: bool = False) -> TestClient:
    """The real console app; no lifespan (no database): sign-in needs none."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps([{"name": "ana", "role": "viewer", "sha256": hash_token(TOKEN)}]))
    config = ClusterConfig(
        name="dev",
        database_url="postgresql://nobody@127.0.0.1:1/none",
        bundle_dir=str(tmp_path),
        console=ConsoleSettings(behind_tls=behind_tls),
    )
    app = create_app(config, tokens_file=tokens, secret="s" * 32)
    return TestClient(app, base_url="http://console.test", follow_redirects=False)


TOKEN = "t0ken-for-ana"


def sign_in(client: TestClient, **extra: str) -> Response:
    form = client.get("/login")
    # Sent back by hand: a Secure cookie never travels over the test's plain HTTP, as it does
    # between a browser and the TLS proxy.
    csrf = form.cookies.get(LOGIN_NONCE_COOKIE) or ""
    client.cookies.clear()
    return client.post(
        "/login",
        data={"csrf": csrf, "token": TOKEN, "next": "/", **extra},
        headers={"cookie": f"{LOGIN_NONCE_COOKIE}={csrf}"},
    )


def test_sign_in_works_and_the_cookie_is_not_secure_over_plain_http(tmp_path: Path) -> None:
    answer = sign_in(console_client(tmp_path))
    assert answer.status_code == 303
    cookie = next(h for h in answer.headers.get_list("set-cookie") if "relaunch_session=" in h)
    assert "secure" not in cookie.lower()


def test_behind_a_tls_proxy_the_session_cookie_is_secure(tmp_path: Path) -> None:
    answer = sign_in(console_client(tmp_path, behind_tls=True))
    assert answer.status_code == 303
    cookie = next(h for h in answer.headers.get_list("set-cookie") if "relaunch_session=" in h)
    assert "secure" in cookie.lower().split("; ")


def test_an_oversized_sign_in_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    client = console_client(tmp_path)
    # A valid token and nonce, padded past the limit: refused whole, not signed in.
    answer = sign_in(client, padding="x" * (LOGIN_BODY_LIMIT + 1))
    assert answer.status_code == 413
    assert not any("relaunch_session=" in h for h in answer.headers.get_list("set-cookie"))
    # Sent without a Content-Length (chunked), the read still stops at the limit.
    chunks = (b"token=" + b"x" * 4096 for _ in range(64))
    assert client.post("/login", content=chunks).status_code == 413


def test_a_sign_in_with_too_many_fields_is_refused(tmp_path: Path) -> None:
    client = console_client(tmp_path)
    body = "&".join(f"f{i}=1" for i in range(100))
    headers = {"content-type": "application/x-www-form-urlencoded"}
    assert client.post("/login", content=body, headers=headers).status_code == 413
