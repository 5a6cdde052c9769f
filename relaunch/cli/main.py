"""The `relaunch` command line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from relaunch.cli.exits import exit_code
from relaunch.cli.exits import fail as _fail
from relaunch.cli.terminal import json_text, printable
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack.slurm_release import DEFAULT_RELEASE, HOST_RELEASE, RELEASES
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.devstack.status import StackStatus
from relaunch.models.errors import RelaunchError, StackError
from relaunch.models.names import cluster_name
from relaunch.models.scheduler import ActionResult, Job, Node

T = TypeVar("T")

STATE_DIR_OPTION = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".relaunch"),
    show_default=True,
    help="Where the local stack keeps its files and state.",
)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="relaunch")
def cli() -> None:
    """Relaunch keeps distributed training jobs running on Slurm.

    It detects interrupted or stalled jobs, works out which node is to blame, drains it, and
    restarts the job from its last checkpoint on healthy nodes — in monitor mode only after an
    operator approves.
    """


# ---------------------------------------------------------------------- dev stack


@cli.group()
def dev() -> None:
    """The local stack: Temporal, PostgreSQL and an N-node Slurm on this machine."""


def _print_status(status: StackStatus) -> None:
    width = max(len(p.name) for p in status.parts)
    for part in status.parts:
        mark = "ok  " if part.healthy else "DOWN"
        pid = f"pid {part.pid}" if part.pid else "-"
        detail = f"  {part.detail}" if part.detail else ""
        click.echo(f"  {mark} {part.name:<{width}}  {part.address}  ({pid}){detail}")


MAX_DEV_CLUSTERS = 4


def _cluster_names(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    """`--clusters a,b`: safe, distinct names, at most MAX_DEV_CLUSTERS."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise click.BadParameter("name at least one cluster")
    if len(names) > MAX_DEV_CLUSTERS:
        raise click.BadParameter(f"at most {MAX_DEV_CLUSTERS} clusters on one machine")
    if len(set(names)) != len(names):
        raise click.BadParameter(f"a cluster is named twice: {value}")
    for name in names:
        try:
            cluster_name(name)
        except RelaunchError as exc:
            raise click.BadParameter(str(exc)) from exc
    return names


