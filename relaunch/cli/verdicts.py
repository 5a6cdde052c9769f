"""CLI commands of attribution: classify and explain incident bundles, and node reputation."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from relaunch.cli.exits import fail
from relaunch.cli.incidents import config_options, load_config
from relaunch.cli.nodes_history import by_node, history_cmd, outside_json, outside_text
from relaunch.cli.terminal import printable
from relaunch.connectors.audit import StoredEvent
from relaunch.connectors.bundles import read_bundle
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.signatures import Catalogue
from relaunch.models.bundle import Bundle
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import EvidenceLine, Verdict, XidEvidence

_ROLE_MARK = {"root": "▶", "confirm": "+", "cascade": "·", "teardown": "·", "context": "?"}


def classify_json(path: str, verdict: Verdict) -> str:
    """The design's `relaunch classify --json` line for one bundle."""
    return json.dumps(
        {
            "bundle": path,
            "category": verdict.category.value,
            "culprit_nodes": sorted(verdict.culprit_nodes),
            "action": verdict.action.value,
            "confidence": round(verdict.confidence, 3),
            "evidence": [_evidence_json(e) for e in verdict.evidence],
            "corroboration": {
                node: sorted(verdict.corroboration.get(node, []))
                for node in sorted(verdict.culprit_nodes)
            },
            "remedies": dict(sorted(verdict.remedies.items())),
        }
    )


def _evidence_json(e: EvidenceLine) -> dict[str, object]:
    out: dict[str, object] = {
        "source": e.source,
        "line_no": e.line_no,
        "text": e.text,
        "signature": e.signature,
    }
    if e.xid is not None:  # the code, the catalogue's decoded action and its words
        out["xid"] = e.xid.model_dump()
    return out


def explain(bundle: Bundle, verdict: Verdict, *, color: bool) -> str:
    """A human's account of one verdict: decision, decisive lines, folded cascades."""

    def bold(text: str, fg: str | None = None) -> str:
        return click.style(text, bold=True, fg=fg) if color else text

    job = bundle.job
    culprits = ", ".join(verdict.culprit_nodes) or "no node"
    out = [
        f"{bundle.path}: job {job.job_id} on {job.cluster}, {job.state} "
        f"(exit {job.exit_code}) on {', '.join(job.nodes) or 'no nodes'}",
        bold(f"verdict: {verdict.category.value} on {culprits}", "red")
        + f"  (confidence {verdict.confidence:.2f}) → {verdict.action.value}",
        f"why: {printable(verdict.summary)}",
    ]
    decisive = [e for e in verdict.evidence if e.role in ("root", "confirm")]
    other = [e for e in verdict.evidence if e.role not in ("root", "confirm")]
    if decisive:
        out.append("decisive lines:")
        out += [_line(e, lambda t: bold(t, "yellow")) for e in decisive]
    if other:
        out.append("supporting lines:")
        out += [_line(e, lambda t: t) for e in other]
    if verdict.folded:
        total = sum(verdict.folded.values())
        parts = ", ".join(f"{sig} ×{n}" for sig, n in list(verdict.folded.items())[:6])
        out.append(f"folded: {total} cascade/teardown line(s), not decisive: {parts}")
    if verdict.repeat_offenders:
        out.append(f"named by reputation: {', '.join(verdict.repeat_offenders)}")
    for node, rung in sorted(verdict.remedies.items()):
        out.append(f"{node}: remedy {rung} (the rung its Xids ask for)")
    for node in verdict.culprit_nodes:
        sources = verdict.corroboration.get(node, [])
        trust = (
            f"corroborated by {', '.join(sources)}"
            if sources
            else "named only by job-controlled evidence (the job's output): excluded, not drained"
        )
        out.append(f"{node}: {trust}")
    states = {n: s for n, s in job.node_states.items() if s}
    if states:
        out.append("node states: " + ", ".join(f"{n}={s}" for n, s in sorted(states.items())))
    return "\n".join(out)


