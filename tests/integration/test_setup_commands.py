"""The one-time setup commands against the real servers, as an operator runs them:
`relaunch setup temporal` on a Temporal dev server of this module's own (a fresh namespace),
`relaunch db migrate` / `relaunch setup db --print-grants` on a PostgreSQL of its own. The
worker, the watcher and the console refuse an unmigrated database; the services' role reads
and appends but cannot truncate, delete, or drop the append-only trigger."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import pytest

from relaunch.connectors.audit import SCHEMA_VERSION, AuditStore
from relaunch.devstack import procs, services
from relaunch.models.recovery import AuditRecord
from relaunch.models.search_attributes import ALL
from tests.support.postgres import embedded_postgres

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def temporal() -> Iterator[str]:
    """A Temporal dev server of this module's own; its address."""
    root = Path(tempfile.mkdtemp(prefix="relaunch-setup-temporal-"))
    port = procs.free_port()
    services.start_temporal(root, port, procs.free_port(), procs.free_port())
    try:
        yield f"127.0.0.1:{port}"
    finally:
        pid = services.temporal_pid(root)
        if pid:
            procs.terminate([psutil.Process(pid)])
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A PostgreSQL server (its first database migrated); the superuser's URL."""
    with embedded_postgres("relaunch-setup-db-") as url:
        yield url


