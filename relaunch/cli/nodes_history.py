"""`relaunch nodes history NODE`: one node's history, and what `relaunch nodes` shows of what
other systems said of each node (drains Relaunch did not make, health events pushed in)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from relaunch.cli.exits import fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.terminal import printable
from relaunch.connectors.audit import IncidentRow, StoredEvent
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import history_nodes
from relaunch.models.names import node_name

OUTSIDE_LISTED = 5  # a node's latest rows from outside Relaunch in `relaunch nodes --json`
_LABELS = {"external_drain": "drained outside Relaunch", "health_event": "health event"}


def by_node(rows: list[StoredEvent]) -> dict[str, list[StoredEvent]]:
    """Rows from outside Relaunch by the node they name, oldest first."""
    out: dict[str, list[StoredEvent]] = {}
    for row in rows:
        for node in history_nodes(row.nodes):
            out.setdefault(node, []).append(row)
    return out


def outside_json(rows: list[StoredEvent]) -> list[dict[str, object]]:
    return [
        {"kind": r.kind, "at": r.at.isoformat(), "actor": r.actor, "summary": r.summary}
        for r in rows[-OUTSIDE_LISTED:]
    ]


def outside_text(rows: list[StoredEvent]) -> str:
    """The latest row from outside Relaunch, in a few words (``relaunch nodes``)."""
    if not rows:
        return ""
    last = rows[-1]
    more = f" (+{len(rows) - 1} more)" if len(rows) > 1 else ""
    label = _LABELS.get(last.kind, last.kind)
    return f"[{label} {last.at:%m-%d %H:%M}{more}: {printable(last.summary)[:70]}]  "


def _line(at: datetime, what: str, summary: str) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}  {what:<26} {printable(summary)[:160]}"


@click.command("history")
@click.argument("node")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@click.option("--window-hours", type=float, default=168.0, show_default=True, help="How far back.")
@config_options
def history_cmd(
    node: str,
    as_json: bool,
    window_hours: float,
    config_path: Path | None,
    cluster: str,
    state_dir: Path,
) -> None:
    """NODE's history, oldest first: the incidents that named it, its lifecycles' stages and
    checks, drains of it that Relaunch did not make (NHC, an admin) and health events other
    systems pushed in about it."""
    from relaunch.connectors.audit import AuditStore

    async def go() -> tuple[list[IncidentRow], list[StoredEvent]]:
        config = load_config(config_path, cluster, state_dir)
        name = node_name(node)
        since = datetime.now(UTC) - timedelta(hours=window_hours)
        store = await AuditStore.open(config.database_url, timeout=5)
        try:
            incidents = await store.incidents(cluster=config.name, node=name, since=since)
            rows = await store.node_lifecycle_events(config.name, name, since)
            rows += await store.outside_events(config.name, since, nodes=[name])
        finally:
            await store.close()
        return incidents, rows

    try:
        incidents, rows = asyncio.run(go())
    except RelaunchError as exc:
        fail(exc)
    timeline: list[tuple[datetime, dict[str, object], str]] = []
    for inc in incidents:
        what = f"incident {inc.category or '-'}"
        text = f"{inc.id} (job {inc.job_id or '-'}, {inc.stage or '-'})"
        record: dict[str, object] = {
            "at": inc.created_at.isoformat(),
            "kind": "incident",
            "incident": inc.id,
        }
        timeline.append((inc.created_at, record, _line(inc.created_at, what, text)))
    for row in rows:
        what = _LABELS.get(row.kind, row.kind)
        if row.kind == "health_event" and not row.data.get("trusted"):
            what += " (untrusted)"
        record = {
            "at": row.at.isoformat(),
            "kind": row.kind,
            "incident": row.incident_id,
            "actor": row.actor,
            "summary": row.summary,
        }
        timeline.append((row.at, record, _line(row.at, what, row.summary)))
    timeline.sort(key=lambda t: t[0])
    for _, record, text in timeline:
        click.echo(json.dumps(record) if as_json else text)
    if not timeline and not as_json:
        click.echo(f"nothing recorded about {node} in the last {window_hours:g} h")
