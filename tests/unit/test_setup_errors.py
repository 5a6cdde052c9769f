"""The setup commands' errors that need no server: Temporal's refusals named as missing rights
or an unreachable frontend, and a role name that is no plain identifier refused before any
connection."""

from __future__ import annotations

import os
import subprocess
import sys

from temporalio.service import RPCError, RPCStatusCode

from relaunch.connectors.temporal_setup import _rights_or


def test_missing_rights_are_named_as_such() -> None:
    for status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
        err = _rights_or(RPCError("Request unauthorized.", status, b""), "register attributes")
        assert str(err).startswith("Temporal refused to register attributes: Request unauthorized.")
        assert "admin rights on the namespace" in str(err)


def test_an_unanswering_frontend_is_not_called_a_rights_problem() -> None:
    err = _rights_or(RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b""), "list")
    assert "did not answer" in str(err) and "rights" not in str(err)
    assert err.retryable  # `relaunch setup temporal` exits 75: try again


def test_print_grants_refuses_a_role_that_is_no_plain_name() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "setup", "db", "--dsn-env", "DSN",
         "--print-grants", 'x"; drop table audit_events; --'],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DSN": "postgresql://x@127.0.0.1:1/none", "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert result.returncode == 1
    assert "is not a plain role name" in result.stderr
    assert "Traceback" not in result.stderr
