"""`relaunch audit purge|maintain`: retention of the audit trail (docs/retention.md), run by a
person or a timer under the purge role, never by the services."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from relaunch.cli.exits import fail as _fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.setup import DSN_ENV_OPTION, _dsn
from relaunch.cli.terminal import printable
from relaunch.models.errors import RelaunchError


def register(cli: click.Group) -> None:
    @cli.group("audit")
    def audit_group() -> None:
        """Retention of the audit trail: purge old incidents, make partitions ahead."""

    @audit_group.command("purge")
    @config_options
    @DSN_ENV_OPTION
    @click.option(
        "--before",
        "before_text",
        default=None,
        metavar="DATE",
        help="Delete the incidents wholly older than DATE (YYYY-MM-DD, midnight UTC, or an ISO "
        "time with its zone; at least 30 days ago). Default: audit.retention_days ago.",
    )
    @click.option("--by", "by", required=True, metavar="NAME", help="Who purges (recorded).")
    @click.option("--dry-run", is_flag=True, help="Count what would go; delete and record nothing.")
    def purge_cmd(
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
        dsn_env: str | None,
        before_text: str | None,
        by: str,
        dry_run: bool,
    ) -> None:
        """Delete the cluster's incidents wholly older than DATE (created before it, no row
        at or after it) with their audit rows and their bundles in bundle_dir, and the rows of
        its intake and rollout records older than DATE. Whole months are dropped when every row
        in them may go. Recorded in audit_purges (who, which cluster, the cut-off, counts).
        Runs under the purge role (`relaunch setup db --print-grants ROLE --purge`; give its
        DSN with --dsn-env); nothing else may delete."""
        from relaunch.connectors.retention import (
            check_by,
            parse_before,
            purge,
            retention_before,
        )

        try:
            config = load_config(config_path, cluster, state_dir)
            dsn = _dsn(config_path, cluster, state_dir, dsn_env)
            name = check_by(by)
            before = (
                parse_before(before_text)
                if before_text is not None
                else retention_before(config.audit.retention_days)
            )
            report = asyncio.run(
                purge(
                    dsn,
                    cluster=config.name,
                    before=before,
                    by=name,
                    bundle_dir=Path(config.bundle_dir),
                    dry_run=dry_run,
                    months_ahead=config.audit.partitions_ahead,
                )
            )
        except RelaunchError as exc:
            _fail(exc)
        for line in report.lines():
            click.echo(printable(line))

    @audit_group.command("maintain")
    @config_options
    @DSN_ENV_OPTION
    def maintain_cmd(
        config_path: Path | None, cluster: str, state_dir: Path, dsn_env: str | None
    ) -> None:
        """Make the audit trail's monthly partitions for this month and the next
        audit.partitions_ahead (rows past the last one land in a default partition and are
        moved when their month is made). Idempotent: run it from a daily timer."""
        from relaunch.connectors.retention import maintain

        try:
            config = load_config(config_path, cluster, state_dir)
            made = asyncio.run(
                maintain(
                    _dsn(config_path, cluster, state_dir, dsn_env), config.audit.partitions_ahead
                )
            )
        except RelaunchError as exc:
            _fail(exc)
        click.echo(
            f"audit partitions: {made} made, this month and the next "
            f"{config.audit.partitions_ahead} ready"
        )
