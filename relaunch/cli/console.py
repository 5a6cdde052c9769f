"""`relaunch console`: serve the Recovery Console for one cluster, or for several clusters that
share one PostgreSQL and one Temporal (`--cluster-config`, repeatable)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import click
from temporalio.client import Client

from relaunch.cli.exits import fail as _fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.connectors.slurm.factory import slurm_scheduler
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import RepairReturn
from relaunch.models.recovery import Approval, Detection

if TYPE_CHECKING:
    from relaunch.console.web import Services


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
    )


def register(cli: click.Group) -> None:
    @cli.command("console")
    @config_options
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
    def console_cmd(
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        cluster_configs: tuple[Path, ...],
        host: str | None,
        port: int | None,
    ) -> None:
        """Serve the Recovery Console: incidents, approvals, nodes, jobs and the audit trail;
        the intake routes (Alertmanager, Slurm hooks), /metrics, and the notifier (when the
        configuration names notify channels). With --cluster-config, one console serves
        several clusters; the first (--config) gives the console's own settings."""
        import uvicorn

        from relaunch.cli.incidents import _logging
        from relaunch.console.app import check_shared, create_app

        try:
            config = load_config(config_path, cluster, state_dir)
            others = [load_config(path, cluster, state_dir) for path in cluster_configs]
            check_shared(config, others)
            _logging()
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
