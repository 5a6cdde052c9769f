"""Retention of the audit trail: `relaunch audit purge` and `relaunch audit maintain`.

The trail lives in monthly partitions of ``audit_events`` (audit migration 6). A purge deletes
the incidents of one cluster that are wholly older than a date (created before it, no row at
or after it) with their rows, their dedupe keys and their bundles on disk, and the rows of the
cluster's placeholder incidents (``intake-``, ``rollout-``) older than the date. A month whose
rows may all go is dropped whole (``audit_drop_partition``, run as the owner); the rest goes
in batches, each its own transaction, so that a purge interrupted is finished by running it
again. Each purge writes a ``started`` and a ``done`` row to ``audit_purges``, which nothing
deletes. Only a role granted DELETE (``relaunch setup db --print-grants ROLE --purge``) that
says so for its transaction gets past the append-only trigger.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection

from relaunch.connectors.audit import SCHEMA_VERSION, schema_version
from relaunch.connectors.db_setup import connect_database
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import intake_incident
from relaunch.models.names import person
from relaunch.models.rollout import rollout_incident

# A purge never reaches this close to now: a mistyped date cannot erase the recent trail.
MIN_AGE = timedelta(days=30)
BATCH_INCIDENTS = 500  # incidents deleted per transaction
BATCH_ROWS = 5000  # placeholder rows deleted per transaction
PARTITION_RE = re.compile(r"audit_events_p(\d{4})(\d{2})")

# The incidents wholly older than the date: created before it, no row at or after it. A
# cluster's kill-switch record (``control-<cluster>``: its latest row is whether the cluster is
# paused) is never purged, and a month that holds any of it is never dropped whole.
_VICTIMS = """
    select i.id from incidents i
    where i.cluster = %(cluster)s and i.created_at < %(before)s
      and i.id <> all(%(placeholders)s)
      and i.id not like 'control-%%'
      and not exists (select 1 from audit_events e
                      where e.incident_id = i.id and e.at >= %(before)s)
    order by i.id
"""

# What a month holds that must stay (the check audit_drop_partition makes; read through the
# table, which the purge role may read, not the partition).
_MONTH_BLOCKED = """
    select exists (select 1 from (select distinct incident_id from audit_events
                                  where at >= %(lo)s and at < %(hi)s) p
                   join incidents i on i.id = p.incident_id
                   where i.cluster <> %(cluster)s
                      or i.id like 'control-%%'
                      or (i.id not like 'intake-%%' and i.id not like 'rollout-%%'
                          and exists (select 1 from audit_events e
                                      where e.incident_id = i.id and e.at >= %(before)s)))
"""


# Delete the audit rows ``which`` selects (a fixed SQL condition of this module, never input)
# with their dedupe keys; the count deleted.
_DELETE_ROWS = (
    "with gone as (delete from audit_events where {which} returning dedupe_key),"
    " keys as (delete from audit_dedupe d using gone"
    "  where d.dedupe_key = gone.dedupe_key returning 1)"
    " select count(*) from gone"
)


class RetentionError(RelaunchError):
    """A purge or a maintenance step cannot run; a person must act."""


@dataclass
class PurgeReport:
    """What a purge did (or, dry, would do)."""

    cluster: str
    before: datetime
    by: str
    dry_run: bool
    incidents: int = 0
    rows: int = 0
    partitions: list[str] = field(default_factory=list)
    bundles: int = 0
    partitions_made: int = 0

    def lines(self) -> list[str]:
        would = "would delete" if self.dry_run else "deleted"
        dropped = ", ".join(self.partitions) or "none"
        return [
            f"cluster {self.cluster}: {would} {self.incidents} incident(s) wholly older than "
            f"{self.before.isoformat()}, {self.rows} audit row(s), {self.bundles} bundle(s)",
            f"whole months {'to drop' if self.dry_run else 'dropped'}: {dropped}",
            *(
                []
                if self.dry_run
                else [f"recorded in audit_purges as purged by {self.by}"]
                + ([f"made {self.partitions_made} partition(s) ahead"] * bool(self.partitions_made))
            ),
        ]


def parse_before(text: str, *, now: datetime | None = None) -> datetime:
    """``--before``: a date (midnight UTC) or an ISO time with its zone, at least
    ``MIN_AGE`` in the past."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            when = datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        else:
            when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise RetentionError(
            f"--before {text!r} is not a date (YYYY-MM-DD) nor an ISO time"
        ) from exc
    if when.tzinfo is None:
        raise RetentionError(f"--before {text!r}: give the time zone (e.g. +00:00) or a date")
    latest = (now or datetime.now(UTC)) - MIN_AGE
    if when > latest:
        raise RetentionError(
            f"--before {text!r} is less than {MIN_AGE.days} days ago: a purge keeps at least "
            "the last 30 days"
        )
    return when