def _as(url: str, *, user: str | None = None, dbname: str | None = None) -> str:
    """``url`` for another role and/or database (the same server, the same socket)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{user}@{host}"
    path = f"/{dbname}" if dbname is not None else parts.path
    return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


def _fresh_database(pg_url: str) -> str:
    """A new, never-migrated database on the server; its superuser URL."""
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    return _as(pg_url, dbname=name)


def _config(tmp_path: Path, *, database_url: str, temporal: str, namespace: str) -> Path:
    path = tmp_path / f"cluster-{uuid.uuid4().hex[:6]}.json"
    path.write_text(
        json.dumps(
            {
                "name": "prod",
                "database_url": database_url,
                "bundle_dir": str(tmp_path / "bundles"),
                "temporal_address": temporal,
                "temporal_namespace": namespace,
            }
        )
    )
    return path


def relaunch(
    *args: str, timeout: float = TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relaunch.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(Path.cwd()), **(env or {})},
    )


def temporal_cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(services.temporal_binary()), *args, "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


# ---------------------------------------------------------------------- Temporal


def test_setup_temporal_creates_the_namespace_and_registers_the_attributes_once(
    temporal: str, tmp_path: Path
) -> None:
    namespace = f"relaunch-{uuid.uuid4().hex[:6]}"
    config = _config(
        tmp_path, database_url="postgresql://x@h/x", temporal=temporal, namespace=namespace
    )

    first = relaunch(
        "setup", "temporal", "--config", str(config), "--create-namespace", "--retention-days", "7"
    )
    assert first.returncode == 0, first.stderr
    assert f"namespace {namespace}: created, retention 7 days" in first.stdout
    for attr in ALL:
        assert f"{attr.name} ({attr.kind}): registered" in first.stdout

    # The server's own CLI sees each attribute, with its type, on that namespace.
    listed = temporal_cli(
        temporal, "operator", "search-attribute", "list", "--namespace", namespace, "-o", "json"
    )
    types = json.loads(listed.stdout)["customAttributes"]
    kinds = {"Keyword": "KEYWORD", "KeywordList": "KEYWORD_LIST", "Bool": "BOOL"}
    for attr in ALL:
        assert types.get(attr.name) == f"INDEXED_VALUE_TYPE_{kinds[attr.kind]}", attr.name
    described = temporal_cli(temporal, "operator", "namespace", "describe", "-n", namespace)
    assert namespace in described.stdout

    again = relaunch("setup", "temporal", "--config", str(config), "--create-namespace")
    assert again.returncode == 0, again.stderr
    assert f"namespace {namespace}: exists, retention 7 days" in again.stdout
    assert "registered" not in again.stdout.replace("already there", "")
    for attr in ALL:
        assert f"{attr.name} ({attr.kind}): already there" in again.stdout


def test_setup_temporal_refuses_a_missing_namespace_and_a_wrong_type(
    temporal: str, tmp_path: Path
) -> None:
    namespace = f"relaunch-{uuid.uuid4().hex[:6]}"
    config = _config(
        tmp_path, database_url="postgresql://x@h/x", temporal=temporal, namespace=namespace
    )

    missing = relaunch("setup", "temporal", "--config", str(config))
    assert missing.returncode == 1
    assert f"namespace {namespace} does not exist" in missing.stderr
    assert "--create-namespace" in missing.stderr
    assert "Traceback" not in missing.stderr

    # Someone registered RelaunchStage as Text: its type cannot change, so nothing is added.
    temporal_cli(temporal, "operator", "namespace", "create", "--namespace", namespace)
    create = [
        str(services.temporal_binary()), "operator", "search-attribute", "create",
        "--namespace", namespace, "--name", "RelaunchStage", "--type", "Text",
        "--address", temporal,
    ]  # fmt: skip
    # (a new namespace reaches the operator service when the frontend's cache refreshes)
    procs.wait_for(lambda: subprocess.run(create, capture_output=True).returncode == 0, 30, "ns")
    wrong = relaunch("setup", "temporal", "--config", str(config))
    assert wrong.returncode == 1
    assert "RelaunchStage is Text, Relaunch needs Keyword" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    listed = temporal_cli(
        temporal, "operator", "search-attribute", "list", "--namespace", namespace, "-o", "json"
    )
    assert "RelaunchCluster" not in listed.stdout


def test_setup_temporal_names_an_unreachable_frontend(tmp_path: Path) -> None:
    address = f"127.0.0.1:{procs.free_port()}"
    config = _config(tmp_path, database_url="postgresql://x@h/x", temporal=address, namespace="x")
    result = relaunch("setup", "temporal", "--config", str(config))
    assert result.returncode == 75  # try again later
    assert f"cannot reach Temporal at {address}" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------- PostgreSQL


def test_processes_refuse_an_unmigrated_database_until_db_migrate_runs(
    pg_url: str, temporal: str, tmp_path: Path
) -> None:
    url = _fresh_database(pg_url)
    config = _config(tmp_path, database_url=url, temporal=temporal, namespace="default")
    needs = f"schema is at version 0, this Relaunch needs {SCHEMA_VERSION}"

    for process in ("worker", "watch", "console"):
        refused = relaunch(process, "--config", str(config))
        assert refused.returncode == 1, (process, refused.stderr)
        assert needs in refused.stderr, (process, refused.stderr)
        assert "relaunch db migrate --config FILE" in refused.stderr
        assert "Traceback" not in refused.stderr
    with psycopg.connect(url) as conn:  # none of them created a table
        assert conn.execute("select to_regclass('audit_events')").fetchone() == (None,)

    status = relaunch("db", "status", "--config", str(config))
    assert status.returncode == 1
    assert f"schema version 0; this Relaunch needs {SCHEMA_VERSION}" in status.stdout

    # The owner's DSN from the environment, no configuration needed (a one-off from a bastion).
    migrated = relaunch("db", "migrate", "--dsn-env", "OWNER_DSN", env={"OWNER_DSN": url})
    assert migrated.returncode == 0, migrated.stderr
    assert f"schema migrated from version 0 to {SCHEMA_VERSION} as role postgres" in (
        migrated.stdout
    )
    again = relaunch("setup", "db", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert f"schema already at version {SCHEMA_VERSION}" in again.stdout
    assert "nothing to do" in again.stdout
    assert relaunch("db", "status", "--config", str(config)).returncode == 0


async def test_the_services_role_appends_but_cannot_alter_or_erase(
    pg_url: str, temporal: str, tmp_path: Path
) -> None:
    role = f"svc_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"create role {role} login")
    config = _config(tmp_path, database_url=pg_url, temporal=temporal, namespace="default")
    svc_url = _as(pg_url, user=role)

    # Before the grants the role cannot even read the version: named, no traceback.
    svc_config = _config(tmp_path, database_url=svc_url, temporal=temporal, namespace="default")
    denied = relaunch("db", "status", "--config", str(svc_config))
    assert denied.returncode != 0 and "Traceback" not in denied.stderr

    printed = relaunch("setup", "db", "--config", str(config), "--print-grants", role)
    assert printed.returncode == 0, printed.stderr
    grants = printed.stdout.strip().splitlines()
    assert f'GRANT SELECT, INSERT ON "public"."audit_events" TO "{role}";' in grants
    assert f'GRANT SELECT ON "public"."schema_migrations" TO "{role}";' in grants
    assert not [g for g in grants if any(w in g for w in ("UPDATE", "DELETE", "TRUNCATE"))]
    assert (
        f'ALTER DEFAULT PRIVILEGES FOR ROLE "postgres" IN SCHEMA "public" '
        f'GRANT SELECT, INSERT ON TABLES TO "{role}";'
    ) in grants
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in grants:
            conn.execute(statement)  # type: ignore[arg-type]

    # The services' role: the store opens (the version checked), rows go in.
    store = await AuditStore.open(svc_url, timeout=10)
    incident = f"relaunch-prod-{uuid.uuid4().hex[:6]}-0"
    try:
        await store.ensure_incident(incident, "prod", "41", 0)
        assert await store.record(
            AuditRecord(incident_id=incident, kind="detection", at=datetime.now(UTC)),
            dedupe_key=f"{incident}:d",
        )
        assert len(await store.events(incident)) == 1
    finally:
        await store.close()

    # A table a later migration adds (run by the owner) needs no new grant.
    later = f"later_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"create table {later} (id bigserial primary key, x int)")  # type: ignore[arg-type]
    with psycopg.connect(svc_url, autocommit=True) as conn:
        conn.execute(f"insert into {later} (x) values (1)")  # type: ignore[arg-type]
        assert conn.execute(f"select x from {later}").fetchall() == [(1,)]  # type: ignore[arg-type]

    # ... but nothing it sends can erase the trail or change the schema.
    refused = {
        "truncate": "truncate audit_events",
        "drop trigger": "drop trigger audit_events_append_only on audit_events",
        "delete": f"delete from audit_events where incident_id = '{incident}'",
        "update": f"update audit_events set summary = 'x' where incident_id = '{incident}'",
        "alter": "alter table audit_events add column x int",
        "create": "create table sneaky (x int)",
        "fake version": "insert into schema_migrations (version) values (999)",
    }
    with psycopg.connect(svc_url, autocommit=True) as conn:
        for what, statement in refused.items():
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[arg-type]
                pytest.fail(f"{what} was allowed")
    with psycopg.connect(pg_url) as conn:
        count = conn.execute(
            "select count(*) from audit_events where incident_id = %s", (incident,)
        ).fetchone()
        assert count == (1,)

    # Nor may it migrate a database that is behind: it is told to use the owner role.
    fresh = _fresh_database(pg_url)
    with psycopg.connect(fresh, autocommit=True) as conn:
        conn.execute(f"grant connect on database {urlsplit(fresh).path[1:]} to {role}")
    behind = _config(
        tmp_path, database_url=_as(fresh, user=role), temporal=temporal, namespace="default"
    )
    no = relaunch("db", "migrate", "--config", str(behind))
    assert no.returncode == 1
    assert f"role {role} may not change the schema" in no.stderr
    assert "Traceback" not in no.stderr
