"""`relaunch agent`: the node agent that reports GPU health (NVML) and kernel lines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import click

from relaunch.connectors.telemetry.kernlog import JOURNAL, JournalReader, KernelLogFile
from relaunch.connectors.telemetry.nvml import (
    DEFAULT_CALL_TIMEOUT,
    NvmlCollector,
    NvmlUnavailableError,
)
from relaunch.models import names
from relaunch.models.errors import InvalidNameError
from relaunch.workers.agent_runtime import Agent, FileSink, HttpSink, Sink, StdoutSink

EX_UNAVAILABLE = 69  # sysexits.h: a service this needs is not there
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
    help=f"Also POST each batch (JSON lines) to this URL, with the bearer token in ${TOKEN_ENV}.",
)
@click.option(
    "--kernel-log",
    default=None,
    help="Also tail the kernel log: a file PATH, or `journal` for journalctl -k.",
)
@click.option(
    "--heartbeat",
    type=float,
    default=5.0,
    show_default=True,
    callback=lambda _ctx, _param, value: _heartbeat(value),
    help="Seconds between heartbeats, 0 for none. With --output, each beat replaces the small "
    "file `heartbeat` beside it (never a telemetry line), and the watcher reports a node whose "
    "agent falls silent (watch.heartbeat_timeout_s); stdout and --post receivers get no "
    "heartbeats. A clean stop removes the file.",
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
    heartbeat: float,
    once: bool,
    call_timeout: float,
) -> None:
    """Report this node's GPU health to the watcher.

    Reads every GPU through NVML (Xid events, uncorrected ECC errors, remapped rows, retired
    pages, NVLink errors, thermal and power slowdowns) and, with --kernel-log, the kernel's
    Xid, SXid and NIC lines. Sends the first full sample at start, then only what changed,
    and, with --output, a heartbeat beside that file every --heartbeat seconds. Without
    --output or --post, samples go to stdout. Stop it with Ctrl-C or SIGTERM.
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
    kernel: KernelLogFile | JournalReader | None = None
    if kernel_log == JOURNAL:
        kernel = JournalReader(name)
    elif kernel_log is not None:
        kernel = KernelLogFile(kernel_log, name)
    collector = NvmlCollector(name, call_timeout=call_timeout)
    runner = Agent(
        node=name,
        collector=collector,
        sinks=sinks,
        interval=interval,
        kernel=kernel,
        heartbeat=heartbeat,
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
        await runner.collector.start()
        if once:
            await runner.once()
        else:
            await runner.run(stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await runner.collector.close()


def register(root: click.Group) -> None:
    """Add `relaunch agent` to the root command."""
    root.add_command(agent)