def retention_before(retention_days: int | None, *, now: datetime | None = None) -> datetime:
    """The cut-off of a scheduled purge: ``audit.retention_days`` ago."""
    if retention_days is None:
        raise RetentionError(
            "no --before and no audit.retention_days in the configuration: nothing to purge by",
            hint="set audit.retention_days (30..36500) or pass --before DATE",
        )
    return (now or datetime.now(UTC)) - timedelta(days=retention_days)


def check_by(by: str) -> str:
    """``--by``: who purges, as the record names them."""
    return person(by, "purges", RetentionError)


def month_end(partition: str) -> datetime | None:
    """The end (exclusive, UTC) of a monthly partition's range; None for another name."""
    m = PARTITION_RE.fullmatch(partition)
    if not m:
        return None
    year, month = int(m.group(1)), int(m.group(2))
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def bundle_path(bundle_dir: Path, incident_id: str) -> Path | None:
    """An incident's bundle directory inside ``bundle_dir`` (None for an id that would
    leave it)."""
    if not incident_id or "/" in incident_id or incident_id in (".", "..") or "\0" in incident_id:
        return None
    return bundle_dir / incident_id


def remove_bundles(bundle_dir: Path, incident_ids: Sequence[str]) -> int:
    """Delete these incidents' bundles; how many there were."""
    removed = 0
    for incident in incident_ids:
        path = bundle_path(bundle_dir, incident)
        if path is None or not path.is_dir() or path.is_symlink():
            continue
        shutil.rmtree(path)
        removed += 1
    return removed


async def _ready(conn: AsyncConnection[Any]) -> None:
    version = await schema_version(conn)
    if version < 6:
        raise RetentionError(
            f"the audit schema is at version {version}: retention needs version 6 or later "
            f"(this Relaunch needs {SCHEMA_VERSION})",
            hint="run `relaunch db migrate` as the owner role first",
        )


