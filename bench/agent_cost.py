"""What ``relaunch agent`` costs a node: CPU, memory and bytes sent per hour.

Runs the real agent (its own process: ``relaunch agent --no-gpu --kernel-log kmsg --post``)
against a kmsg-format file that a writer fills at a given rate, posting to the real console's
``POST /intake/agent`` (uvicorn, in this process). Each scenario runs ``--seconds`` (30) and
reports the agent's CPU (utime + stime over wall time, from /proc), its resident memory (at the
end and its peak), and what it sent: requests and body bytes, scaled to an hour.

Scenarios:

* idle: this machine's own /dev/kmsg (whatever its kernel logs meanwhile), a heartbeat every
  5 s: most nodes, most of the time;
* busy: 2 kernel messages a second and, every 10 s, a burst of 200 (a link flapping, an Xid
  cascade with its NVRM dump): about 22 messages a second on average, far above what a
  healthy node logs.

NVML is not read (no GPU here): on a GPU node the agent also reads every GPU every
``--interval`` seconds (5), which this does not measure.

    .venv/bin/python bench/agent_cost.py [--seconds 30] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig, ConsoleSettings

NODE = "n1"
TICK = os.sysconf("SC_CLK_TCK")
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
LINK = (
    "mlx5_core 0000:3b:00.0: mlx5_port_module_event:1157: Port module event: module 0, "
    "Cable unplugged"
)


class Counting:
    """An ASGI wrapper that counts the agent's requests and their body bytes."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests = 0
        self.bytes = 0
        self.statuses: dict[int, int] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                self.bytes += len(message.get("body", b""))
            return message

        async def counted_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.requests += 1
                self.statuses[message["status"]] = self.statuses.get(message["status"], 0) + 1
            await send(message)

        await self.app(scope, counted_receive, counted_send)


@dataclass
class Result:
    name: str
    seconds: float
    messages: int
    cpu_percent: float
    rss_mib: float
    peak_mib: float
    requests: int
    body_bytes: int
    written: int
    statuses: dict[int, int]

    @property
    def per_hour(self) -> float:
        return 3600 / self.seconds


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _memory(pid: int) -> tuple[float, float]:
    rss = peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return rss, peak


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scenario(
    name: str, seconds: float, steady: float, burst: int, every: float, *, device: bool = False
) -> Result:
    root = Path(tempfile.mkdtemp(prefix="relaunch-agent-cost-"))
    tokens_file = root / "tokens.json"
    tokens = write_tokens(tokens_file, [(NODE, ConsoleRole.AGENT)])
    tokens_file.chmod(0o600)
    config = ClusterConfig(
        name="bench",
        database_url="postgresql://nobody@127.0.0.1:1/none",
        bundle_dir=str(root / "bundles"),
        node_log_pattern=str(root / "nodes" / "{node}" / "kern.log"),
        console=ConsoleSettings(
            tokens_file=str(tokens_file), intake_events_per_minute=100_000, intake_burst=100_000
        ),
    )
    app = Counting(create_app(config, Services(), secret="agent-cost-bench-0123456789"))
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="error")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    kmsg = root / "kmsg"
    kmsg.write_text("")
    env = {**os.environ, "RELAUNCH_AGENT_TOKEN": tokens[NODE]}
    argv = [sys.executable, "-m", "relaunch.cli", "agent", "--node", NODE, "--no-gpu"]
    argv += ["--kernel-log", "kmsg", "--heartbeat", "5"]
    argv += [] if device else ["--kmsg-path", str(kmsg)]
    argv += ["--post", f"http://127.0.0.1:{port}/intake/agent"]
    agent = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    try:
        time.sleep(3)  # started: imports and the first heartbeat are not the steady cost
        app.requests, app.bytes = 0, 0
        cpu0, t0 = _cpu(agent.pid), time.monotonic()
        seq, messages, next_burst = 1, 0, t0 + every
        with kmsg.open("a") as out:
            while (now := time.monotonic()) < t0 + seconds:
                lines = []
                if steady:
                    lines.append(LINK)
                if burst and now >= next_burst:
                    lines += [XID] * burst
                    next_burst += every
                usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
                for text in lines:
                    out.write(f"3,{seq},{usec},-;{text}\n")
                    seq += 1
                out.flush()
                messages += len(lines)
                time.sleep(1 / steady if steady else 0.5)
        time.sleep(1.5)  # the last records are sent
        wall = time.monotonic() - t0
        cpu = _cpu(agent.pid) - cpu0
        rss, peak = _memory(agent.pid)
        assert agent.poll() is None, agent.stderr.read() if agent.stderr else b""
        kern = root / "nodes" / NODE / "kern.log"
        written = len(kern.read_text().splitlines()) if kern.exists() else 0
        return Result(
            name, wall, messages, 100 * cpu / wall, rss, peak, app.requests, app.bytes,
            written, dict(app.statuses),
        )  # fmt: skip
    finally:
        agent.terminate()
        agent.wait(20)
        server.should_exit = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="per scenario (30)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write a table here")
    args = parser.parse_args()
    results = [
        scenario("idle: /dev/kmsg, heartbeats", args.seconds, 0, 0, 0, device=True),
        scenario("busy: 2/s + 200 every 10 s", args.seconds, 2, 200, 10),
    ]
    head = (
        "| scenario | kernel msgs/s | agent CPU % | RSS MiB (peak) | requests/h | "
        "bytes sent/h | written |"
    )
    rows = [head, "|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(
            f"| {r.name} | {r.messages / r.seconds:.1f} | {r.cpu_percent:.2f} | "
            f"{r.rss_mib:.0f} ({r.peak_mib:.0f}) | {r.requests * r.per_hour:,.0f} | "
            f"{r.body_bytes * r.per_hour / 1e6:,.2f} MB | {r.written}/{r.messages} |"
        )
    table = "\n".join(rows)
    print(table)
    for r in results:
        print(f"{r.name}: HTTP statuses {r.statuses}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
