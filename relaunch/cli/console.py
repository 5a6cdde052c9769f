"""`relaunch console`: serve the Recovery Console for one cluster, or for several clusters that
share one PostgreSQL and one Temporal (`--cluster-config`, repeatable)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click
from temporalio.client import Client

from relaunch.cli.exits import fail as _fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.logs import log_options
from relaunch.connectors.audit import refuse_behind_schema
from relaunch.connectors.slurm.factory import slurm_scheduler
from relaunch.console.auth import ConsoleRole
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import RepairReturn
from relaunch.models.recovery import Approval, Detection

if TYPE_CHECKING:
    from relaunch.console.web import Services

HEALTH_TIMEOUT_S = 3.0  # the console's /healthz: how long Temporal has to answer


class TemporalDecider:
    """Sends approve/reject through `recovery_client.decide` (the CLI's own path), pushed-in
    detections and repair callbacks; connects on first use, so that the console serves pages
    while Temporal is down."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def _connected(self) -> Client:
        from relaunch.connectors.temporal import connect

        async with self._lock:
            if self._client is None:
                self._client = await connect(self._config)
            return self._client

    async def check_health(self) -> None:
        """Raise unless the Temporal frontend answers its health check within a few seconds."""
        client = await asyncio.wait_for(self._connected(), timeout=HEALTH_TIMEOUT_S)
        await client.service_client.check_health(timeout=timedelta(seconds=HEALTH_TIMEOUT_S))

    async def __call__(self, incident: str, decision: str, approval: Approval) -> object:
        from relaunch.workflows import recovery_client

        client = await self._connected()
        return await recovery_client.decide(client, incident, decision, approval)

    async def deliver(self, det: Detection) -> bool:
        """A pushed-in detection (the console's intake): signal-with-start, as the watcher."""
        from relaunch.workflows import recovery_client

        client = await self._connected()
        return await recovery_client.start_or_join(client, self._config, det)

    async def repaired(self, node: str, repair: RepairReturn) -> str:
        """A repair callback (the console's intake): signal `returned` to the node's lifecycle
        that waits for its repair, as `relaunch nodes returned`; that lifecycle's id."""
        from relaunch.workflows import recovery_client

        client = await self._connected()
        return await recovery_client.signal_repaired(client, self._config.name, node, repair)


def cluster_services(config: ClusterConfig) -> Services:
    """What acts on one cluster: its own Temporal decider and delivery, its own Slurm."""
    from relaunch.console.web import Services

    temporal = TemporalDecider(config)
    return Services(
        decide=temporal,
        scheduler=slurm_scheduler(config),
        deliver=temporal.deliver,
        repaired=temporal.repaired,
        temporal_health=temporal.check_health,
    )


def register(cli: click.Group) -> None:
    @cli.group("console", invoke_without_command=True)
    @config_options
    @log_options
    @click.option(
        "--cluster-config",
        "cluster_configs",
        multiple=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Another cluster's configuration JSON to serve as well (repeatable); every "
        "cluster must share the database_url and temporal_address of --config.",
    )
    @click.option("--host", default=None, help="Listen address (default: console.host, 127.0.0.1).")
    @click.option(
        "--port", type=click.IntRange(1, 65535), default=None, help="Port (default 8400)."
    )
    @click.pass_context
    def console_cmd(
        ctx: click.Context,
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        cluster_configs: tuple[Path, ...],
        host: str | None,
        port: int | None,
        log_format: str,
        log_level: str,
    ) -> None:
        """Serve the Recovery Console: incidents, approvals, nodes, jobs and the audit trail;
        the intake routes (Alertmanager, Slurm hooks, health events), /metrics, and the
        notifier (when the configuration names notify channels). With --cluster-config, one
        console serves several clusters; the first (--config) gives the console's own settings.
        `relaunch console token NAME --role ROLE` adds a token to its tokens file."""
        if ctx.invoked_subcommand is not None:
            return
        import uvicorn

        from relaunch.cli.incidents import _logging
        from relaunch.console.app import check_shared, create_app

        try:
            config = load_config(config_path, cluster, state_dir)
            others = [load_config(path, cluster, state_dir) for path in cluster_configs]
            check_shared(config, others)
            asyncio.run(refuse_behind_schema(config.database_url))  # `relaunch db migrate`
            _logging(None, log_format, log_level)
            app = create_app(
                config,
                cluster_services(config),
                other_clusters=[(other, cluster_services(other)) for other in others],
            )
        except RelaunchError as exc:
            _fail(exc)
        host = host or config.console.host
        port = port or config.console.port
        names = ", ".join([config.name, *(other.name for other in others)])
        noun = "cluster" if not others else "clusters"
        click.echo(f"Relaunch console for {noun} {names}: http://{host}:{port}/", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)

    @console_cmd.command("token")
    @click.argument("name")
    @click.option(
        "--role",
        type=click.Choice([r.value for r in ConsoleRole]),
        required=True,
        help="viewer, approver, admin (people), intake (a machine that pushes signals in), "
        "repair (the repair system's callback, POST /intake/repair, and nothing else) or agent "
        "(one node's `relaunch agent --post`, POST /intake/agent: NAME is the node, and the "
        "token may report that node only).",
    )
    @click.option(
        "--scope",
        "scopes",
        multiple=True,
        help="Limit the token to this cluster (repeatable; default: every cluster).",
    )
    @click.option(
        "--trusted-health",
        is_flag=True,
        help="For an intake token: its node-health events (POST /intake/health) convict a "
        "node, as the node's own kernel log does; without it they only point (docs/trust.md).",
    )
    @click.option(
        "--tokens-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="The tokens file (default: the configuration's console.tokens_file).",
    )
    @config_options
    def token_cmd(
        name: str,
        role: str,
        scopes: tuple[str, ...],
        trusted_health: bool,
        tokens_file: Path | None,
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
    ) -> None:
        """Add a token named NAME to the console's tokens file and print it: the file keeps
        only its SHA-256, so this is the one time it is shown. A running console reads the
        file again when it changes."""
        from relaunch.console.auth import add_token

        try:
            path = tokens_file or _tokens_file(load_config(config_path, cluster, state_dir))
            token = add_token(
                path,
                name,
                ConsoleRole(role),
                clusters=list(scopes) or None,
                trusted_health=trusted_health,
            )
        except RelaunchError as exc:
            _fail(exc)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        trust = ", trusted with health events" if trusted_health else ""
        click.echo(f"added {name} ({role}{trust}) to {path}", err=True)
        click.echo(token)


def _tokens_file(config: ClusterConfig) -> Path:
    if not config.console.tokens_file:
        raise click.UsageError("the configuration names no console.tokens_file: give --tokens-file")
    return Path(config.console.tokens_file)
