"""Issue 30: the kernel's own messages reach the watcher from the node agent, and nothing a user
writes does.

Real parts: this machine's kernel and its ``/dev/kmsg``, ``relaunch agent --kernel-log kmsg
--post`` as its own process, the console's ``POST /intake/agent`` served over HTTP (uvicorn),
the watcher (its own classes, reading the node's kernel log through ``node_log_pattern``), a
real ``rsyslogd`` with a private configuration, and the unprivileged ``relaunch-mallory``.
The job the watcher watches comes from the in-memory scheduler of the unit tests: this path
does not touch Slurm.

1. The unprivileged user tries every way a user has to write a kernel line: ``logger -p
   kern.err -t kernel`` (logger turns kern into user), a raw ``<3>`` syslog datagram tagged
   ``kernel:`` (which rsyslog keeps as kern), and a write to ``/dev/kmsg`` (refused); root's
   own write to ``/dev/kmsg`` is kept by the kernel with facility LOG_USER.
2. Then a process of that user segfaults: the kernel prints its own report.
3. The agent's path (the node's kernel log written by the receiver) holds the kernel's report,
   tagged ``kernel:``, and none of the forgeries; the watcher reads it and detects the
   segfault on the node, from the node's kernel log.
4. The contrast, the file pattern's caveat: rsyslog's kern file holds the raw datagram as kern
   (and its everything-file the logger line tagged ``kernel:``), and a watcher whose
   ``node_log_pattern`` points at that file takes the forged Xid 79 for the kernel's.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import uvicorn

from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from relaunch.workers.watcher import WatchConfig, Watcher
from tests.adversarial.hostile import HOSTILE_USER, ensure_user
from tests.support.fake_scheduler import FakeScheduler

NODE = "n1"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
FACILITY = (  # each line with its facility and severity: what rsyslog made of it
    "%syslogfacility-text%.%syslogseverity-text% %TIMESTAMP:::date-rfc3339% %HOSTNAME% "
    "%syslogtag%%msg:::sp-if-no-1st-sp%%msg:::drop-last-lf%\\n"
)
RSYSLOG_CONF = """\
global(workDirectory="{d}")
module(load="imuxsock" SysSock.Use="off")
input(type="imuxsock" Socket="{d}/log.sock")
template(name="facility" type="string" string="{facility}")
kern.* action(type="omfile" file="{d}/{node}/kern.log" template="RSYSLOG_FileFormat")
*.* action(type="omfile" file="{d}/all.log" template="facility")
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads /dev/kmsg and runs useradd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def rsyslog() -> Iterator[Path]:
    """A real rsyslogd with a private configuration: a socket of its own that anyone may
    write to (as /dev/log is), the kern facility to ``<dir>/n1/kern.log`` (a central rsyslog's
    per-node file) and everything to ``<dir>/all.log`` with each line's facility."""
    if shutil.which("rsyslogd") is None:
        pytest.fail("rsyslogd is missing: scripts/install-deps.sh installs the rsyslog package")
    d = Path(tempfile.mkdtemp(prefix="relaunch-rsyslog-"))
    d.chmod(0o755)  # the unprivileged user reaches the socket
    (d / NODE).mkdir(mode=0o755)
    (d / "rsyslog.conf").write_text(RSYSLOG_CONF.format(d=d, node=NODE, facility=FACILITY))
    proc = subprocess.Popen(
        ["rsyslogd", "-n", "-f", str(d / "rsyslog.conf"), "-i", str(d / "rsyslogd.pid")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not (d / "log.sock").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else b""
            assert time.monotonic() < deadline, "rsyslogd made no socket"
            time.sleep(0.1)
        yield d
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(d, ignore_errors=True)


class Console:
    """The console app over real HTTP (uvicorn in a thread; this route reads no database)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        tokens_file = root / "tokens.json"
        self.tokens = write_tokens(tokens_file, [(NODE, ConsoleRole.AGENT)])
        tokens_file.chmod(0o600)
        self.config = ClusterConfig(
            name="c1",
            database_url="postgresql://nobody@127.0.0.1:1/none",
            bundle_dir=str(root / "bundles"),
            node_log_pattern=str(root / "nodes" / "{node}" / "kern.log"),
            telemetry_pattern=str(root / "nodes" / "{node}" / "telemetry.jsonl"),
            console=ConsoleSettings(tokens_file=str(tokens_file)),
        )
        app = create_app(self.config, Services(), secret="agent-kernel-path-0123456789")
        self.port = _free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, lifespan="off", log_level="error")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/intake/agent"

    def kern(self) -> Path:
        return self.root / "nodes" / NODE / "kern.log"

    def status(self) -> dict[str, object]:
        try:
            row = json.loads((self.root / "nodes" / NODE / "kern.log.agent.json").read_text())
        except (OSError, ValueError):
            return {}
        return row if isinstance(row, dict) else {}


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    c = Console(tmp_path)
    c.thread.start()
    deadline = time.monotonic() + 20
    while not c.server.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.05)
    try:
        yield c
    finally:
        c.server.should_exit = True
        c.thread.join(10)


@pytest.fixture
def agent(console: Console) -> Iterator[subprocess.Popen[bytes]]:
    """``relaunch agent`` on this node, reading /dev/kmsg, posting to the console."""
    env = {**os.environ, "RELAUNCH_AGENT_TOKEN": console.tokens[NODE]}
    argv = [sys.executable, "-m", "relaunch.cli", "agent", "--node", NODE, "--no-gpu"]
    argv += ["--kernel-log", "kmsg", "--post", console.url, "--heartbeat", "1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while console.status().get("kernel_source") != "kmsg":
            if proc.poll() is not None:
                _, err = proc.communicate()
                pytest.fail(f"the agent exited {proc.returncode}: {err.decode()[-2000:]}")
            assert time.monotonic() < deadline, "no heartbeat from the agent"
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def watcher(pattern: str) -> Watcher:
    """The watcher, reading nodes' kernel logs through ``pattern``, watching one running job
    on the node (what it detects is what ``poll_once`` returns)."""
    job = Job(
        job_id="4242",
        name="train",
        user=HOSTILE_USER,
        state=JobState.RUNNING,
        partition="debug",
        nodes=[NODE],
        node_count=1,
        comment="relaunch=on",
        start_time=datetime.now(UTC),
        submit_time=datetime.now(UTC),
    )
    sched = FakeScheduler(nodes=[Node(name=NODE, state=NodeState.ALLOCATED)], jobs=[job])

    async def deliver(detection: Detection) -> None:  # the handover to Temporal: not here
        pass

    config = WatchConfig(cluster="c1", node_log_pattern=pattern, hang_threshold_s=3600)
    return Watcher(config, sched, deliver)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60
    )


FORGE = r"""
import os, socket, sys
sock, marker, xid = sys.argv[1:4]
u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
u.sendto(f"<3>Dec  5 01:58:39 kernel: {xid} {marker}-datagram".encode(), sock)
try:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
except PermissionError:
    print("kmsg: permission denied")
else:
    os.write(fd, f"<3>{xid} {marker}-kmsg-user".encode())
    print("kmsg: written")
"""
SEGFAULT = "import ctypes, os; print(os.getpid(), flush=True); ctypes.string_at(0)"


async def test_the_kernels_own_line_arrives_trusted_and_a_users_never(
    rsyslog: Path, console: Console, agent: subprocess.Popen[bytes]
) -> None:
    user = ensure_user(HOSTILE_USER)
    assert user.pw_uid != 0
    marker = f"i30forged{os.getpid()}x{int(time.time())}"
    on_agent_path = watcher(console.config.node_log_pattern or "")
    on_rsyslog = watcher(str(rsyslog / "{node}" / "kern.log"))
    for w in (on_agent_path, on_rsyslog):  # the watcher meets the job and its node
        assert await w.poll_once() == []
        assert await w.poll_once() == []

    # 1. Every way a user has to write a kernel line.
    logged = as_user(
        user.pw_name,
        "logger", "-u", str(rsyslog / "log.sock"), "-p", "kern.err", "-t", "kernel",
        f"{XID79} {marker}-logger",
    )  # fmt: skip
    assert logged.returncode == 0, logged.stderr
    forged = as_user(user.pw_name, "python3", "-c", FORGE, str(rsyslog / "log.sock"), marker, XID79)
    assert forged.returncode == 0, forged.stderr
    assert forged.stdout.strip() == "kmsg: permission denied"
    fd = os.open("/dev/kmsg", os.O_WRONLY)  # root's own write: the kernel gives it LOG_USER
    try:
        os.write(fd, f"<3>{XID79} {marker}-kmsg-root".encode())
    finally:
        os.close(fd)

    # 2. A process of the same user segfaults: the kernel's own report.
    pid = None
    deadline = time.monotonic() + 60
    while True:
        crashed = as_user(user.pw_name, "python3", "-c", SEGFAULT)
        assert crashed.returncode == 128 + signal.SIGSEGV, crashed  # runuser says 139
        pid = crashed.stdout.strip()
        said = f"python3[{pid}]: segfault at 0 ip "
        text = console.kern().read_text() if console.kern().exists() else ""
        for _ in range(50):
            if said in text:
                break
            await asyncio.sleep(0.2)
            text = console.kern().read_text() if console.kern().exists() else ""
        if said in text:
            break
        # The kernel rate-limits these reports (printk_ratelimit): another try.
        assert time.monotonic() < deadline, f"the kernel's report of {pid} never arrived: {text}"

    # 3. On the agent's path: the kernel's report, tagged kernel:, and nothing forged.
    lines = text.splitlines()
    [line] = [x for x in lines if said in x]
    print(f"the node's kernel log on the agent's path: {line}")
    assert f" {NODE} kernel: {said}" in line
    assert marker not in text, [x for x in lines if marker in x]
    found_agent = await on_agent_path.poll_once()
    mine = [d for d in found_agent if pid in d.text]
    assert mine, found_agent
    assert [(d.source, d.signature, d.nodes) for d in mine] == [
        (DetectionSource.NODE_LOG, "kernel_segfault", [NODE])
    ], mine
    assert not [d for d in found_agent if "Xid" in d.text or (d.signature or "").startswith("xid")]
    status = console.status()
    assert status["kernel_source"] == "kmsg" and int(str(status["kernel_records"])) >= 1

    # 4. The contrast: what a central rsyslog's files hold, and what a watcher reading them
    # through node_log_pattern makes of it.
    everything = (rsyslog / "all.log").read_text()
    kern_file = (rsyslog / NODE / "kern.log").read_text()
    print(f"rsyslog's files:\n{everything}---\n{kern_file}")
    assert "user.err " in everything and f"kernel: {XID79} {marker}-logger" in everything
    assert "kern.err " in everything and f"{marker}-datagram" in everything
    assert f"kernel: {XID79} {marker}-datagram" in kern_file  # the caveat: a user's kern line
    assert f"{marker}-logger" not in kern_file  # logger itself turns kern into user
    found_rsyslog = await on_rsyslog.poll_once()
    forged = [d for d in found_rsyslog if f"{marker}-datagram" in d.text]
    assert [(d.source, d.signature, d.nodes) for d in forged] == [
        (DetectionSource.NODE_LOG, "xid_79", [NODE])
    ], found_rsyslog