def _line(e: EvidenceLine, style: Callable[[str], str]) -> str:
    mark = _ROLE_MARK.get(e.role, " ")
    trust = "trusted" if e.trusted else "job-controlled"
    where = f"{e.source}:{e.line_no} ({trust})" + (f" [{e.node}]" if e.node else "")
    copies = f" (×{e.count})" if e.count > 1 else ""
    text = printable(e.text)  # a job's line: its escape sequences never reach the terminal
    text = text if len(text) <= 160 else text[:157] + "..."
    out = f"  {mark} {where} {e.signature}{copies}\n      {style(text)}"
    if e.xid is not None:
        out += "\n      " + printable(xid_words(e.xid))
    return out


_MEANS = {
    "drain": "drain",
    "restart": "restart the job, isolate nothing",
    "follow_154": "an Xid 154 on the GPU decides; without one, restart",
    "context": "no action: not a cause",
    "teardown": "the aftermath of another error",
}
_RUNG_WORDS = {"gpu_reset": "a GPU reset", "reboot": "a reboot", "escalate": "a person (support)"}


def xid_words(x: XidEvidence) -> str:
    """One line on what NVIDIA's Xid catalogue says of an Xid and why."""
    action = x.action or "none (not in the catalogue)"
    means = _MEANS.get(x.outcome, x.outcome)
    if x.remedy:
        means += f"; the node needs {_RUNG_WORDS.get(x.remedy, x.remedy)}"
    said = f"Xid {x.code} ({x.words}): NVIDIA's immediate action {action} → {means}"
    return said if x.detail in ("", f"immediate action {x.action}") else f"{said} ({x.detail})"


