"""The audit trail on the real PostgreSQL: migrations, append-only rows, dedupe, queries."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from relaunch.connectors.audit import AuditStore, migrate
from relaunch.models.recovery import AuditRecord


def _rec(incident: str, kind: str, **kw: object) -> AuditRecord:
    return AuditRecord(incident_id=incident, kind=kind, at=datetime.now(UTC), **kw)  # type: ignore[arg-type]


async def test_trail_is_append_only_deduplicated_and_queryable(database_url: str) -> None:
    store = await AuditStore.open(database_url)
    cluster = f"audit{uuid.uuid4().hex[:6]}"
    inc = f"relaunch-{cluster}-41-0"
    try:
        await store.ensure_incident(inc, cluster, "41", 0)
        await store.ensure_incident(inc, cluster, "41", 0)  # idempotent
        assert await store.record(_rec(inc, "detection", summary="log"), dedupe_key=f"{inc}:d1")
        assert not await store.record(
            _rec(inc, "detection", summary="again"), dedupe_key=f"{inc}:d1"
        )
        await store.record(_rec(inc, "stage", stage="gathering", summary="g"))
        await store.record(
            _rec(inc, "verdict", nodes=["n2"], summary="gpu", data={"category": "gpu_hardware"})
        )
        await store.record(
            _rec(
                inc,
                "action",
                nodes=["n2"],
                summary="drain n2",
                data={"step": "drain", "changed": True},
            )
        )
        await store.record(
            _rec(inc, "action", summary="requeue", data={"step": "restart", "changed": True})
        )
        await store.record(_rec(inc, "stage", stage="done", summary="done"))

        events = await store.events(inc)
        assert [e.kind for e in events] == [
            "detection",
            "stage",
            "verdict",
            "action",
            "action",
            "stage",
        ]
        rows = await store.incidents(node="n2")
        row = next(r for r in rows if r.id == inc)
        assert (row.category, row.stage, row.nodes) == ("gpu_hardware", "done", ["n2"])
        assert [r.id for r in await store.incidents(job_id="41") if r.cluster == cluster] == [inc]
        assert not [r for r in await store.incidents(node="n7") if r.id == inc]
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        assert await store.count_restarts(cluster, ["41"], hour_ago) == 1
        assert await store.drained_nodes(cluster, hour_ago) == ["n2"]
    finally:
        await store.close()

    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("update audit_events set summary = 'x' where incident_id = %s", (inc,))
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("delete from audit_events where incident_id = %s", (inc,))


async def test_migrations_apply_once(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        first = await migrate(conn)
        assert await migrate(conn) == first
        cur = await conn.execute("select count(*) from schema_migrations")
        row = await cur.fetchone()
        assert row is not None and row[0] == first


async def test_node_reputation_counts_incidents_that_implicated_each_node(
    database_url: str,
) -> None:
    store = await AuditStore.open(database_url)
    cluster = f"rep{uuid.uuid4().hex[:6]}"
    verdicts = [
        ("1", "gpu_hardware", ["n2"]),  # named by the evidence
        ("2", "unknown", ["n1", "n2", "n3"]),  # nobody named: the whole allocation
        ("3", "hang", ["n2", "n4"]),
        ("4", "application", []),  # nobody's node
    ]
    try:
        for job, category, implicated in verdicts:
            inc = f"relaunch-{cluster}-{job}-0"
            await store.ensure_incident(inc, cluster, job, 0)
            await store.record(
                _rec(inc, "verdict", data={"category": category, "implicated": implicated})
            )
        rows = await store.node_reputation(cluster, datetime.now(UTC) - timedelta(hours=1))
        counts = {r.node: r.incidents for r in rows}
        assert counts == {"n2": 3, "n1": 1, "n3": 1, "n4": 1}
        n2 = rows[0]
        assert n2.node == "n2" and n2.jobs == 3
        assert sorted(n2.categories) == ["gpu_hardware", "hang", "unknown"]
        later = await store.node_reputation(cluster, datetime.now(UTC) + timedelta(minutes=1))
        assert later == []
    finally:
        await store.close()
