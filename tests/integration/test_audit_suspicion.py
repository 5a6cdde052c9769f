"""The audit trail's memory of suspicion on the real PostgreSQL: which users' jobs named a node
by their output alone (cross-user corroboration, docs/trust.md), and the reputation that counts
only trusted evidence."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from relaunch.connectors.audit import AuditStore
from relaunch.models.recovery import AuditRecord


async def test_suspicions_list_the_distinct_users_whose_jobs_named_a_node(
    database_url: str,
) -> None:
    store = await AuditStore.open(database_url)
    cluster = f"sus{uuid.uuid4().hex[:6]}"
    verdicts: list[tuple[str, str, list[str]]] = [
        ("1", "ana", ["n2"]),
        ("2", "ana", ["n2", "n3"]),  # the same user again: one voice
        ("3", "bo", ["n2"]),
        ("4", "", ["n3"]),  # whose job is unknown: does not count
        ("5", "cy", []),  # corroborated culprits: no suspects
    ]
    try:
        for job, user, suspects in verdicts:
            inc = f"relaunch-{cluster}-{job}-0"
            await store.ensure_incident(inc, cluster, job, 0)
            await store.record(
                AuditRecord(
                    incident_id=inc,
                    kind="verdict",
                    at=datetime.now(UTC),
                    data={"category": "network", "suspects": suspects, "user": user},
                )
            )
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        rows = {r.node: r for r in await store.suspicions(cluster, hour_ago)}
        assert sorted(rows) == ["n2", "n3"]
        assert rows["n2"].users == ["ana", "bo"] and rows["n2"].incidents == 3
        assert rows["n3"].users == ["ana"] and rows["n3"].incidents == 1
        later = datetime.now(UTC) + timedelta(minutes=1)
        assert await store.suspicions(cluster, later) == []
        assert await store.suspicions(f"{cluster}x", hour_ago) == []
    finally:
        await store.close()
