"""`relaunch setup temporal|db` and `relaunch db migrate|status`: the one-time steps of a
deployment, run by a person with the rights they need (docs/production.md)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

import click

from relaunch.cli.exits import fail as _fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.terminal import printable
from relaunch.models.errors import RelaunchError

DSN_ENV_OPTION = click.option(
    "--dsn-env",
    "dsn_env",
    default=None,
    metavar="NAME",
    help="Take the database DSN from the environment variable NAME instead of the "
    "configuration's database_url (then --config is optional): the owner role's DSN, when "
    "the services run under another role.",
)


def _dsn(config_path: Path | None, cluster: str, state_dir: Path, dsn_env: str | None) -> str:
    """The DSN: from ``--dsn-env`` (then no configuration is needed), else the
    configuration's ``database_url``."""
    if dsn_env is None:
        return load_config(config_path, cluster, state_dir).database_url
    if config_path is not None:
        load_config(config_path, cluster, state_dir)  # still checked when given
    value = os.environ.get(dsn_env, "")
    if not value:
        raise RelaunchError(f"--dsn-env {dsn_env}: the variable is not set or empty")
    return value


def _migrate(dsn: str) -> None:
    from relaunch.connectors.db_setup import migrate_database

    click.echo(printable(asyncio.run(migrate_database(dsn)).line()))


def register(cli: click.Group) -> None:
    @cli.group("setup")
    def setup_group() -> None:
        """One-time setup of the services Relaunch uses (idempotent: run again at each upgrade)."""

    @setup_group.command("temporal")
    @config_options
    @click.option(
        "--create-namespace",
        is_flag=True,
        help="Create the configuration's temporal_namespace when it does not exist.",
    )
    @click.option(
        "--retention-days",
        type=click.IntRange(1, 3650),
        default=30,
        show_default=True,
        help="Retention of a namespace created by --create-namespace: how long finished "
        "recoveries stay in Temporal (the audit trail keeps them for good).",
    )
    def setup_temporal_cmd(
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        create_namespace: bool,
        retention_days: int,
    ) -> None:
        """Check the Temporal namespace of the configuration (optionally create it) and
        register Relaunch's search attributes on it through the operator service. Prints what
        it registered and what was there already; exits 1 on a namespace that is missing, an
        attribute registered with another type, or missing rights, and 75 when the frontend
        does not answer."""
        from relaunch.connectors.temporal import connect
        from relaunch.connectors.temporal_setup import setup_temporal

        async def go() -> list[str]:
            client = await connect(config)
            done = await setup_temporal(
                client,
                config.temporal_namespace,
                create_retention=timedelta(days=retention_days) if create_namespace else None,
            )
            return done.lines()

        try:
            config = load_config(config_path, cluster, state_dir)
            click.echo(f"Temporal at {config.temporal_address}:")
            for line in asyncio.run(go()):
                click.echo(printable(line))
        except RelaunchError as exc:
            _fail(exc)

    @setup_group.command("db")
    @config_options
    @DSN_ENV_OPTION
    @click.option(
        "--print-grants",
        "grants_role",
        default=None,
        metavar="ROLE",
        help="Print, instead of migrating, the GRANT statements that let ROLE run the "
        "services on the migrated database (read and append only), for psql.",
    )
    @click.option(
        "--purge",
        "purge_role",
        is_flag=True,
        help="With --print-grants: the grants of the purge role instead (`relaunch audit "
        "purge|maintain`: read, delete the trail's rows, record the purge, make and drop "
        "monthly partitions through the owner's functions; no update, truncate or schema "
        "change).",
    )
    def setup_db_cmd(
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        dsn_env: str | None,
        grants_role: str | None,
        purge_role: bool,
    ) -> None:
        """Migrate the audit database's schema to this release's version (as
        `relaunch db migrate`), or print the grants of the services' role."""
        from relaunch.connectors.db_setup import ROLE_RE, grant_statements

        try:
            dsn = _dsn(config_path, cluster, state_dir, dsn_env)
            if grants_role is None:
                if purge_role:
                    raise RelaunchError("--purge goes with --print-grants ROLE")
                _migrate(dsn)
                return
            if not ROLE_RE.fullmatch(grants_role):
                raise RelaunchError(
                    f"--print-grants: {grants_role!r} is not a plain role name "
                    "(lower-case letters, digits and _, at most 63)"
                )
            for line in asyncio.run(grant_statements(dsn, grants_role, purge=purge_role)):
                click.echo(printable(line))
        except RelaunchError as exc:
            _fail(exc)

    @cli.group("db")
    def db_group() -> None:
        """The audit database's schema."""

    @db_group.command("migrate")
    @config_options
    @DSN_ENV_OPTION
    def db_migrate_cmd(
        config_path: Path | None, cluster: str, state_dir: Path, dsn_env: str | None
    ) -> None:
        """Apply the pending migrations, once, as the role that owns the database. The
        worker, the watcher and the console never migrate: they refuse to start on an older
        schema and name this command."""
        try:
            _migrate(_dsn(config_path, cluster, state_dir, dsn_env))
        except RelaunchError as exc:
            _fail(exc)

    @db_group.command("status")
    @config_options
    @DSN_ENV_OPTION
    def db_status_cmd(
        config_path: Path | None, cluster: str, state_dir: Path, dsn_env: str | None
    ) -> None:
        """Print the schema's version and the one this release needs; exits 1 when behind."""
        from relaunch.connectors.audit import MIGRATE_COMMAND, SCHEMA_VERSION
        from relaunch.connectors.db_setup import read_version

        try:
            version = asyncio.run(read_version(_dsn(config_path, cluster, state_dir, dsn_env)))
        except RelaunchError as exc:
            _fail(exc)
        click.echo(f"schema version {version}; this Relaunch needs {SCHEMA_VERSION}")
        if version < SCHEMA_VERSION:
            click.echo(f"behind: run `{MIGRATE_COMMAND}`", err=True)
            raise SystemExit(1)
