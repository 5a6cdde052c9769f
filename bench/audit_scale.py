"""Benchmark `/metrics` and the incident list at 1,000,000 audit rows, before and after the
retention schema (audit migration 6) and the console's incremental counters.

Fills a private embedded PostgreSQL (or the empty database RELAUNCH_DATABASE_URL names) with
realistic recoveries (bench/console.py's rows: every kind a recovery writes) at the schema
before migration 6, replicated by SQL (generate_series) over twelve months to --rows rows.
Before: times the old scrape (every series aggregated over the whole table, the SQL the console
ran at each scrape) and the incident list (the store's query). Then runs migration 6 (timed:
the copy into monthly partitions). After: the same two, plus, through the console in-process
(httpx over ASGI), the first `/metrics` scrape (it reads the trail once), later scrapes with
new rows appended between them, the incidents page fragment and `/api/v1/incidents`.
Writes bench/results/audit_scale.json and audit_scale.md.

    .venv/bin/python bench/audit_scale.py [--rows 1000000] [--scrapes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.console import CLUSTER, COLUMNS, _incident_rows  # noqa: E402
from relaunch.connectors import audit_schema  # noqa: E402
from relaunch.connectors.audit import AuditStore, migrate  # noqa: E402
from relaunch.console.app import create_app  # noqa: E402
from relaunch.console.auth import ConsoleRole, write_tokens  # noqa: E402
from relaunch.console.metrics import SCOPED_SNAPSHOT_SQL  # noqa: E402
from relaunch.console.queries import ConsoleDb  # noqa: E402
from relaunch.devstack import services  # noqa: E402
from relaunch.models.config import ClusterConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BASE_INCIDENTS = 4000


async def _migrate(url: str, upto: int) -> float:
    saved = list(audit_schema.MIGRATIONS)
    audit_schema.MIGRATIONS[:] = [m for m in saved if m[0] <= upto]
    try:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        t0 = time.perf_counter()
        await migrate(conn)
        await conn.execute("analyze")
        await conn.close()
        return time.perf_counter() - t0
    finally:
        audit_schema.MIGRATIONS[:] = saved


def seed(url: str, rows_wanted: int, rng: random.Random) -> tuple[int, int, int]:
    """BASE_INCIDENTS recoveries over 30 days by COPY, then copies of them shifted back month
    by month (generate_series) until ``rows_wanted`` rows; (incidents, rows, months)."""
    now = datetime.now(UTC)
    span = timedelta(days=30).total_seconds()
    inc_rows, event_rows = [], []
    for i in range(BASE_INCIDENTS):
        start = now - timedelta(seconds=span * (1 - (i + 1) / BASE_INCIDENTS) + 60)
        job = str(100000 + i // 3)
        incident = f"relaunch-{CLUSTER}-{job}-{i % 3}"
        still_open = i >= BASE_INCIDENTS - 40
        open_stage = rng.choice(["awaiting_approval", "verifying"]) if still_open else None
        inc_rows.append((incident, CLUSTER, job, i % 3, start))
        event_rows += _incident_rows(rng, incident, job, start, open_stage=open_stage)
    copies = max(1, -(-rows_wanted // len(event_rows)) - 1)
    with psycopg.connect(url, autocommit=False) as conn, conn.cursor() as cur:
        with cur.copy("copy incidents (id, cluster, job_id, attempt, created_at) from stdin") as cp:
            for r in inc_rows:
                cp.write_row(r)
        with cur.copy(f"copy audit_events ({', '.join(COLUMNS)}) from stdin") as cp:
            for r in event_rows:
                cp.write_row(r)
        # Copy g goes back g months (30 days): the older copies are closed recoveries (the
        # still-open ones are only the newest's).
        cur.execute(
            "insert into incidents (id, cluster, job_id, attempt, created_at)"
            " select i.id || '-m' || g, i.cluster, i.job_id || g, i.attempt,"
            " i.created_at - g * interval '30 days'"
            " from incidents i, generate_series(1, %s) g",
            (copies,),
        )
        cur.execute(
            f"insert into audit_events ({', '.join(COLUMNS)})"
            " select e.incident_id || '-m' || g, e.kind, e.at - g * interval '30 days', e.actor,"
            " case when e.stage in ('awaiting_approval', 'verifying') then 'done' else e.stage"
            " end, e.nodes, e.summary, e.data, e.dedupe_key || '-m' || g"
            " from audit_events e, generate_series(1, %s) g"
            " where e.incident_id not like '%%-m%%' order by g desc, e.id",
            (copies,),
        )
        cur.execute("select (select count(*) from incidents), (select count(*) from audit_events)")
        counts = cur.fetchone()
        conn.commit()
    assert counts is not None
    return int(counts[0]), int(counts[1]), copies + 1


async def _timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 1),
        "max_ms": round(ordered[-1], 1),
    }


async def direct(url: str, repeat: int) -> dict[str, Any]:
    """The old scrape's SQL and the store's incident list, on whatever schema is there."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url, min_size=1, max_size=2, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True)
    store = AuditStore(pool)  # no schema check: the "before" database is older than this code
    try:

        async def scrape() -> None:
            async with pool.connection() as conn:
                await conn.execute(SCOPED_SNAPSHOT_SQL, {"clusters": [CLUSTER]})

        async def listing() -> None:
            await store.incidents(cluster=CLUSTER, limit=100)

        db = ConsoleDb(url)
        await db.start()
        db._schema_checked = True  # noqa: SLF001  # the "before" database is older than this code
        try:
            return {
                "metrics_full_aggregate": _stats(await _timed(scrape, repeat)),
                "incident_list_store": _stats(await _timed(listing, repeat)),
                "console_open_incidents": _stats(await _timed(db.open_incidents, repeat)),
                "console_recent_incidents": _stats(await _timed(db.recent_incidents, repeat)),
                "console_pending_approvals": _stats(await _timed(db.pending_approvals, repeat)),
            }
        finally:
            await db.close()
    finally:
        await pool.close()


