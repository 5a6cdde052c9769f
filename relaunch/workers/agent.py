"""`relaunch agent`: the node agent that reports GPU health (NVML) and kernel lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from relaunch.connectors.telemetry.kernlog import (
    JOURNAL,
    KMSG,
    KMSG_PATH,
    JournalReader,
    KernelLogFile,
    KmsgReader,
)
from relaunch.connectors.telemetry.nvml import (
    DEFAULT_CALL_TIMEOUT,
    NvmlCollector,
    NvmlUnavailableError,
)
from relaunch.models import names
from relaunch.models.errors import InvalidNameError
from relaunch.workers.agent_runtime import (
    Agent,
    FileSink,
    HttpSink,
    KernelSource,
    Sink,
    StdoutSink,
    load_kmsg_state,
)

EX_UNAVAILABLE = 69  # sysexits.h: a service this needs is not there
EX_NOPERM = 77  # sysexits.h: not allowed to read what it must
TOKEN_ENV = "RELAUNCH_AGENT_TOKEN"


@click.command("agent")
@click.option(
    "--node", default=None, help="This node's name as Slurm knows it [default: short hostname]."
)
@click.option(
    "--interval",
    type=click.FloatRange(0.2, 3600),
    default=5.0,
    show_default=True,
    help="Seconds between counter reads (Xid events are sent as they arrive).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append samples to this file, one JSON object a line "
    "(e.g. .relaunch/nodes/<node>/telemetry.jsonl on a shared filesystem).",
)
@click.option(
    "--post",
    "post_url",
    default=None,
    help=f"Also POST each batch (JSON lines) to this URL, with the bearer token in ${TOKEN_ENV}: "
    "the console's POST /intake/agent (docs/agent.md), with a token of role agent named after "
    "this node.",
)
@click.option(
    "--kernel-log",
    default=None,
    help="Also read the kernel's messages: `kmsg` (/dev/kmsg: the kernel's own records, "
    "facility 0 only, sent whole to --post), `journal` (journalctl -k: journald's kernel "
    "transport), or a file PATH (e.g. an rsyslog kern.log: matched lines only, never sent as "
    "the kernel's own).",
)
@click.option(
    "--kmsg-path",
    default=KMSG_PATH,
    show_default=True,
    help="With --kernel-log kmsg: the device, or a file or FIFO of records in its format.",
)
@click.option(
    "--kmsg-state",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --kernel-log kmsg: remember the last record read in this file and, after a "
    "restart in the same boot, go on after it (default: start at the end of the buffer).",
)
@click.option(
    "--no-gpu",
    is_flag=True,
    help="Read no GPU (no NVML): the kernel's messages and heartbeats only.",
)
@click.option(
    "--heartbeat",
    type=float,
    default=5.0,
    show_default=True,
    callback=lambda _ctx, _param, value: _heartbeat(value),
    help="Seconds between heartbeats, 0 for none. With --output, each beat replaces the small "
    "file `heartbeat` beside it (never a telemetry line), and the watcher reports a node whose "
    "agent falls silent (watch.heartbeat_timeout_s); a --post receiver gets a heartbeat line "
    "(and writes that file for the watcher); stdout gets no heartbeats. A clean stop removes "
    "the file.",
)
@click.option("--once", is_flag=True, help="Read every GPU once, print JSON lines, exit.")
@click.option(
    "--call-timeout",
    type=click.FloatRange(0.1, 300),
    default=DEFAULT_CALL_TIMEOUT,
    show_default=True,
    help="Seconds any one NVML call may take before the GPU is reported hung.",
)
def agent(
    node: str | None,
    interval: float,
    output: Path | None,
    post_url: str | None,
    kernel_log: str | None,
    kmsg_path: str,
    kmsg_state: Path | None,
    no_gpu: bool,
    heartbeat: float,
    once: bool,
    call_timeout: float,
) -> None:
    """Report this node's GPU health and kernel messages to the watcher.

    Reads every GPU through NVML (Xid events, uncorrected ECC errors, remapped rows, retired
    pages, NVLink errors, thermal and power slowdowns) and, with --kernel-log, the kernel's
    Xid, SXid and NIC lines. Sends the first full sample at start, then only what changed,
    and, with --output, a heartbeat beside that file every --heartbeat seconds. Without
    --output or --post, samples go to stdout. Stop it with Ctrl-C or SIGTERM.

    With --kernel-log kmsg and --post, every message the kernel itself logs (facility 0 of
    /dev/kmsg; never a user-space line) goes to the receiver, which writes it into the node's
    kernel log for the watcher; a heartbeat line goes with it every --heartbeat seconds.
    """
    name = node or socket.gethostname().split(".")[0]
    try:
        names.node_name(name)
    except InvalidNameError as exc:
        raise click.BadParameter(str(exc), param_hint="--node") from None
    if post_url is not None and not post_url.startswith(("http://", "https://")):
        raise click.BadParameter("must be an http:// or https:// URL", param_hint="--post")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    sinks: list[Sink] = []
    if once or (output is None and post_url is None):
        sinks.append(StdoutSink())
    if output is not None:
        sinks.append(FileSink(output))
    if post_url is not None:
        sinks.append(HttpSink(post_url, os.environ.get(TOKEN_ENV)))
    if no_gpu and kernel_log is None and post_url is None:
        raise click.UsageError("--no-gpu reads nothing without --kernel-log or --post")
    kernel: KernelSource | None = None
    if kernel_log == JOURNAL:
        kernel = JournalReader(name)
    elif kernel_log == KMSG:
        after = load_kmsg_state(kmsg_state) if kmsg_state is not None else None
        try:
            kernel = KmsgReader(name, path=kmsg_path, after_seq=after)
        except PermissionError:
            click.echo(
                f"relaunch agent: cannot read {kmsg_path}: permission denied; run it as root "
                "(or with CAP_SYSLOG where kernel.dmesg_restrict is 1)",
                err=True,
            )
            sys.exit(EX_NOPERM)
        except OSError as exc:
            click.echo(f"relaunch agent: cannot read {kmsg_path}: {exc.strerror}", err=True)
            sys.exit(EX_UNAVAILABLE)
    elif kernel_log is not None:
        kernel = KernelLogFile(kernel_log, name)
    collector = None if no_gpu else NvmlCollector(name, call_timeout=call_timeout)
    runner = Agent(
        node=name,
        collector=collector,
        sinks=sinks,
        interval=interval,
        kernel=kernel,
        heartbeat=heartbeat,
        kmsg_state=kmsg_state,
    )
    try:
        asyncio.run(_main(runner, once))
    except NvmlUnavailableError as exc:
        hint = (
            "run it on a GPU node"
            if exc.message.startswith("no NVIDIA GPU")
            else ("check the NVIDIA driver with nvidia-smi")
        )
        click.echo(f"relaunch agent: {exc.message}; {hint}", err=True)
        sys.exit(EX_UNAVAILABLE)


def _heartbeat(value: float) -> float:
    """0 (no heartbeat) or 0.5 to 3600 seconds."""
    if value != 0 and not 0.5 <= value <= 3600:
        raise click.BadParameter("must be 0 (off) or between 0.5 and 3600 seconds")
    return value


async def _main(runner: Agent, once: bool) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if runner.collector is not None:
            await runner.collector.start()
        if once:
            await runner.once()
        else:
            await runner.run(stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if runner.collector is not None:
            with contextlib.suppress(Exception):
                await runner.collector.close()


@click.command("agents")
@click.option(
    "--stale-after",
    type=click.FloatRange(1, 86400),
    default=60.0,
    show_default=True,
    help="Seconds without a batch after which an agent is stale (its heartbeat is every 5 s).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON, one agent per line.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Cluster configuration JSON.",
)
@click.option("--cluster", default="dev", show_default=True, help="Cluster name.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".relaunch"),
    show_default=True,
    help="Where `relaunch dev up` keeps cluster configurations.",
)
def agents(
    stale_after: float, as_json: bool, config_path: Path | None, cluster: str, state_dir: Path
) -> None:
    """The node agents that post to this cluster's console (POST /intake/agent): each node's
    last batch, heartbeat, kernel source, /dev/kmsg sequence number, records lost (overwritten
    before the agent read them) and lines dropped (undelivered). Exits 1 when an agent is
    stale (no batch for --stale-after seconds and not stopped cleanly), for a monitoring check.
    """
    from relaunch.cli.incidents import load_config
    from relaunch.console.intake.agent import agent_statuses
    from relaunch.models.errors import RelaunchError

    try:
        config = load_config(config_path, cluster, state_dir)
    except RelaunchError as exc:
        raise click.ClickException(exc.message) from None
    if not config.node_log_pattern:
        raise click.ClickException(
            f"cluster {config.name} has no node_log_pattern: no agent posts to it (docs/agent.md)"
        )
    now = datetime.now(UTC)
    stale = 0
    rows = agent_statuses(config.node_log_pattern)
    if not rows and not as_json:
        click.echo(f"no agent has posted to cluster {config.name} yet", err=True)
    for row in rows:
        last = _when(row.get("last_batch"))
        age = (now - last).total_seconds() if last else None
        state = "stopped" if row.get("stopped") else "ok"
        if state == "ok" and (age is None or age > stale_after):
            state, stale = "STALE", stale + 1
        row = {**row, "age_s": round(age, 1) if age is not None else None, "state": state}
        if as_json:
            click.echo(json.dumps(row))
        else:
            said = f"{age:.0f}s ago" if age is not None else "never"
            click.echo(
                f"{row.get('node')}\t{state}\tlast batch {said}\t"
                f"kernel {row.get('kernel_source') or '-'} seq {row.get('kmsg_seq', '-')}\t"
                f"lost {row.get('kernel_lost', 0)} dropped {row.get('dropped', 0)}"
            )
    if stale:
        sys.exit(1)


def _when(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def register(root: click.Group) -> None:
    """Add `relaunch agent` and `relaunch agents` to the root command."""
    root.add_command(agent)
    root.add_command(agents)