@dev.command("up")
@STATE_DIR_OPTION
@click.option(
    "--nodes",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Number of Slurm nodes (first `up` only).",
)
@click.option(
    "--cred-expire",
    type=click.IntRange(5, 3600),
    default=10,
    show_default=True,
    help="Slurm cred_expire in seconds; a requeued job waits this long before it may "
    "start again (Slurm's default is 120).",
)
@click.option(
    "--clusters",
    "clusters",
    default="dev",
    show_default=True,
    metavar="A,B,...",
    callback=_cluster_names,
    help="The Slurm clusters to run (first `up` only), comma-separated: each gets its own "
    "Slurm (munged, slurmctld, slurmds, slurmrestd), worker and watcher; all share Temporal, "
    "PostgreSQL and one console.",
)
@click.option(
    "--slurm",
    "release",
    type=click.Choice(list(RELEASES)),
    default=None,
    help=f"The Slurm release (first `up` only) [default: {DEFAULT_RELEASE}]: "
    f"{HOST_RELEASE} is this machine's packages; 24.11 is Debian 13's, installed once into "
    "a root under ~/.cache/relaunch (about 30 s and 400 MB; needs root), its commands reached "
    "through the PATH printed below.",
)
def dev_up(
    state_dir: Path, nodes: int, cred_expire: int, clusters: list[str], release: str | None
) -> None:
    """Start the local stack (idempotent: running parts are left alone)."""
    saved = state_dir / "stack.json"
    config = (
        None
        if saved.exists()
        else StackConfig.for_clusters(
            clusters, nodes=nodes, cred_expire=cred_expire, slurm=release or DEFAULT_RELEASE
        )
    )
    stack = Stack(state_dir, config)
    if config is None and release not in (None, stack.config.slurm):
        click.echo(
            f"note: the stack under {stack.state_dir} runs Slurm {stack.config.slurm}; "
            "`relaunch dev down` and remove it to change the release",
            err=True,
        )
    if config is None and clusters not in (["dev"], stack.config.clusters):
        click.echo(
            f"note: the stack under {stack.state_dir} was made with clusters "
            f"{','.join(stack.config.clusters)}; `relaunch dev down` and remove it to change them",
            err=True,
        )
    try:
        status = stack.up(progress=lambda msg: click.echo(f"… {msg}", err=True))
    except RelaunchError as exc:
        _fail(exc)
    click.echo(f"Relaunch dev stack in {stack.state_dir}:")
    _print_status(status)
    click.echo("")
    click.echo(f"Temporal UI: {stack.temporal_ui}")
    if stack.config.services:
        click.echo(f"Console: {stack.console_url} (sign-in tokens in {stack.console_tokens})")
    click.echo("To use this stack from your shell:")
    if len(stack.clusters) > 1:
        for home in stack.clusters:
            click.echo(
                f"# cluster {home.name}: SLURM_CONF={home.slurm.conf}  --cluster {home.name}"
            )
    click.echo(f"export SLURM_CONF={stack.slurm.conf}")
    click.echo(f"export TEMPORAL_ADDRESS={stack.temporal_address}")
    path = [str(Path(sys.executable).parent)]
    if stack.slurm.slurm_root is not None:
        path.insert(0, str(stack.slurm.bin_dir))  # this release's sinfo, squeue, sbatch, ...
    click.echo(f"export PATH={':'.join(path)}:$PATH")
    if not status.healthy:
        sys.exit(1)


@dev.command("down")
@STATE_DIR_OPTION
def dev_down(state_dir: Path) -> None:
    """Stop every process of the local stack, jobs included."""
    if not (state_dir / "stack.json").exists():
        click.echo(f"no stack under {state_dir.resolve()}; nothing to stop")
        return
    try:
        count = Stack(state_dir).down(progress=lambda msg: click.echo(f"… {msg}", err=True))
    except RelaunchError as exc:
        _fail(exc)
    click.echo(f"stack under {state_dir.resolve()} stopped ({count} processes)")


@dev.command("status")
@STATE_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def dev_status(state_dir: Path, as_json: bool) -> None:
    """Show each part of the local stack, its address, and whether it is healthy.

    Exits 1 when any part is not healthy."""
    if not (state_dir / "stack.json").exists():
        click.echo(f"no stack under {state_dir.resolve()}; start one with `relaunch dev up`")
        sys.exit(1)
    status = Stack(state_dir).status()
    if as_json:
        click.echo(status.model_dump_json(indent=2))
    else:
        _print_status(status)
    if not status.healthy:
        sys.exit(1)


@dev.command("reboot-node")
@STATE_DIR_OPTION
@click.option("--cluster", default=None, help="The stack's cluster (default: its first).")
@click.argument("node")
def dev_reboot_node(state_dir: Path, cluster: str | None, node: str) -> None:
    """Reboot NODE of the local cluster the way the dev stack can: stop its slurmd (and the
    job processes on it) and start it again. The dev cluster's node lifecycle reboots with
    this (its `reboot_command`); a GPU fault marked on the node stays."""
    from relaunch.devstack.faults import reboot_node
    from relaunch.models.names import node_name

    if not (state_dir / "stack.json").exists():
        _fail(StackError(f"no stack under {state_dir.resolve()}", hint="relaunch dev up"))
    try:
        home = Stack(state_dir).home(cluster)
        node = node_name(node)
        if node not in home.slurm.nodes:
            raise StackError(f"cluster {home.name} has no node {node!r}")
        reboot_node(home.slurm, node)
    except RelaunchError as exc:
        _fail(exc)
    click.echo(f"{node} of {home.name}: slurmd restarted")