def register(cli: click.Group) -> None:
    @cli.command("classify")
    @click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per bundle per line.")
    @click.option(
        "--engine",
        type=click.Choice(["auto", "hyperscan", "literals"]),
        default="auto",
        show_default=True,
        help="The scan engine (auto: hyperscan where installed).",
    )
    def classify_cmd(bundles: tuple[Path, ...], as_json: bool, engine: str) -> None:
        """Attribute each incident BUNDLE: category, culprit nodes, action, confidence, the
        evidence lines and, per culprit, the trusted sources that corroborate it. A bundle that
        cannot be read is reported on stderr and the others are still classified; the exit
        code is then 1."""
        catalogue = Catalogue.load(engine=None if engine == "auto" else engine)
        failed = 0
        for path in bundles:
            try:
                bundle = read_bundle(path)
            except RelaunchError as exc:
                click.echo(f"error: {exc}", err=True)
                failed += 1
                continue
            verdict = attribute_bundle(bundle, catalogue)
            if as_json:
                click.echo(classify_json(str(path), verdict))
            else:
                culprits = ",".join(verdict.culprit_nodes) or "-"
                click.echo(
                    f"{path}  {verdict.category.value:<14} {culprits:<16} "
                    f"{verdict.action.value:<19} {verdict.confidence:.2f}  "
                    f"{printable(verdict.summary)[:80]}"
                )
        if failed:
            raise SystemExit(1)

    @cli.command("explain")
    @click.argument("bundle", type=click.Path(path_type=Path))
    @click.option("--color/--no-color", default=None, help="Highlight (default: on a terminal).")
    def explain_cmd(bundle: Path, color: bool | None) -> None:
        """Show the reasoning behind BUNDLE's verdict: the decisive lines highlighted (each
        marked trusted or job-controlled), cascade lines folded into counts, what corroborates
        each culprit, node states."""
        try:
            loaded = read_bundle(bundle)
        except RelaunchError as exc:
            fail(exc)
        verdict = attribute_bundle(loaded)
        use_color = color if color is not None else sys.stdout.isatty()
        click.echo(explain(loaded, verdict, color=use_color))

    @cli.group("nodes", invoke_without_command=True)
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per node per line.")
    @click.option(
        "--window-hours",
        type=float,
        default=None,
        help="History window (default: the policy's repeat-offender window).",
    )
    @config_options
    @click.pass_context
    def nodes_cmd(
        ctx: click.Context,
        as_json: bool,
        window_hours: float | None,
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
    ) -> None:
        """Node reputation and lifecycle: incidents that implicated each node in the window,
        whether it is a repeat offender, where its lifecycle stands (diagnosing, escalated to
        repair, returned: docs/lifecycle.md), and what other systems said of it (drains
        Relaunch did not make, health events pushed in). `relaunch nodes history NODE` shows
        one node's history; `relaunch nodes returned NODE` says a node sent to repair is
        repaired."""
        if ctx.invoked_subcommand is not None:
            return
        from relaunch.connectors.audit import AuditStore, NodeReputation

        async def go() -> tuple[
            int, float, list[NodeReputation], dict[str, StoredEvent], list[StoredEvent]
        ]:
            config = load_config(config_path, cluster, state_dir)
            policy = config.policy
            hours = window_hours or policy.repeat_offender_window_hours
            store = await AuditStore.open(config.database_url, timeout=5)
            try:
                since = datetime.now(UTC) - timedelta(hours=hours)
                rows = await store.node_reputation(config.name, since)
                stages = await store.node_stages(config.name)
                outside = await store.outside_events(config.name, since)
            finally:
                await store.close()
            return policy.repeat_offender_incidents, hours, rows, stages, outside

        try:
            threshold, hours, rows, stages, outside_rows = asyncio.run(go())
        except RelaunchError as exc:
            fail(exc)
        outside = by_node(outside_rows)
        listed = {row.node for row in rows}
        for row in rows:
            offender = row.incidents >= threshold
            stage = stages.get(row.node)
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            **row.model_dump(mode="json"),
                            "repeat_offender": offender,
                            **_lifecycle_json(stage),
                            **_outside_json(outside.get(row.node, [])),
                        }
                    )
                )
                continue
            flag = "REPEAT OFFENDER: drain and check hardware" if offender else ""
            click.echo(
                f"{row.node:<14} {row.incidents:>3} incident(s) in {row.jobs} job(s)  "
                f"last {row.last_at:%Y-%m-%d %H:%M}  {','.join(sorted(row.categories)):<24} "
                f"{_lifecycle_text(stage)}{outside_text(outside.get(row.node, []))}{flag}"
            )
        for node in sorted((set(stages) | set(outside)) - listed):
            stage, said = stages.get(node), outside.get(node, [])
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "node": node,
                            "incidents": 0,
                            **_lifecycle_json(stage),
                            **_outside_json(said),
                        }
                    )
                )
            else:
                click.echo(
                    f"{node:<14}   0 incident(s) in the window  "
                    f"{_lifecycle_text(stage)}{outside_text(said)}"
                )
        if not rows and not stages and not outside and not as_json:
            click.echo(f"no node implicated in the last {hours:g} h")

    nodes_cmd.add_command(history_cmd)

    @nodes_cmd.command("returned")
    @click.argument("node")
    @click.option("--by", required=True, help="Who repaired it (recorded in the audit trail).")
    @click.option("--ticket", default="", help="The repair ticket.")
    @click.option("--note", default="", help="What was done (recorded).")
    @config_options
    def nodes_returned_cmd(
        node: str,
        by: str,
        ticket: str,
        note: str,
        config_path: Path | None,
        cluster: str,
        state_dir: Path,
    ) -> None:
        """Say that NODE, sent to repair by its lifecycle, is repaired: the lifecycle validates
        it with its health checks and returns it to service only if they pass."""
        from relaunch.connectors.temporal import connect
        from relaunch.models.lifecycle import RepairReturn
        from relaunch.models.names import node_name
        from relaunch.workflows.recovery_client import signal_repaired

        async def go() -> str:
            config = load_config(config_path, cluster, state_dir)
            client = await connect(config)
            repair = RepairReturn(by=by, ticket=ticket[:64], note=note[:500])
            return await signal_repaired(client, config.name, node_name(node), repair)

        try:
            lifecycle = asyncio.run(go())
        except RelaunchError as exc:
            fail(exc)
        click.echo(f"{node}: repair reported to {lifecycle}; it validates the node now")


def _outside_json(rows: list[StoredEvent]) -> dict[str, object]:
    return {"outside": outside_json(rows)} if rows else {}


def _lifecycle_json(stage: StoredEvent | None) -> dict[str, object]:
    if stage is None:
        return {}
    return {
        "lifecycle": stage.incident_id,
        "lifecycle_stage": stage.stage,
        "lifecycle_at": stage.at.isoformat(),
        "lifecycle_summary": stage.summary,
    }


def _lifecycle_text(stage: StoredEvent | None) -> str:
    if stage is None:
        return ""
    return f"[{stage.stage} since {stage.at:%H:%M}: {stage.incident_id}]  "
