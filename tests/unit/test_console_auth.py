"""Console access: token hashing, roles, sessions and CSRF tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relaunch.console.auth import (
    Role,
    Sessions,
    TokensFileError,
    TokenStore,
    hash_token,
    write_tokens,
)


def test_roles_are_ordered_viewer_approver_admin() -> None:
    assert Role.ADMIN.allows(Role.APPROVER) and Role.ADMIN.allows(Role.VIEWER)
    assert Role.APPROVER.allows(Role.VIEWER) and not Role.APPROVER.allows(Role.ADMIN)
    assert not Role.VIEWER.allows(Role.APPROVER)


def test_tokens_file_holds_only_hashes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(path, [("ana", Role.APPROVER), ("vic", Role.VIEWER)])
    text = path.read_text()
    for token in tokens.values():
        assert token not in text
        assert hash_token(token) in text
    assert {e["name"]: e["role"] for e in json.loads(text)} == {"ana": "approver", "vic": "viewer"}


def test_authenticate_finds_the_user_of_a_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(path, [("ana", Role.APPROVER), ("root", Role.ADMIN)])
    store = TokenStore(path)
    user = store.authenticate(tokens["ana"] + "\n")  # pasted with a newline
    assert user is not None and user.name == "ana" and user.role is Role.APPROVER
    assert store.authenticate("rl_not-a-token") is None
    assert store.authenticate("") is None


def test_removing_a_line_revokes_the_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    tokens = write_tokens(path, [("ana", Role.APPROVER)])
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
    tokens = write_tokens(tmp_path / "t.json", [("ana", Role.APPROVER)])
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