# ---------------------------------------------------------------------- slurm adapter


def _slurm(slurm_conf: Path | None) -> SlurmCli:
    conf = slurm_conf or (Path(os.environ["SLURM_CONF"]) if os.environ.get("SLURM_CONF") else None)
    if conf is None:
        local = Path(".relaunch/slurm/slurm.conf")
        conf = local if local.exists() else None
    return SlurmCli(env={"SLURM_CONF": str(conf.resolve())} if conf else None)


@cli.group()
@click.option(
    "--slurm-conf",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="slurm.conf to use (default: $SLURM_CONF, else the local stack's).",
)
@click.pass_context
def slurm(ctx: click.Context, slurm_conf: Path | None) -> None:
    """Read and act on a Slurm cluster through Relaunch's adapter.

    Every action is idempotent: it reads fresh state, acts only if needed, and verifies."""
    ctx.obj = _slurm(slurm_conf)


def _call(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return _run(coro)
    except RelaunchError as exc:
        _fail(exc)


def _echo_action(result: ActionResult) -> None:
    verb = "done" if result.changed else "unchanged"
    extra = f" — {result.note}" if result.note else ""
    click.echo(printable(f"{result.action} {result.target}: {verb}{extra}"))
    click.echo(printable(f"  before: {result.before}"))
    click.echo(printable(f"  after:  {result.after}"))
    if result.new_job_id:
        click.echo(f"  new job: {result.new_job_id}")


def _job_line(job: Job) -> str:
    nodes = ",".join(job.nodes) or "-"
    return printable(
        f"{job.job_id:>8}  {job.state.value:<13} {job.partition:<8} {nodes:<16} "
        f"restarts={job.restart_count} exit={job.exit_code} {job.reason}"
    ).replace("\n", " ")


@slurm.command("jobs")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, one job per line.")
@click.pass_obj
def slurm_jobs(sched: SlurmCli, as_json: bool) -> None:
    """List every job the controller knows."""
    for job in _call(sched.list_jobs()):
        click.echo(json_text(job.model_dump_json()) if as_json else _job_line(job))


@slurm.command("job")
@click.argument("job_id")
@click.pass_obj
def slurm_job(sched: SlurmCli, job_id: str) -> None:
    """Show one job in full (JSON)."""
    click.echo(json_text(_call(sched.get_job(job_id)).model_dump_json(indent=2)))


def _node_line(node: Node) -> str:
    reason = f"  reason={node.reason!r} by {node.reason_user}" if node.reason else ""
    return f"{node.name:<10} {node.display_state:<24}{reason}"


@slurm.command("nodes")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, one node per line.")
@click.pass_obj
def slurm_nodes(sched: SlurmCli, as_json: bool) -> None:
    """List nodes with state, flags and drain reason."""
    for node in _call(sched.list_nodes()):
        click.echo(json_text(node.model_dump_json()) if as_json else _node_line(node))


@slurm.command("drain")
@click.argument("node")
@click.option("--reason", required=True, help="Why; shown by `sinfo -R`.")
@click.pass_obj
def slurm_drain(sched: SlurmCli, node: str, reason: str) -> None:
    """Drain NODE: running jobs finish, no new job starts there."""
    _echo_action(_call(sched.drain_node(node, reason)))


@slurm.command("resume")
@click.argument("node")
@click.pass_obj
def slurm_resume(sched: SlurmCli, node: str) -> None:
    """Return a drained NODE to service."""
    _echo_action(_call(sched.resume_node(node)))


@slurm.command("requeue")
@click.argument("job_id")
@click.option("--hold", is_flag=True, help="Requeue held (requeuehold).")
@click.option("--exclude", default="", help="Comma-separated nodes to exclude once pending.")
@click.pass_obj
def slurm_requeue(sched: SlurmCli, job_id: str, hold: bool, exclude: str) -> None:
    """Requeue JOB_ID (it restarts from its batch script), optionally excluding nodes."""

    async def go() -> list[ActionResult]:
        results = [await sched.requeue_job(job_id, hold=hold)]
        nodes = [n for n in exclude.split(",") if n]
        if nodes:
            results.append(await sched.exclude_nodes(job_id, nodes))
        return results

    for result in _call(go()):
        _echo_action(result)


@slurm.command("hold")
@click.argument("job_id")
@click.pass_obj
def slurm_hold(sched: SlurmCli, job_id: str) -> None:
    """Hold a pending JOB_ID."""
    _echo_action(_call(sched.hold_job(job_id)))


@slurm.command("release")
@click.argument("job_id")
@click.pass_obj
def slurm_release(sched: SlurmCli, job_id: str) -> None:
    """Release a held JOB_ID."""
    _echo_action(_call(sched.release_job(job_id)))


@slurm.command("exclude")
@click.argument("job_id")
@click.argument("nodes", nargs=-1, required=True)
@click.pass_obj
def slurm_exclude(sched: SlurmCli, job_id: str, nodes: tuple[str, ...]) -> None:
    """Exclude NODES from a pending JOB_ID (added to its own exclusions)."""
    _echo_action(_call(sched.exclude_nodes(job_id, list(nodes))))


@slurm.command("cancel")
@click.argument("job_id")
@click.pass_obj
def slurm_cancel(sched: SlurmCli, job_id: str) -> None:
    """Cancel JOB_ID."""
    _echo_action(_call(sched.cancel_job(job_id)))


@slurm.command("resubmit")
@click.argument("job_id")
@click.option("--exclude", default="", help="Comma-separated nodes the new job must avoid.")
@click.pass_obj
def slurm_resubmit(sched: SlurmCli, job_id: str, exclude: str) -> None:
    """Submit JOB_ID's batch script again as a new job (its parent named in the comment)."""
    nodes = [n for n in exclude.split(",") if n]
    _echo_action(_call(sched.resubmit_job(job_id, exclude=nodes)))


# ---------------------------------------------------------------------- configuration


@cli.group("config")
def config_group() -> None:
    """A cluster's configuration file."""


@config_group.command("check")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    required=True,
    help="The cluster configuration JSON to check.",
)
def config_check(config_path: Path) -> None:
    """Check a cluster configuration without starting anything: every unknown key and every
    value out of its bounds, one `key.path: message` line each; exits 1 on any problem.
    Every process runs the same check when it starts."""
    from relaunch.models.config_check import ConfigError, read_config, summary

    try:
        config = read_config(config_path)
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(printable(line), err=True)
        click.echo(printable(f"error: {exc.message}"), err=True)
        sys.exit(1)
    click.echo(printable(summary(config_path, config)))


from relaunch.cli import audit as audit_commands  # noqa: E402
from relaunch.cli import console as console_commands  # noqa: E402
from relaunch.cli import incidents as incident_commands  # noqa: E402
from relaunch.cli import pause as pause_commands  # noqa: E402
from relaunch.cli import rollout as rollout_commands  # noqa: E402
from relaunch.cli import setup as setup_commands  # noqa: E402
from relaunch.cli import verdicts as verdict_commands  # noqa: E402

incident_commands.register(cli)
verdict_commands.register(cli)
console_commands.register(cli)
rollout_commands.register(cli)
setup_commands.register(cli)
audit_commands.register(cli)
pause_commands.register(cli)

from relaunch.workers import agent as agent_command  # noqa: E402

agent_command.register(cli)


def main() -> None:
    """Entry point. Ends with ``os._exit``: the Temporal client's Rust runtime keeps threads that
    can crash CPython's finalisation of a short-lived process (temporalio/sdk-python#300)."""
    code = 0
    try:
        result = cli.main(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        code = 1
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except RelaunchError as exc:  # anything not caught closer to its command
        click.echo(printable(f"error: {exc}"), err=True)
        code = exit_code(exc)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