async def _months(conn: AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(
        "select c.relname from pg_inherits h join pg_class c on c.oid = h.inhrelid"
        " where h.inhparent = 'audit_events'::regclass order by 1"
    )
    return [str(r[0]) for r in await cur.fetchall() if PARTITION_RE.fullmatch(str(r[0]))]


async def ensure_partitions(conn: AsyncConnection[Any], months_ahead: int) -> int:
    cur = await conn.execute("select audit_ensure_partitions(%s)", (months_ahead,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def maintain(database_url: str, months_ahead: int) -> int:
    """Make this month's partition and the next ``months_ahead``; how many were new."""
    conn = await connect_database(database_url)
    try:
        await _ready(conn)
        return await ensure_partitions(conn, months_ahead)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise RetentionError(
            f"this role may not make audit partitions: {exc.diag.message_primary or exc}",
            hint="run it as the purge role (`relaunch setup db --print-grants ROLE --purge`) "
            "or the owner",
        ) from exc
    finally:
        await conn.close()


async def purge(
    database_url: str,
    *,
    cluster: str,
    before: datetime,
    by: str,
    bundle_dir: Path,
    dry_run: bool = False,
    months_ahead: int = 3,
) -> PurgeReport:
    """Delete ``cluster``'s incidents wholly older than ``before`` (see the module)."""
    report = PurgeReport(cluster=cluster, before=before, by=by, dry_run=dry_run)
    placeholders = [intake_incident(cluster), rollout_incident(cluster)]
    conn = await connect_database(database_url)
    try:
        await _ready(conn)
        cur = await conn.execute(
            _VICTIMS, {"cluster": cluster, "before": before, "placeholders": placeholders}
        )
        victims = [str(r[0]) for r in await cur.fetchall()]
        months = [m for m in await _months(conn) if (month_end(m) or before) <= before]
        if dry_run:
            return await _dry(conn, report, victims, placeholders, months)
        report.partitions_made = await ensure_partitions(conn, months_ahead)
        await conn.execute(
            "insert into audit_purges (by, cluster, before, phase) values (%s, %s, %s, 'started')",
            (by, cluster, before),
        )
        for month in months:
            cur = await conn.execute(
                "select audit_drop_partition(%s, %s, %s)", (month, before, cluster)
            )
            row = await cur.fetchone()
            if row and int(row[0]) >= 0:
                report.partitions.append(month)
                report.rows += int(row[0])
        report.rows += await _delete_placeholder_rows(conn, placeholders, before)
        for start in range(0, len(victims), BATCH_INCIDENTS):
            gone, rows = await _delete_incidents(
                conn, victims[start : start + BATCH_INCIDENTS], before
            )
            report.incidents += len(gone)
            report.rows += rows
            report.bundles += remove_bundles(bundle_dir, gone)
        await conn.execute(
            "insert into audit_purges (by, cluster, before, phase, incidents, rows, partitions,"
            " bundles) values (%s, %s, %s, 'done', %s, %s, %s, %s)",
            (by, cluster, before, report.incidents, report.rows, report.partitions, report.bundles),
        )
        return report
    except psycopg.errors.InsufficientPrivilege as exc:
        raise RetentionError(
            f"this role may not purge the audit trail: {exc.diag.message_primary or exc}",
            hint="run it as the purge role: `relaunch setup db --print-grants ROLE --purge`",
        ) from exc
    finally:
        await conn.close()


async def _dry(
    conn: AsyncConnection[Any],
    report: PurgeReport,
    victims: list[str],
    placeholders: list[str],
    months: list[str],
) -> PurgeReport:
    cur = await conn.execute(
        "select count(*) from audit_events where at < %s"
        " and (incident_id = any(%s) or incident_id = any(%s))",
        (report.before, victims, placeholders),
    )
    row = await cur.fetchone()
    report.rows = int(row[0]) if row else 0
    report.incidents = len(victims)
    for month in months:
        hi = month_end(month)
        assert hi is not None  # _months lists only monthly partitions
        lo = (hi - timedelta(days=1)).replace(day=1)
        cur = await conn.execute(
            _MONTH_BLOCKED,
            {"cluster": report.cluster, "before": report.before, "lo": lo, "hi": hi},
        )
        row = await cur.fetchone()
        if row and not row[0]:
            report.partitions.append(month)
    return report


async def _delete_placeholder_rows(
    conn: AsyncConnection[Any], placeholders: list[str], before: datetime
) -> int:
    total = 0
    while True:
        async with conn.transaction():
            await conn.execute("select set_config('relaunch.purge', 'on', true)")
            cur = await conn.execute(
                _DELETE_ROWS.format(
                    which="(id, at) in (select id, at from audit_events"
                    " where incident_id = any(%(ids)s) and at < %(before)s limit %(limit)s)"
                ),
                {"ids": placeholders, "before": before, "limit": BATCH_ROWS},
            )
            row = await cur.fetchone()
        n = int(row[0]) if row else 0
        total += n
        if n < BATCH_ROWS:
            return total


async def _delete_incidents(
    conn: AsyncConnection[Any], ids: list[str], before: datetime
) -> tuple[list[str], int]:
    """Delete these incidents' rows (older than ``before``; a row written meanwhile keeps its
    incident), their dedupe keys, then the incidents left without rows. The ids deleted and
    the rows."""
    async with conn.transaction():
        await conn.execute("select set_config('relaunch.purge', 'on', true)")
        cur = await conn.execute(
            _DELETE_ROWS.format(which="incident_id = any(%(ids)s) and at < %(before)s"),
            {"ids": ids, "before": before},
        )
        row = await cur.fetchone()
        rows = int(row[0]) if row else 0
        cur = await conn.execute(
            "delete from incidents i where i.id = any(%(ids)s) and not exists"
            " (select 1 from audit_events e where e.incident_id = i.id) returning i.id",
            {"ids": ids},
        )
        gone = [str(r[0]) for r in await cur.fetchall()]
        await conn.execute("delete from audit_dedupe where incident_id = any(%s)", (gone,))
    return gone, rows