async def console(url: str, tmp: Path, scrapes: int) -> dict[str, Any]:
    """The console in-process: /metrics first and later (new rows between), the lists."""
    tokens = write_tokens(tmp / "tokens.json", [("bench", ConsoleRole.ADMIN)])
    config = ClusterConfig(name=CLUSTER, database_url=url, bundle_dir=str(tmp / "bundles"))
    app = create_app(config, tokens_file=tmp / "tokens.json", secret="bench-secret-0123456789")
    headers = {"authorization": f"Bearer {tokens['bench']}"}
    store = await AuditStore.open(url)
    out: dict[str, Any] = {}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console", headers=headers
        ) as client,
    ):

        async def get(path: str) -> None:
            r = await client.get(path)
            if r.status_code != 200:
                raise SystemExit(f"{path}: HTTP {r.status_code}: {r.text[:300]}")

        t0 = time.perf_counter()
        await get("/metrics")
        out["metrics_first_scrape_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        incident = f"relaunch-{CLUSTER}-bench-new"
        await store.ensure_incident(incident, CLUSTER, "999999", 0)
        later: list[float] = []
        for n in range(scrapes):
            for k in range(100):  # 100 new rows between scrapes
                await store.record(
                    _new_row(incident, n * 100 + k), dedupe_key=f"{incident}:{n}:{k}"
                )
            await asyncio.sleep(5.1)  # past the snapshot's 5 s reuse
            later += await _timed(lambda: get("/metrics"), 1)
        out["metrics_later_scrapes_100_new_rows"] = _stats(later)
        out["incidents_fragment"] = _stats(await _timed(lambda: get("/fragments/incidents"), 10))
        out["api_v1_incidents"] = _stats(await _timed(lambda: get("/api/v1/incidents"), 10))
    await store.close()
    return out


def _new_row(incident: str, n: int) -> Any:
    from relaunch.models.recovery import AuditRecord

    kind = "detection" if n % 2 else "action"
    data = {"source": "job_log", "detection_latency_s": 0.3} if n % 2 else {"step": "drain"}
    return AuditRecord(incident_id=incident, kind=kind, at=datetime.now(UTC), data=data)


def write_report(data: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "audit_scale.json").write_text(json.dumps(data, indent=2) + "\n")
    b, a, c = data["before"], data["after"], data["console"]
    lines = [
        "# Audit trail at scale: /metrics and the incident list",
        "",
        f"`bench/audit_scale.py` on {data['host']} ({data['cpus']} CPUs), "
        f"{data['when']}: **{data['rows']:,} audit rows, {data['incidents']:,} incidents** over "
        f"{data['months']} months (seeded in {data['seed_s']} s). Raw numbers: "
        "[audit_scale.json](audit_scale.json).",
        "",
        "| measurement | before (schema 5, whole-table scrape) | after (schema 6, counters) |",
        "|---|---:|---:|",
        f"| /metrics, SQL aggregate over the trail (p50) | {b['metrics_full_aggregate']['p50_ms']}"
        f" ms | {a['metrics_full_aggregate']['p50_ms']} ms (no longer run per scrape) |",
        f"| /metrics, first scrape of a console (reads the trail once) | — | "
        f"{c['metrics_first_scrape_ms']} ms |",
        f"| /metrics, later scrapes, 100 new rows each (p50 / max) | "
        f"{b['metrics_full_aggregate']['p50_ms']} ms (every scrape) | "
        f"{c['metrics_later_scrapes_100_new_rows']['p50_ms']} / "
        f"{c['metrics_later_scrapes_100_new_rows']['max_ms']} ms |",
        f"| incident list, the store's query (p50) | {b['incident_list_store']['p50_ms']} ms | "
        f"{a['incident_list_store']['p50_ms']} ms |",
        *[
            f"| console query `{q}` (p50) | {b['console_' + q]['p50_ms']} ms | "
            f"{a['console_' + q]['p50_ms']} ms |"
            for q in ("open_incidents", "recent_incidents", "pending_approvals")
        ],
        f"| `/fragments/incidents` (p50) | — | {c['incidents_fragment']['p50_ms']} ms |",
        f"| `/api/v1/incidents` (p50) | — | {c['api_v1_incidents']['p50_ms']} ms |",
        "",
        f"Migration 6 on this trail (copy into monthly partitions, indexes rebuilt): "
        f"{data['migration_6_s']} s.",
        "",
    ]
    (RESULTS / "audit_scale.md").write_text("\n".join(lines))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--report", action="store_true", help="write bench/results/audit_scale.*")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="relaunch-bench-audit-"))
    external = os.environ.get("RELAUNCH_DATABASE_URL")
    try:
        url = external or services.start_postgres(tmp / "postgres")
        before_6 = max(v for v, _ in audit_schema.MIGRATIONS if v < 6)
        await _migrate(url, before_6)
        t0 = time.perf_counter()
        incidents, rows, months = seed(url, args.rows, random.Random(7))
        seed_s = round(time.perf_counter() - t0, 1)
        await _migrate(url, before_6)  # analyze
        print(f"seeded {incidents} incidents, {rows} rows in {seed_s} s", flush=True)
        before = await direct(url, args.repeat)
        print("before:", before, flush=True)
        migration_s = round(await _migrate(url, 6), 1)
        print(f"migration 6: {migration_s} s", flush=True)
        after = await direct(url, args.repeat)
        print("after:", after, flush=True)
        measured = await console(url, tmp, args.scrapes)
        print("console:", measured, flush=True)
        data = {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "when": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "rows": rows,
            "incidents": incidents,
            "months": months,
            "seed_s": seed_s,
            "before": before,
            "migration_6_s": migration_s,
            "after": after,
            "console": measured,
        }
        print(json.dumps(data, indent=2))
        if args.report:
            write_report(data)
            print(f"report: {RESULTS / 'audit_scale.md'}")
    finally:
        if not external:
            services.stop_postgres(tmp / "postgres")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
