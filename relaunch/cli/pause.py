"""`relaunch pause`, `relaunch unpause` and `relaunch paused`: the kill switch. While a cluster
is paused Relaunch changes nothing on it (docs/pause.md); every pause and unpause is an audit
row with who and why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from relaunch.cli.exits import fail as _fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.terminal import printable
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.pause import pause_state, set_paused
from relaunch.models.errors import RelaunchError
from relaunch.models.pause import PauseState


def _line(state: PauseState) -> str:
    when = f" since {state.at:%Y-%m-%d %H:%M:%S} UTC" if state.paused and state.at else ""
    return state.describe() + when


async def _apply(
    database_url: str, cluster: str, paused: bool | None, by: str, reason: str
) -> PauseState:
    store = await AuditStore.open(database_url, timeout=5)
    try:
        if paused is None:
            return await pause_state(store, cluster)
        return await set_paused(store, cluster, paused, by=by, reason=reason)
    finally:
        await store.close()


def _run(
    paused: bool | None,
    by: str,
    reason: str,
    config_path: Path | None,
    cluster: str,
    state_dir: Path,
    as_json: bool = False,
) -> None:
    try:
        config = load_config(config_path, cluster, state_dir)
        state = asyncio.run(_apply(config.database_url, config.name, paused, by, reason))
    except RelaunchError as exc:
        _fail(exc)
    click.echo(state.model_dump_json() if as_json else printable(_line(state)))


def register(cli: click.Group) -> None:
    @cli.command("pause")
    @click.option("--by", default="", help="Who pauses (required; the audit trail's actor).")
    @click.option("--reason", default="", help="Why (required; kept in the audit trail).")
    @config_options
    def pause_cmd(
        by: str, reason: str, config_path: Path | None, cluster: str, state_dir: Path
    ) -> None:
        """Stop Relaunch changing the cluster, at once: no drain, fence, requeue, hold,
        resubmit, resume, reservation, check, reboot, reset or repair ticket until `relaunch
        unpause`. Detection, evidence, plans and approval requests go on and are recorded; an
        approved action waits and is carried out after the unpause (docs/pause.md)."""
        missing = [o for o, v in (("--by NAME", by), ("--reason TEXT", reason)) if not v.strip()]
        if missing:
            raise click.UsageError(
                f"a pause needs {' and '.join(missing)}: who pauses and why go in the audit trail"
            )
        _run(True, by, reason, config_path, cluster, state_dir)

    @cli.command("unpause")
    @click.option("--by", default="", help="Who unpauses (required; the audit trail's actor).")
    @click.option("--reason", default="", help="Why (optional; kept in the audit trail).")
    @config_options
    def unpause_cmd(
        by: str, reason: str, config_path: Path | None, cluster: str, state_dir: Path
    ) -> None:
        """Let Relaunch change the cluster again: steps that waited (approved drains,
        requeues, lifecycle steps) go on within minutes, without anyone redoing them."""
        if not by.strip():
            raise click.UsageError(
                "an unpause needs --by NAME: who unpauses goes in the audit trail"
            )
        _run(False, by, reason, config_path, cluster, state_dir)

    @cli.command("paused")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @config_options
    def paused_cmd(as_json: bool, config_path: Path | None, cluster: str, state_dir: Path) -> None:
        """Whether the cluster is paused now, by whom, why and since when."""
        _run(None, "", "", config_path, cluster, state_dir, as_json)
