"""`relaunch scorecard` and `relaunch rollout`: how right the recommendations were, and the
audited promotions and demotions that let Relaunch act alone where it has earned it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import click

from relaunch.cli.exits import fail as _fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.terminal import printable
from relaunch.connectors.audit import AuditStore
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Mode
from relaunch.models.rollout import ModeChange, Precision, ScopeKind, Scorecard, Tally
from relaunch.rollout.policy import (
    actor_name,
    change_mode,
    effective_policy,
    mode_changes,
    scope_name,
)
from relaunch.rollout.policy import parse_since as since_of
from relaunch.rollout.scorecard import load_scorecard

T = TypeVar("T")


def _with_store(config: ClusterConfig, use: Callable[[AuditStore], Awaitable[T]]) -> T:
    async def go() -> T:
        store = await AuditStore.open(config.database_url, timeout=5)
        try:
            return await use(store)
        finally:
            await store.close()

    return asyncio.run(go())


def parse_since(value: str | None) -> datetime | None:
    """``--since``: an ISO time or a span back from now (relaunch.rollout.policy.parse_since)."""
    try:
        return since_of(value or "", datetime.now(UTC))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _precision(p: Precision) -> str:
    return f"{p.right} right, {p.wrong} wrong, {p.pending} pending ({_share(p.right, p.judged)})"


def _tally_line(name: str, mode: str, t: Tally, width: int) -> str:
    return (
        f"  {name:<{width}} {mode:<10} {t.recommended:>5} {t.autonomous:>5} {t.approved:>5} "
        f"{t.rejected:>5} {t.expired:>5} {t.acted_differently:>5} {t.pending:>5}   "
        f"{t.approved_right}/{t.decided} ({_share(t.approved_right, t.decided)})"
    )


def format_scorecard(card: Scorecard) -> str:
    lines = [
        f"Scorecard of {card.cluster} since {card.since:%Y-%m-%d %H:%M} UTC "
        f"({card.total.recommended} recommendations)",
        f"  drains    {_precision(card.drains)}",
        f"  restarts  {_precision(card.restarts)}",
        f"  holds     {_precision(card.holds)}",
        "",
    ]
    for title, cards in (("category", card.categories), ("partition", card.partitions)):
        if not cards:
            continue
        width = max(len(title), *(len(c.name or "-") for c in cards))
        lines.append(
            f"  {title:<{width}} {'mode':<10} {'recs':>5} {'auto':>5} {'appr':>5} {'rej':>5} "
            f"{'exp':>5} {'diff':>5} {'pend':>5}   approved and right"
        )
        for c in cards:
            lines.append(_tally_line(c.name or "-", c.mode.value, c.tally, width))
        lines.append("")
    if card.suggestions:
        lines.append("Suggestions (make one with `relaunch rollout promote|demote`):")
        for s in card.suggestions:
            lines.append(f"  {s.change} {s.scope.value} {s.name} to {s.to.value}: {s.why}")
    else:
        lines.append(
            f"No suggestion: a promotion needs {card.settings.promote_min_decisions} decisions "
            f"at {card.settings.promote_min_share:.0%} approved and right."
        )
    return "\n".join(lines)


def _change_line(c: ModeChange) -> str:
    what = c.mode.value if c.mode else "as configured"
    why = f": {c.reason}" if c.reason else ""
    return f"  {c.at:%Y-%m-%d %H:%M:%S}  {c.scope.value} {c.name} → {what} by {c.by}{why}"


def register(cli: click.Group) -> None:
    @cli.command("scorecard")
    @click.option(
        "--since",
        default=None,
        help="Recommendations made since this time (ISO, UTC) or this long ago (7d, 12h); "
        "default: the configured window (rollout.window_days).",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the whole scorecard as JSON.")
    @config_options
    def scorecard_cmd(
        since: str | None, as_json: bool, config_path: Path | None, cluster: str, state_dir: Path
    ) -> None:
        """How right Relaunch's recommendations were: per category and partition, what
        operators did with them (approved, rejected, expired, acted differently) and how the
        actions turned out (drains by the node's checks, restarts by whether the job failed the
        same way again). Suggests promotions and demotions (docs/autonomy.md)."""
        start = parse_since(since)
        try:
            config = load_config(config_path, cluster, state_dir)
            card = _with_store(config, lambda s: load_scorecard(s, config, since=start))
        except RelaunchError as exc:
            _fail(exc)
        click.echo(printable(card.model_dump_json(indent=2) if as_json else format_scorecard(card)))

    @cli.group("rollout")
    def rollout() -> None:
        """Staged rollout: promote a category or partition from monitor to autonomous, or demote
        it back; every change is an audit row (who, when, why) and takes effect at the next
        plan, without a restart."""

    @rollout.command("show")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @config_options
    def rollout_show(
        as_json: bool, config_path: Path | None, cluster: str, state_dir: Path
    ) -> None:
        """The modes Relaunch plans with now, and every change made."""
        try:
            config = load_config(config_path, cluster, state_dir)
            changes = _with_store(config, lambda s: mode_changes(s, config.name))
        except RelaunchError as exc:
            _fail(exc)
        policy = effective_policy(config.policy, changes)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "default": policy.mode.value,
                        "canary_partition": policy.canary_partition,
                        "categories": {c.value: m.value for c, m in policy.category_modes.items()},
                        "partitions": {p: m.value for p, m in policy.partition_modes.items()},
                        "changes": [c.model_dump(mode="json") for c in changes],
                    },
                    indent=2,
                )
            )
            return
        click.echo(f"default: {policy.mode.value}")
        if policy.canary_partition:
            click.echo(f"canary: autonomous only on partition {policy.canary_partition}")
        for c, m in sorted(policy.category_modes.items()):
            click.echo(f"category {c.value}: {m.value}")
        for p, m in sorted(policy.partition_modes.items()):
            click.echo(printable(f"partition {p}: {m.value}"))
        click.echo("changes:" if changes else "no changes: the configuration's modes")
        for change in changes:
            click.echo(printable(_change_line(change)))

    def _change(
        mode: Mode | None,
        category: str | None,
        partition: str | None,
        by: str,
        reason: str,
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
    ) -> None:
        if bool(category) == bool(partition):
            raise click.UsageError("name one of --category or --partition")
        scope = ScopeKind.CATEGORY if category else ScopeKind.PARTITION
        name = category or partition or ""
        try:
            scope_name(scope, name), actor_name(by)  # a typo is said before any connection
            config = load_config(config_path, cluster, state_dir)
            change = _with_store(
                config,
                lambda s: change_mode(s, config.name, scope, name, mode, by=by, reason=reason),
            )
        except RelaunchError as exc:
            _fail(exc)
        click.echo(printable("recorded:" + _change_line(change)))

    def _change_command(name: str, mode: Mode | None, doc: str) -> None:
        @rollout.command(name, help=doc)
        @click.option("--category", default=None, help="A category, e.g. gpu_hardware.")
        @click.option("--partition", default=None, help="A Slurm partition.")
        @click.option("--by", required=True, help="Who makes the change (the audit trail's actor).")
        @click.option("--reason", default="", help="Why (kept in the audit trail).")
        @config_options
        def command(
            category: str | None,
            partition: str | None,
            by: str,
            reason: str,
            config_path: Path | None,
            cluster: str,
            state_dir: Path,
        ) -> None:
            _change(mode, category, partition, by, reason, config_path, cluster, state_dir)

    _change_command(
        "promote",
        Mode.AUTONOMOUS,
        "Let Relaunch act alone on a category or a partition (autonomous).",
    )
    _change_command(
        "demote",
        Mode.MONITOR,
        "Have Relaunch ask before acting (monitor) on a category or partition.",
    )
    _change_command("reset", None, "Back to the configuration's mode for a category or partition.")
