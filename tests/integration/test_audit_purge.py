"""Retention of the audit trail on a real PostgreSQL of this module's own: migration 6 moves a
trail with rows into monthly partitions and loses nothing; `relaunch audit purge` (under its own
role, as an operator runs it) deletes only the incidents wholly older than its date, with their
rows and bundles, drops whole months, and records who purged what; nothing else may delete,
update or truncate; the console's incremental /metrics counters equal a full recount."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from relaunch.connectors import audit_schema
from relaunch.connectors.audit import AuditStore, migrate
from relaunch.console.metrics import AuditCounters, full_snapshot
from relaunch.console.queries import ConsoleDb
from relaunch.models.recovery import AuditRecord
from tests.support.postgres import embedded_postgres

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=400)  # a month of its own, more than a year ago
CUT = NOW - timedelta(days=200)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-purge-db-") as url:
        yield url


def _as(url: str, *, user: str | None = None, dbname: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        netloc = f"{user}@{netloc.rsplit('@', 1)[-1]}"
    path = f"/{dbname}" if dbname is not None else parts.path
    return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


def _fresh(pg_url: str) -> str:
    name = f"purge_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    return _as(pg_url, dbname=name)


async def _migrate_to(url: str, version: int) -> int:
    """Apply the migrations up to ``version`` (as a database of that release would be)."""
    saved = list(audit_schema.MIGRATIONS)
    audit_schema.MIGRATIONS[:] = [m for m in saved if m[0] <= version]
    try:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            return await migrate(conn)
        finally:
            await conn.close()
    finally:
        audit_schema.MIGRATIONS[:] = saved


def relaunch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relaunch.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path.cwd()), **(env or {})},
    )


def _config(tmp_path: Path, url: str, cluster: str = "prod") -> Path:
    path = tmp_path / f"{cluster}.json"
    path.write_text(
        json.dumps({"name": cluster, "database_url": url, "bundle_dir": str(tmp_path / "b")})
    )
    return path


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "select id, incident_id, kind, at, actor, stage, nodes, summary, data, dedupe_key"
            " from audit_events order by id"
        ).fetchall()


def _seed_sql(conn: psycopg.Connection[Any], incident: str, cluster: str, at: datetime) -> None:
    conn.execute(
        "insert into incidents (id, cluster, job_id, attempt, created_at)"
        " values (%s, %s, '7', 0, %s) on conflict do nothing",
        (incident, cluster, at),
    )


async def _record(store: AuditStore, incident: str, kind: str, at: datetime, **kw: Any) -> None:
    key = f"{incident}:{kind}:{at.isoformat()}:{kw.get('stage')}"
    await store.record(AuditRecord(incident_id=incident, kind=kind, at=at, **kw), dedupe_key=key)


# ---------------------------------------------------------------------- migration 6


async def test_migration_6_moves_every_row_into_monthly_partitions(pg_url: str) -> None:
    url = _fresh(pg_url)
    before_6 = max(v for v, _ in audit_schema.MIGRATIONS if v < 6)
    assert await _migrate_to(url, before_6) == before_6
    with psycopg.connect(url, autocommit=True) as conn:
        for n, at in enumerate((OLD, CUT, NOW - timedelta(days=3), NOW)):
            incident = f"relaunch-prod-{n}-0"
            _seed_sql(conn, incident, "prod", at)
            for kind in ("detection", "verdict", "stage"):
                conn.execute(
                    "insert into audit_events (incident_id, kind, at, actor, stage, nodes,"
                    " summary, data, dedupe_key) values (%s, %s, %s, 'w', %s, %s, 's', %s, %s)",
                    (
                        incident,
                        kind,
                        at,
                        "done" if kind == "stage" else None,
                        ["gpu01"],
                        json.dumps({"category": "gpu_hardware", "source": "job_log"}),
                        f"{incident}:{kind}",
                    ),
                )
    rows = _rows(url)
    assert len(rows) == 12

    assert await _migrate_to(url, 6) == 6
    assert _rows(url) == rows  # every row, every column, the same ids
    with psycopg.connect(url) as conn:
        parts = {
            r[0]
            for r in conn.execute(
                "select c.relname from pg_inherits h join pg_class c on c.oid = h.inhrelid"
                " where h.inhparent = 'audit_events'::regclass"
            )
        }
        assert f"audit_events_p{OLD:%Y%m}" in parts and f"audit_events_p{NOW:%Y%m}" in parts
        ahead = (NOW.replace(day=1) + timedelta(days=95)).strftime("%Y%m")
        assert f"audit_events_p{ahead}" in parts  # three months ahead
        assert conn.execute(f"select count(*) from audit_events_p{OLD:%Y%m}").fetchone() == (3,)
        assert conn.execute("select count(*) from audit_dedupe").fetchone() == (12,)

    store = await AuditStore.open(url)
    try:  # the old dedupe keys still dedupe; a new row takes the next id
        again = AuditRecord(incident_id="relaunch-prod-0-0", kind="detection", at=NOW)
        assert not await store.record(again, dedupe_key="relaunch-prod-0-0:detection")
        assert await store.has_dedupe_key("relaunch-prod-0-0:verdict")
        assert await store.record(again, dedupe_key="new")
        assert [r.id for r in await store.events("relaunch-prod-0-0")][-1] > rows[-1][0]
        listed = {i.id for i in await store.incidents()}
        assert listed == {f"relaunch-prod-{n}-0" for n in range(4)}
    finally:
        await store.close()


async def test_a_row_before_every_month_made_waits_in_default_and_moves_into_its_month(
    pg_url: str, tmp_path: Path
) -> None:
    url = _fresh(pg_url)
    await _migrate_to(url, 6)
    purger = f"purge_{uuid.uuid4().hex[:6]}"
    _grants(url, purger, "--purge")
    store = await AuditStore.open(url)
    try:
        await store.ensure_incident("relaunch-prod-5-0", "prod", "5", 0)
        assert await store.record(
            AuditRecord(incident_id="relaunch-prod-5-0", kind="detection", at=OLD),
            dedupe_key="late",
        )
    finally:
        await store.close()
    month = f"audit_events_p{OLD:%Y%m}"
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("select count(*) from audit_events_default").fetchone() == (1,)
        assert conn.execute("select audit_create_partition(%s)", (OLD.date(),)).fetchone() == (
            True,
        )
        assert conn.execute("select count(*) from audit_events_default").fetchone() == (0,)
        assert conn.execute(f"select count(*) from {month}").fetchone() == (1,)
        # The moved row is still refused to everyone but a purge, and its key still dedupes.
        with pytest.raises(psycopg.errors.RaiseException, match="TRUNCATE is refused"):
            conn.execute(f"truncate {month}")
    # `relaunch audit maintain` as the purge role: the months ahead exist already.
    maintained = relaunch(
        "audit", "maintain", "--config", str(_config(tmp_path, url)), "--dsn-env", "P",
        env={"P": _as(url, user=purger)},
    )  # fmt: skip
    assert maintained.returncode == 0, maintained.stderr
    assert "0 made, this month and the next 3 ready" in maintained.stdout


# ---------------------------------------------------------------------- purge


def _grants(url: str, role: str, *extra: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"create role {role} login")
    printed = relaunch(
        "setup", "db", "--dsn-env", "OWNER", "--print-grants", role, *extra, env={"OWNER": url}
    )
    assert printed.returncode == 0, printed.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in printed.stdout.strip().splitlines():
            conn.execute(statement)


async def test_purge_deletes_only_incidents_wholly_older_with_rows_and_bundles(
    pg_url: str, tmp_path: Path
) -> None:
    url = _fresh(pg_url)
    await _migrate_to(url, 6)
    svc, purger = f"svc_{uuid.uuid4().hex[:6]}", f"purge_{uuid.uuid4().hex[:6]}"
    _grants(url, svc)
    _grants(url, purger, "--purge")
    config = _config(tmp_path, url)
    bundles = tmp_path / "b"
    mid_old = NOW - timedelta(days=300)
    with psycopg.connect(url, autocommit=True) as conn:  # a trail that has run for a year
        for month in (OLD, mid_old):
            conn.execute("select audit_create_partition(%s)", (month.date(),))

    gone, active, recent = "relaunch-prod-1-0", "relaunch-prod-2-0", "relaunch-prod-3-0"
    other = "relaunch-lab-4-0"  # another cluster's, as old
    with psycopg.connect(url, autocommit=True) as conn:
        _seed_sql(conn, gone, "prod", OLD)
        _seed_sql(conn, active, "prod", mid_old)
        _seed_sql(conn, recent, "prod", NOW)
        _seed_sql(conn, other, "lab", mid_old)
        _seed_sql(conn, "intake-prod", "prod", OLD)
        # A pause 300 days old and never lifted: the kill switch's record is never purged.
        _seed_sql(conn, "control-prod", "prod", mid_old)
    store = await AuditStore.open(_as(url, user=svc))
    try:
        for kind in ("detection", "verdict", "action"):
            await _record(store, gone, kind, OLD + timedelta(minutes=1))
            await _record(store, other, kind, mid_old)
        await _record(store, active, "detection", mid_old)
        await _record(store, active, "approval", NOW - timedelta(days=1))  # still going on
        await _record(store, recent, "detection", NOW)
        await _record(store, "intake-prod", "health_event", mid_old)
        await _record(store, "intake-prod", "health_event", NOW)
        await _record(store, "control-prod", "pause", mid_old)
    finally:
        await store.close()
    for incident in (gone, active, recent):
        (bundles / incident / "logs").mkdir(parents=True)
        (bundles / incident / "logs" / "job.log").write_text("x")
    everything = _rows(url)
    day = CUT.date().isoformat()
    as_purger = {"PURGE_DSN": _as(url, user=purger)}

    # The services' role cannot purge: it is told which role can, nothing is deleted.
    refused = relaunch(
        "audit", "purge", "--config", str(config), "--before", day, "--by", "ops",
        "--dsn-env", "SVC_DSN", env={"SVC_DSN": _as(url, user=svc)},
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert "may not purge" in refused.stderr and "--purge" in refused.stderr
    assert "Traceback" not in refused.stderr
    # A date within the last 30 days is refused before anything is read.
    soon = relaunch(
        "audit", "purge", "--config", str(config), "--by", "ops", "--dsn-env", "PURGE_DSN",
        "--before", (NOW - timedelta(days=3)).date().isoformat(), env=as_purger,
    )  # fmt: skip
    assert soon.returncode == 1 and "less than 30 days ago" in soon.stderr

    dry = relaunch(
        "audit", "purge", "--config", str(config), "--before", day, "--by", "ops",
        "--dsn-env", "PURGE_DSN", "--dry-run", env=as_purger,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "would delete 1 incident(s)" in dry.stdout and "4 audit row(s)" in dry.stdout
    assert f"audit_events_p{OLD:%Y%m}" in dry.stdout
    assert _rows(url) == everything and (bundles / gone).is_dir()

    done = relaunch(
        "audit", "purge", "--config", str(config), "--before", day, "--by", "ops",
        "--dsn-env", "PURGE_DSN", env=as_purger,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deleted 1 incident(s)" in done.stdout and "1 bundle(s)" in done.stdout

    left = _rows(url)
    assert not [r for r in left if r[1] == gone]
    kept = [r for r in everything if r[1] != gone and not (r[1] == "intake-prod" and r[3] < CUT)]
    assert left == kept  # the active, recent and other cluster's incidents, untouched
    assert not (bundles / gone).exists()
    assert (bundles / active).is_dir() and (bundles / recent).is_dir()
    with psycopg.connect(url) as conn:
        assert conn.execute("select id from incidents where id = %s", (gone,)).fetchall() == []
        assert conn.execute(
            "select count(*) from audit_dedupe where incident_id = %s", (gone,)
        ).fetchone() == (0,)
        assert conn.execute(
            "select to_regclass(%s)", (f"audit_events_p{OLD:%Y%m}",)
        ).fetchone() == (None,)
        # The other cluster's month stays: its rows are not this purge's.
        assert conn.execute(
            "select to_regclass(%s)", (f"audit_events_p{mid_old:%Y%m}",)
        ).fetchone() != (None,)
        purges = conn.execute(
            "select by, role, cluster, before, phase, incidents, rows, bundles, partitions"
            " from audit_purges order by id"
        ).fetchall()
    assert [p[4] for p in purges] == ["started", "done"]
    assert purges[1][:3] == ("ops", purger, "prod")
    assert purges[1][3].date() == CUT.date()
    assert purges[1][5:8] == (1, 4, 1)
    assert purges[1][8] == [f"audit_events_p{OLD:%Y%m}"]

    # Run again: nothing left to purge, and recorded again.
    twice = relaunch(
        "audit", "purge", "--config", str(config), "--before", day, "--by", "ops",
        "--dsn-env", "PURGE_DSN", env=as_purger,
    )  # fmt: skip
    assert twice.returncode == 0 and "deleted 0 incident(s)" in twice.stdout
    assert _rows(url) == kept


async def test_nothing_but_the_purge_deletes_updates_or_truncates(pg_url: str) -> None:
    url = _fresh(pg_url)
    await _migrate_to(url, 6)
    svc, purger = f"svc_{uuid.uuid4().hex[:6]}", f"purge_{uuid.uuid4().hex[:6]}"
    _grants(url, svc)
    _grants(url, purger, "--purge")
    incident = "relaunch-prod-9-0"
    with psycopg.connect(url, autocommit=True) as conn:
        _seed_sql(conn, incident, "prod", NOW)
        conn.execute(
            "insert into audit_events (incident_id, kind, at, actor) values (%s, 'x', %s, 'w')",
            (incident, NOW),
        )
    month = f"audit_events_p{NOW:%Y%m}"
    writes = {
        "delete": f"delete from audit_events where incident_id = '{incident}'",
        "delete partition": f"delete from {month}",
        "update": "update audit_events set summary = 'x'",
        "truncate": "truncate audit_events",
        "truncate partition": f"truncate {month}",
        "truncate dedupe": "truncate audit_dedupe",
        "delete dedupe": "delete from audit_dedupe",
        "delete incident": "delete from incidents",
        "truncate purges": "truncate audit_purges",
        "drop trigger": "drop trigger audit_events_append_only on audit_events",
        "detach": f"alter table audit_events detach partition {month}",
    }
    with psycopg.connect(_as(url, user=svc), autocommit=True) as conn:
        for what, statement in writes.items():
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
                pytest.fail(f"the services' role could {what}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the owner's functions
            conn.execute("select audit_drop_partition(%s, now(), 'prod')", (month,))
    # The purge role deletes only inside a purge; it never updates or truncates.
    with psycopg.connect(_as(url, user=purger), autocommit=True) as conn:
        for statement in (writes["delete"], writes["delete incident"]):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement)
        for what in ("update", "truncate", "truncate partition", "drop trigger"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(writes[what])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("insert into audit_events (incident_id, kind, at, actor)"
                         " values (%s, 'x', now(), 'w')", (incident,))  # fmt: skip
    # Even the owner: the triggers refuse (it must drop them on purpose first).
    with psycopg.connect(url, autocommit=True) as conn:
        for what in ("delete", "update", "truncate", "truncate partition", "truncate dedupe"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(writes[what])
        conn.execute(
            "insert into audit_purges (by, cluster, before, phase) values ('a', 'p', now(), 'done')"
        )
        for statement in ("update audit_purges set by = 'x'", "delete from audit_purges"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement)
        assert conn.execute("select count(*) from audit_events").fetchone() == (1,)


# ---------------------------------------------------------------------- /metrics


def _strip(snapshots: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The incremental snapshot less the series the SQL recount does not compute."""
    return {
        c: {k: v for k, v in s.items() if k not in ("failed", "past_half_expiry")}
        for c, s in snapshots.items()
    }


