"""CLI commands of the recovery loop: worker, watch, approve/reject, incidents, show."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from relaunch.cli.exits import fail as _fail
from relaunch.cli.logs import log_options
from relaunch.cli.terminal import printable
from relaunch.connectors.audit import AuditStore, IncidentRow, StoredEvent
from relaunch.models.config import ClusterConfig
from relaunch.models.config_check import read_config
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import (
    Approval,
    RecoveryStatus,
    parse_recovery_id,
    same_attempt_ids,
)


def cluster_config_path(state_dir: Path, cluster: str) -> Path:
    return state_dir / "clusters" / f"{cluster}.json"


def load_config(config: Path | None, cluster: str, state_dir: Path) -> ClusterConfig:
    path = config or cluster_config_path(state_dir, cluster)
    if not path.is_file():
        raise RelaunchError(
            f"no configuration for cluster {cluster!r} at {path}",
            hint="pass --config FILE, or run `relaunch dev up` for the local cluster",
        )
    return read_config(path)  # every problem named, one `key.path: message` line each


def config_options(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Cluster configuration JSON.",
    )(fn)
    fn = click.option("--cluster", default="dev", show_default=True, help="Cluster name.")(fn)
    fn = click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path(".relaunch"),
        show_default=True,
        help="Where `relaunch dev up` keeps cluster configurations.",
    )(fn)
    return fn


def _logging(label: str | None = None, fmt: str = "text", level: str = "info") -> None:
    """Log to stderr (relaunch/cli/logs.py); ``label`` (e.g. ``worker[2/4]``) names the
    process in each line."""
    from relaunch.cli.logs import setup

    setup(label, fmt, level)


# The pool logs each failed connection attempt; the CLI reports the outcome in one line instead.
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


PROCESSES_ENV = "RELAUNCH_WORKER_PROCESSES"

PAST = {"approve": "approved", "reject": "rejected"}


def register(cli: click.Group) -> None:
    def _serve(
        run: Callable[[ClusterConfig], Coroutine[Any, Any, None]],
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        label: str | None = None,
        log: tuple[str, str] = ("text", "info"),
    ) -> None:
        try:
            config = load_config(config_path, cluster, state_dir)
            _logging(label, *log)
            asyncio.run(run(config))
        except RelaunchError as exc:
            _fail(exc)

    @cli.command("worker")
    @config_options
    @log_options
    @click.option(
        "--processes",
        type=click.IntRange(1, 64),
        default=1,
        show_default=True,
        envvar=PROCESSES_ENV,
        show_envvar=True,
        help="Worker processes to run, each with its own event loop on the cluster's task "
        "queue: one per core, up to the cores of the host. With more than one, this process "
        "supervises them (restarts one that dies, forwards SIGTERM and SIGINT).",
    )
    def worker_cmd(
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        processes: int,
        log_format: str,
        log_level: str,
    ) -> None:
        """Run the Temporal worker that executes recoveries for one cluster. With
        metrics.worker_address set, it serves /metrics (the Temporal SDK's series and its own)
        and /healthz there (docs/metrics.md)."""
        log = (log_format, log_level)
        if processes == 1:
            from relaunch.workers.supervisor import CHILD_ENV, PARENT_ENV, watch_parent
            from relaunch.workers.worker import run_worker

            # Set when a supervisor started this process: which child it is, and the parent.
            child = os.environ.get(CHILD_ENV, "")
            parent = os.environ.get(PARENT_ENV, "")
            label = f"worker[{child}]" if re.fullmatch(r"\d+/\d+", child) else None
            if label and parent.isdigit():
                watch_parent(int(parent))
            _serve(run_worker, config_path, cluster, state_dir, label, log)
            return
        _supervise(config_path, cluster, state_dir, processes, log)

    def _supervise(
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        processes: int,
        log: tuple[str, str],
    ) -> None:
        """Run ``processes`` copies of `relaunch worker --processes 1` until SIGTERM or SIGINT."""
        from relaunch.workers.supervisor import Supervisor

        path = config_path or cluster_config_path(state_dir, cluster)
        try:
            load_config(path, cluster, state_dir)  # a bad configuration fails here, once
        except RelaunchError as exc:
            _fail(exc)
        _logging(None, *log)
        argv = [
            sys.executable, "-m", "relaunch.cli", "worker",
            "--config", str(path.resolve()), "--cluster", cluster,
            "--state-dir", str(state_dir.resolve()),
            "--log-format", log[0], "--log-level", log[1], "--processes", "1",
        ]  # fmt: skip
        env = {**os.environ, PROCESSES_ENV: "1"}
        sys.exit(Supervisor(argv, processes, env=env).run())

    @cli.command("watch")
    @config_options
    @log_options
    def watch_cmd(
        config_path: Path | None, cluster: str, state_dir: Path, log_format: str, log_level: str
    ) -> None:
        """Watch one cluster's jobs and start (or join) a recovery for each interruption. With
        metrics.watch_address set, it serves /metrics and /healthz there (docs/metrics.md)."""
        from relaunch.workers.watch_main import run_watch

        _serve(run_watch, config_path, cluster, state_dir, log=(log_format, log_level))

    def _decide(decision: str, incident: str, by: str, reason: str, config: ClusterConfig) -> None:
        from relaunch.connectors.temporal import connect
        from relaunch.workflows import recovery_client

        async def go() -> None:
            await refuse_other_cluster(config, incident)
            client = await connect(config)
            decided = await recovery_client.decide(
                client, incident, decision, Approval(by=by, reason=reason)
            )
            click.echo(outcome(decision, incident, by, decided))

        try:
            asyncio.run(go())
        except RelaunchError as exc:
            _fail(exc)

    for decision in ("approve", "reject"):

        @cli.command(
            decision,
            help=f"{decision.capitalize()} the plan an incident recommends (monitor mode), "
            "by the workflow's `decide` update. Refused, with the reason and a non-zero exit, "
            "when the incident awaits no decision.",
        )
        @click.argument("incident")
        @click.option("--by", required=True, help="Who decides (recorded in the audit trail).")
        @click.option("--reason", default="", help="Why (recorded).")
        @config_options
        def decide_cmd(
            incident: str,
            by: str,
            reason: str,
            config_path: Path | None,
            cluster: str,
            state_dir: Path,
            _decision: str = decision,
        ) -> None:
            try:
                config = load_config(config_path, cluster, state_dir)
            except RelaunchError as exc:
                _fail(exc)
            _decide(_decision, incident, by, reason, config)

    @cli.command("incidents")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
    @click.option("--job", default=None, help="Only this job id.")
    @click.option("--node", default=None, help="Only incidents that involve this node.")
    @click.option("--since", type=click.DateTime(), default=None, help="Only since this time.")
    @config_options
    def incidents_cmd(
        as_json: bool,
        job: str | None,
        node: str | None,
        since: datetime | None,
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
    ) -> None:
        """List incidents from the audit trail, newest first."""

        async def go() -> list[IncidentRow]:
            config = load_config(config_path, cluster, state_dir)
            store = await AuditStore.open(config.database_url, timeout=5)
            try:
                return await store.incidents(
                    cluster=config.name,
                    job_id=job,
                    node=node,
                    since=since.replace(tzinfo=since.tzinfo or UTC) if since else None,
                )
            finally:
                await store.close()

        try:
            rows = asyncio.run(go())
        except RelaunchError as exc:
            _fail(exc)
        for row in rows:
            # Rows carry what jobs and Slurm said: never an escape sequence to the terminal.
            if as_json:
                click.echo(printable(row.model_dump_json()))
            else:
                click.echo(
                    printable(
                        f"{row.id:<28} {row.created_at:%Y-%m-%d %H:%M:%S}  job {row.job_id:<6} "
                        f"{row.category or '-':<13} {row.stage or '-':<18} "
                        f"{','.join(row.nodes) or '-'}"
                    )
                )
        if not rows and not as_json:
            click.echo("no incidents")

    @cli.command("show")
    @click.argument("incident")
    @config_options
    def show_cmd(incident: str, config_path: Path | None, cluster: str, state_dir: Path) -> None:
        """Show one incident's timeline with per-stage durations and the Temporal UI link."""

        async def go() -> tuple[
            ClusterConfig, str, list[str], list[StoredEvent], dict[str, list[StoredEvent]]
        ]:
            config = load_config(config_path, cluster, state_dir)
            store = await AuditStore.open(config.database_url, timeout=5)
            try:
                await refuse_other_cluster(config, incident, store)
                meant, others = await resolve_incident(store, incident)
                events = await store.events(meant)
                # The node decisions the recovery joined: their drain is this job's isolation.
                joined = [
                    str(d)
                    for e in events
                    if e.kind == "node_decision" and isinstance(e.data.get("decisions"), dict)
                    for d in dict(e.data["decisions"]).values()  # type: ignore[call-overload]
                ]
                decisions = {d: await store.events(d) for d in dict.fromkeys(joined)}
                return config, meant, others, events, decisions
            finally:
                await store.close()

        try:
            config, meant, others, events, decisions = asyncio.run(go())
        except RelaunchError as exc:
            _fail(exc)
        if not events:
            _fail(RelaunchError(f"no incident {incident}", hint="`relaunch incidents` lists them"))
        click.echo(format_timeline(meant, events, config))
        for decision, rows in decisions.items():
            if rows:
                click.echo(f"\nnode decision {decision} (joined by this recovery):")
                click.echo(format_timeline(decision, rows, config))
        if others:
            click.echo(f"same job id and attempt, another job: {', '.join(others)}")


def outcome(decision: str, incident: str, by: str, decided: RecoveryStatus) -> str:
    """What `relaunch approve` / `relaunch reject` print once the recovery took the decision."""
    line = f"{PAST[decision]} {decided.incident_id or incident} as {by}"
    if decided.node_decision and decided.covers is not None:
        # One decision for every job the node took down.
        verb = "drains" if decision == "approve" else "does not drain"
        node = next(
            (n for n, d in decided.node_decisions.items() if d == decided.node_decision),
            "the node",
        )
        return (
            f"{line}\n  node decision {decided.node_decision} {verb} {node}; "
            f"it covers {decided.covers} job{'s' if decided.covers != 1 else ''}"
        )
    plan = decided.plan
    if plan is None:
        return line
    if decision == "approve":
        drain = f", drain {','.join(plan.drain_nodes)}" if plan.drain_nodes else ""
        return f"{line}\n  the recovery goes on: {plan.action.value}{drain}"
    return f"{line}\n  the recovery ends without acting on: {plan.action.value}"


class OtherClusterError(RelaunchError):
    """An incident (or node decision) id of another cluster than the configuration's."""


async def refuse_other_cluster(
    config: ClusterConfig, incident: str, store: AuditStore | None = None
) -> None:
    """Refuse an incident of another cluster than ``config``'s: a cluster's configuration (its
    credentials) acts on that cluster's incidents only. The audit trail says whose an incident
    is; an incident it does not know is judged by its id (``relaunch-<cluster>-…``)."""
    owner: str | None = None
    try:
        if store is None:
            opened = await AuditStore.open(config.database_url, timeout=5)
            try:
                info = await opened.incident_info(incident)
            finally:
                await opened.close()
        else:
            info = await store.incident_info(incident)
        owner = str(info["cluster"]) if info else None
    except RelaunchError:
        pass  # no audit trail to ask: the id alone decides
    if owner is None and not incident.startswith(f"relaunch-{config.name}-"):
        parsed = parse_recovery_id(incident)
        if parsed is None:
            raise OtherClusterError(
                f"{incident} is not an incident of cluster {config.name} "
                f"(its incidents are relaunch-{config.name}-…)",
                hint="`relaunch incidents --cluster NAME` lists a cluster's incidents",
            )
        owner = parsed[0]
    if owner is not None and owner != config.name:
        raise OtherClusterError(
            f"incident {incident} is of cluster {owner}, not of cluster {config.name} "
            "(the configuration in use)",
            hint=f"pass --cluster {owner} (or its --config) to act on it",
        )


async def resolve_incident(store: AuditStore, typed: str) -> tuple[str, list[str]]:
    """The incident a person means by ``typed``, and the others it could mean: where Slurm
    reused a job id, the recoveries of later jobs carry their submit time as a suffix
    (`relaunch-dev-26-0-20261203T051200Z`). An id that names an incident is that incident;
    an id without the suffix names the newest of them."""
    parsed = parse_recovery_id(typed)
    if parsed is None:
        return typed, []
    rows = await store.incidents(cluster=parsed[0], job_id=parsed[1])  # newest first
    ids = same_attempt_ids(typed, [r.id for r in rows])
    meant = typed if typed in ids or not ids else ids[0]
    return meant, [i for i in ids if i != meant]


def workflow_url(config: ClusterConfig, incident: str) -> str:
    ns = config.temporal_namespace
    return f"{config.temporal_ui}/namespaces/{ns}/workflows/{quote(incident, safe='')}"


def format_timeline(incident: str, events: list[StoredEvent], config: ClusterConfig) -> str:
    start = events[0].at
    lines = [f"incident {incident}"]
    prev = start
    for e in events:
        since_start = (e.at - start).total_seconds()
        step = (e.at - prev).total_seconds()
        prev = e.at
        who = f" [{e.actor}]" if e.actor != "relaunch" else ""
        # A summary may quote a job's log line: printed, it must not drive the terminal.
        lines.append(
            f"  {e.at:%H:%M:%S.%f}"[:-3]
            + f"  +{since_start:7.2f}s (Δ{step:6.2f}s)  "
            + printable(f"{e.kind:<9}{who} {e.summary}")
        )
    lines.append(f"Temporal UI: {workflow_url(config, incident)}")
    return "\n".join(lines)


__all__ = ["register", "load_config", "cluster_config_path", "format_timeline", "json"]