def _norm(snapshots: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Both shapes alike: lists of rows sorted, histograms as floats."""
    out: dict[str, dict[str, Any]] = {}
    for cluster, s in snapshots.items():
        out[cluster] = {
            "detections": sorted((r["source"], r["category"], r["n"]) for r in s["detections"]),
            "actions": sorted((r["step"], r["result"], r["n"]) for r in s["actions"]),
            "refusals": sorted((r["guard"], r["n"]) for r in s["refusals"]),
            "pending": int(s["pending"]),
            "latency": [round(float(x), 6) for x in s["latency"]],
            "to_action": [round(float(x), 6) for x in s["to_action"]],
        }
    return out


async def test_incremental_metrics_equal_a_full_recount_after_new_rows(pg_url: str) -> None:
    url = _fresh(pg_url)
    await _migrate_to(url, 6)
    store = await AuditStore.open(url)
    db = ConsoleDb(url)
    await db.start()
    t = NOW - timedelta(hours=2)

    async def row(incident: str, kind: str, dt: float, **kw: Any) -> None:
        await store.record(
            AuditRecord(incident_id=incident, kind=kind, at=t + timedelta(seconds=dt), **kw)
        )

    try:
        for n in range(4):
            incident = f"relaunch-prod-{n}-0"
            await store.ensure_incident(incident, "prod", str(n), 0)
            await row(
                incident,
                "detection",
                n,
                data={"source": "job_log", "detection_latency_s": 0.3 * (n + 1)},
            )
            await row(incident, "verdict", n + 1, data={"category": "gpu_hardware"})
        await store.ensure_incident("relaunch-lab-9-0", "lab", "9", 0)
        await row("relaunch-lab-9-0", "detection", 0, data={"source": "telemetry"})
        counters = AuditCounters(db)
        first = await counters.snapshot()
        assert _norm(_strip(first)) == _norm(await full_snapshot(db))
        read = counters.rows_read

        # New rows: a later verdict moves an incident's detections to another category, an
        # action ends one's wait for detection-to-action, approvals wait and are decided, a
        # guard refuses, one recovery fails.
        await row("relaunch-prod-0-0", "verdict", 10, data={"category": "network"})
        await row(
            "relaunch-prod-0-0",
            "detection",
            11,
            data={"source": "telemetry", "detection_latency_s": 12.0},
        )
        await row("relaunch-prod-1-0", "action", 40, data={"step": "drain", "changed": True})
        await row("relaunch-prod-1-0", "action", 45, data={"step": "restart"})
        await row("relaunch-prod-2-0", "stage", 5, stage="awaiting_approval")
        await row("relaunch-prod-3-0", "stage", 5, stage="awaiting_approval")
        await row("relaunch-prod-3-0", "approval", 50, data={"by": "ana"})
        await row(
            "relaunch-prod-3-0", "guard", 51, data={"guard": "blast_radius", "allowed": False}
        )
        await row("relaunch-prod-3-0", "stage", 60, stage="failed")
        await row("relaunch-lab-9-0", "stage", 1, stage="awaiting_approval")
        db._cache.clear()  # noqa: SLF001
        later = await counters.snapshot(timeouts={"prod": 3600.0, "lab": 86400.0})
        assert _norm(_strip(later)) == _norm(await full_snapshot(db))
        assert _norm(_strip(later)) == _norm(_strip(await AuditCounters(db).snapshot()))
        assert counters.rows_read - read <= 10 + 2000  # the new rows (and the look-back)
        assert later["prod"]["pending"] == 1 and later["lab"]["pending"] == 1
        # Two hours waiting: past half of prod's hour, not of lab's day.
        assert later["prod"]["past_half_expiry"] == 1 and later["lab"]["past_half_expiry"] == 0
        assert later["prod"]["failed"] == 1 and later["lab"]["failed"] == 0
        assert ("telemetry", "network", 1) in _norm(later)["prod"]["detections"]
        assert ("job_log", "network", 1) in _norm(later)["prod"]["detections"]
        assert later == await counters.snapshot(timeouts={"prod": 3600.0, "lab": 86400.0})
    finally:
        await store.close()
        await db.close()
