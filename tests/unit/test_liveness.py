"""Node liveness probes on real sockets: a listener answers, a closed port refuses, an address
nobody answers times out; the SYN probe is never accepted; the monitor's failure streaks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import pytest

from relaunch.connectors import liveness
from relaunch.connectors.liveness import (
    ConnectProber,
    LivenessMonitor,
    ProbeError,
    ProbeResult,
    ProbeTarget,
    RemoteProber,
    SynProber,
    make_prober,
    raw_sockets_permitted,
    remote_script,
    syn_segment,
    tcp_checksum,
)
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.models.errors import InvalidNameError

RAW = raw_sockets_permitted()
needs_raw = pytest.mark.skipif(
    not RAW, reason="raw sockets are not permitted here (needs root or CAP_NET_RAW)"
)
# An address on this sandbox's own subnet that nobody holds (ARP gets no answer), or, elsewhere,
# a TEST-NET address: either way no SYN-ACK comes back; some hosts say "unreachable" at once.
BLACKHOLE = "192.0.2.77"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock
    sock.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    # Bound but not listening: the port stays ours and the kernel answers RST.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield int(sock.getsockname()[1])
    sock.close()


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def assert_not_accepted(sock: socket.socket) -> None:
    sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        sock.accept()


# ---------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("node", "address", "port"),
    [
        ("n1;reboot", "127.0.0.1", 6818),
        ("-n1", "127.0.0.1", 6818),
        ("n1", "127.0.0.1; reboot", 6818),
        ("n1", "host name", 6818),
        ("n1", "$(reboot)", 6818),
        ("n1", "fe80::1%eth0", 6818),
        ("n1", "", 6818),
        ("n1", "999.1.1.1", 6818),
        ("n1", "a" * 64 + ".example", 6818),
        ("n1", "-x.example", 6818),
        ("n1", "127.0.0.1", 0),
        ("n1", "127.0.0.1", 65536),
        ("n1", "127.0.0.1", True),
    ],
)
def test_invalid_targets_are_refused(node: str, address: str, port: int) -> None:
    with pytest.raises(InvalidNameError):
        ProbeTarget(node, address, port)


def test_valid_targets() -> None:
    for address in ("10.1.2.3", "::1", "fd00::17", "gpu-node-17.cluster.example", "n1"):
        assert ProbeTarget("gpu-17", address, 6818).address == address


def test_the_remote_script_refuses_a_target_that_bypassed_validation() -> None:
    target = ProbeTarget("n1", "127.0.0.1", 6818)
    object.__setattr__(target, "address", "127.0.0.1'); import os; os.system('reboot'); ('")
    with pytest.raises(InvalidNameError):
        remote_script([target], 1.0)


def test_syn_checksum_verifies() -> None:
    src, dst = socket.inet_aton("10.0.0.1"), socket.inet_aton("10.0.0.2")
    segment = syn_segment(src, dst, 40000, 6818, 12345)
    assert tcp_checksum(src, dst, segment) == 0  # a correct checksum sums to zero
    assert segment[13] == 0x02  # SYN only


# ---------------------------------------------------------------------- ConnectProber


async def test_connect_prober_answered_refused_and_silent(
    listener: socket.socket, closed_port: int
) -> None:
    prober = ConnectProber()
    targets = [
        ProbeTarget("up", "127.0.0.1", port_of(listener)),
        ProbeTarget("dead", "127.0.0.1", closed_port),
        ProbeTarget("gone", BLACKHOLE, 6818),
    ]
    start = time.monotonic()
    up, dead, gone = await prober.probe(targets, 0.5)
    assert time.monotonic() - start < 1.5
    assert (up.node, up.ok, up.detail) == ("up", True, "answered")
    assert (dead.ok, dead.detail) == (False, "refused")
    assert not gone.ok
    assert gone.detail == "timeout" or gone.detail.startswith("unreachable")
    listener.settimeout(0.3)
    listener.accept()[0].close()  # the connect probe really connected


async def test_a_name_that_does_not_resolve_is_a_failed_probe() -> None:
    (result,) = await ConnectProber().probe([ProbeTarget("n1", "no-such.invalid", 1)], 0.5)
    assert not result.ok and result.detail.startswith("resolve")


# ---------------------------------------------------------------------- SynProber


@needs_raw
async def test_syn_probe_answers_without_a_connection(
    listener: socket.socket, closed_port: int
) -> None:
    prober = SynProber()
    try:
        targets = [
            ProbeTarget("up", "127.0.0.1", port_of(listener)),
            ProbeTarget("also-up", "localhost", port_of(listener)),
            ProbeTarget("dead", "127.0.0.1", closed_port),
            ProbeTarget("gone", BLACKHOLE, 6818),
        ]
        start = time.monotonic()
        up, also_up, dead, gone = await prober.probe(targets, 0.5)
        took = time.monotonic() - start
        assert (up.ok, up.detail) == (True, "answered")
        assert up.took_s < 0.25
        assert (also_up.ok, also_up.detail) == (True, "answered")
        assert (dead.ok, dead.detail) == (False, "refused")
        assert not gone.ok
        assert gone.detail == liveness.SILENT or gone.detail.startswith("unreachable")
        assert took < 1.0
        # A second round on the same sockets works the same.
        again = await prober.probe(targets[:1], 0.5)
        assert again[0].detail == "answered"
    finally:
        await prober.close()
    assert_not_accepted(listener)


@needs_raw
async def test_syn_probe_over_ipv6() -> None:
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    sock.listen(4)
    prober = SynProber()
    try:
        (result,) = await prober.probe([ProbeTarget("v6", "::1", port_of(sock))], 0.5)
        assert (result.ok, result.detail) == (True, "answered")
        assert_not_accepted(sock)
    finally:
        await prober.close()
        sock.close()


@needs_raw
async def test_syn_prober_round_of_many_nodes_is_one_task(listener: socket.socket) -> None:
    prober = SynProber()
    try:
        targets = [ProbeTarget(f"n{i}", "127.0.0.1", port_of(listener)) for i in range(100)]
        threads = len(os.listdir("/proc/self/task"))
        results = await prober.probe(targets, 0.5)
        assert [r.node for r in results] == [t.node for t in targets]
        assert all(r.detail == "answered" for r in results)
        assert len(os.listdir("/proc/self/task")) <= threads + 1
    finally:
        await prober.close()


# ---------------------------------------------------------------------- RemoteProber


class SubprocessRunner:
    """Runs the command for real on this host, as SshRunner would on the SSH host."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self.prefix = list(prefix)
        self.calls: list[tuple[str, ...]] = []

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        argv = [*self.prefix, *argv]
        if argv[-2:] == ["python3", "-"]:
            argv[-2] = "/usr/bin/python3" if self.prefix else sys.executable
        self.calls.append(tuple(argv))
        start = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run, argv, input=stdin, capture_output=True, text=True, timeout=timeout
        )
        return CommandResult(
            tuple(argv), done.returncode, done.stdout, done.stderr, time.monotonic() - start
        )


class CannedRunner:
    def __init__(self, stdout: str, returncode: int = 0, stderr: str = "") -> None:
        self.result = CommandResult(("python3", "-"), returncode, stdout, stderr, 0.1)

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        return self.result


async def test_remote_prober_runs_its_script(listener: socket.socket, closed_port: int) -> None:
    runner = SubprocessRunner()
    prober = RemoteProber(runner)
    targets = [
        ProbeTarget("up", "127.0.0.1", port_of(listener)),
        ProbeTarget("dead", "127.0.0.1", closed_port),
        ProbeTarget("gone", BLACKHOLE, 6818),
    ]
    up, dead, gone = await prober.probe(targets, 0.5)
    assert len(runner.calls) == 1  # one command per round
    assert (up.node, up.ok, up.detail) == ("up", True, "answered")
    assert (dead.ok, dead.detail) == (False, "refused")
    assert not gone.ok
    assert prober.last_method == ("syn" if RAW else "connect")
    if RAW:
        assert_not_accepted(listener)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root, setpriv and /usr/bin/python3 to run the script as an unprivileged user",
)
async def test_remote_prober_connects_when_not_root(
    listener: socket.socket, closed_port: int
) -> None:
    runner = SubprocessRunner(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    prober = RemoteProber(runner)
    targets = [
        ProbeTarget("up", "127.0.0.1", port_of(listener)),
        ProbeTarget("dead", "127.0.0.1", closed_port),
    ]
    up, dead = await prober.probe(targets, 0.5)
    assert prober.last_method == "connect"
    assert (up.ok, up.detail, dead.ok, dead.detail) == (True, "answered", False, "refused")


async def test_remote_prober_reads_its_answer_defensively() -> None:
    targets = [ProbeTarget("n1", "10.0.0.1", 6818), ProbeTarget("n2", "10.0.0.2", 6818)]
    answer = (
        '{"node": "n1", "ok": true, "detail": "answered", "took_s": 0.01}\n'
        '{"node": "n9", "ok": true, "detail": "answered", "took_s": 0.01}\n'
        '{"node": "n2", "ok": "yes", "detail": "answered", "took_s": 0.01}\n'
        "not json\n[1, 2]\n"
    )
    n1, n2 = await RemoteProber(CannedRunner(answer)).probe(targets, 1.0)
    assert (n1.ok, n1.detail) == (True, "answered")
    assert (n2.ok, n2.detail) == (False, "no answer from the probe host")
    with pytest.raises(ProbeError):
        await RemoteProber(CannedRunner("x" * 100_000)).probe(targets, 1.0)
    with pytest.raises(ProbeError):
        await RemoteProber(CannedRunner("garbage\n")).probe(targets, 1.0)
    with pytest.raises(ProbeError, match="exit 127"):
        await RemoteProber(CannedRunner("", 127, "python3: not found")).probe(targets, 1.0)


# ---------------------------------------------------------------------- make_prober


def test_make_prober_choices() -> None:
    assert isinstance(make_prober("auto", runner=SubprocessRunner()), RemoteProber)
    assert make_prober("auto").method == ("syn" if RAW else "connect")
    assert isinstance(make_prober("connect"), ConnectProber)
    assert isinstance(make_prober("ssh", runner=SubprocessRunner()), RemoteProber)
    if RAW:
        assert isinstance(make_prober("syn"), SynProber)
    else:
        with pytest.raises(ProbeError):
            make_prober("syn")
    with pytest.raises(ValueError):
        make_prober("ssh")
    with pytest.raises(ValueError):
        make_prober("icmp")


# ---------------------------------------------------------------------- LivenessMonitor


class ScriptedProber:
    """Answers from a table the test changes (node -> ok); records every round."""

    method = "connect"

    def __init__(self, delay: float = 0.0) -> None:
        self.up: dict[str, bool] = {}
        self.rounds: list[list[str]] = []
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_next = False

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.rounds.append([t.node for t in targets])
            await asyncio.sleep(self.delay)
            if self.fail_next:
                self.fail_next = False
                raise ProbeError("the SSH host is down")
            return [
                ProbeResult(t.node, self.up.get(t.node, True), "answered", 0.001)
                if self.up.get(t.node, True)
                else ProbeResult(t.node, False, "timeout", timeout_s)
                for t in targets
            ]
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        return None


def targets(*nodes: str) -> list[ProbeTarget]:
    return [ProbeTarget(n, "10.0.0.1", 6818 + i) for i, n in enumerate(nodes)]


async def test_consecutive_failures_make_a_node_unreachable() -> None:
    prober = ScriptedProber()
    monitor = LivenessMonitor(prober, failures=3)
    monitor.watch(targets("n1", "n2"))
    await monitor.probe_once()
    state = monitor.state("n1")
    assert state is not None and state.failures == 0 and state.last_ok is not None
    prober.up["n1"] = False
    await monitor.probe_once()
    first = monitor.state("n1")
    assert first is not None and first.failures == 1 and first.failing_since is not None
    assert first.detail == "timeout"
    await monitor.probe_once()
    assert monitor.unreachable() == {}
    await monitor.probe_once()
    down = monitor.unreachable()
    assert list(down) == ["n1"]
    assert down["n1"].failures == 3
    assert down["n1"].failing_since == first.failing_since  # the streak's first failure
    assert monitor.stats.rounds == 4 and monitor.stats.probes == 8 and monitor.stats.failed == 3
    prober.up["n1"] = True
    await monitor.probe_once()
    back = monitor.state("n1")
    assert back is not None and back.failures == 0 and back.failing_since is None
    assert monitor.unreachable() == {}


async def test_watch_replaces_targets_and_restarts_changed_ones() -> None:
    prober = ScriptedProber()
    prober.up.update(n1=False, n2=False)
    monitor = LivenessMonitor(prober, failures=1)
    monitor.watch(targets("n1", "n2"))
    await monitor.probe_once()
    assert set(monitor.unreachable()) == {"n1", "n2"}
    moved = ProbeTarget("n2", "10.0.0.99", 6818)
    monitor.watch([ProbeTarget("n1", "10.0.0.1", 6818), moved, *targets("n3")])
    state = monitor.state("n1")
    assert state is not None and state.failures == 1  # unchanged target keeps its streak
    state = monitor.state("n2")
    assert state is not None and state.failures == 0  # a new address starts afresh
    monitor.watch(targets("n3"))
    assert monitor.state("n1") is None and monitor.unreachable() == {}
    await monitor.probe_once()
    assert prober.rounds[-1] == ["n3"]


async def test_one_probe_per_node_per_round() -> None:
    prober = ScriptedProber()
    monitor = LivenessMonitor(prober)
    # Three jobs share n1: the watcher passes it three times.
    monitor.watch([*targets("n1", "n2"), *targets("n1"), *targets("n1")])
    await monitor.probe_once()
    assert sorted(prober.rounds[0]) == ["n1", "n2"]


async def test_a_prober_error_changes_no_state_and_run_keeps_going() -> None:
    prober = ScriptedProber()
    prober.up["n1"] = False
    monitor = LivenessMonitor(prober, interval_s=0.05, failures=2)
    monitor.watch(targets("n1"))
    await monitor.probe_once()
    prober.fail_next = True
    with pytest.raises(ProbeError):
        await monitor.probe_once()
    state = monitor.state("n1")
    assert state is not None and state.failures == 1
    assert monitor.round_done.is_set()
    prober.fail_next = True
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(task, 1.0)
    assert monitor.stats.errors == 1
    assert "n1" in monitor.unreachable()


async def test_run_keeps_the_pace_and_never_overlaps_rounds() -> None:
    prober = ScriptedProber(delay=0.15)  # each round overruns its 0.1 s slot
    monitor = LivenessMonitor(prober, interval_s=0.1, timeout_s=0.1)
    monitor.watch(targets("n1"))
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))
    await asyncio.sleep(0.95)
    stop.set()
    await asyncio.wait_for(task, 1.0)
    assert prober.max_in_flight == 1
    assert 5 <= len(prober.rounds) <= 7  # back to back, not one slot skipped per round

    fast = ScriptedProber()
    monitor = LivenessMonitor(fast, interval_s=0.1)
    monitor.watch(targets("n1"))
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))
    await asyncio.wait_for(monitor.round_done.wait(), 1.0)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(task, 1.0)
    assert 5 <= len(fast.rounds) <= 7  # on schedule, not as fast as possible


async def test_monitor_over_real_sockets_sees_a_node_die(listener: socket.socket) -> None:
    prober = make_prober("auto")
    monitor = LivenessMonitor(prober, interval_s=0.1, timeout_s=0.3, failures=2)
    monitor.watch([ProbeTarget("n1", "127.0.0.1", port_of(listener))])
    try:
        await monitor.probe_once()
        assert monitor.unreachable() == {}
        listener.close()  # slurmd died: the port now refuses
        await monitor.probe_once()
        await monitor.probe_once()
        down = monitor.unreachable()
        assert list(down) == ["n1"] and down["n1"].detail == "refused"
    finally:
        await prober.close()


def test_monitor_refuses_silly_settings() -> None:
    prober = ScriptedProber()
    for kwargs in ({"interval_s": 0}, {"timeout_s": 0}, {"timeout_s": 600}, {"failures": 0}):
        with pytest.raises(ValueError):
            LivenessMonitor(prober, **kwargs)


def test_state_is_a_copy() -> None:
    monitor = LivenessMonitor(ScriptedProber())
    monitor.watch(targets("n1"))
    state = monitor.state("n1")
    assert state is not None
    state.failures = 99
    again = monitor.state("n1")
    assert again is not None and again.failures == 0
    assert monitor.unreachable() == {}


@needs_raw
async def test_syn_prober_connects_to_ipv6_nodes_without_a_raw_ipv6_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    sock.listen(4)
    real = liveness.syn._RawChannel

    def no_raw_ipv6(family: int) -> liveness.syn._RawChannel:
        if family == socket.AF_INET6:
            raise PermissionError(1, "Operation not permitted")
        return real(family)

    monkeypatch.setattr(liveness.syn, "_RawChannel", no_raw_ipv6)
    prober = SynProber()
    try:
        v6, v4 = await prober.probe(
            [ProbeTarget("v6", "::1", port_of(sock)), ProbeTarget("v4", BLACKHOLE, 6818)], 0.5
        )
        assert (v6.ok, v6.detail) == (True, "answered")
        assert not v4.ok
        sock.settimeout(0.3)
        sock.accept()[0].close()  # a real connection: the fallback connected
    finally:
        await prober.close()
        sock.close()


async def test_a_prober_that_cannot_probe_is_an_error_not_a_dead_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_raw(family: int) -> liveness.syn._RawChannel:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(liveness.syn, "_RawChannel", no_raw)
    monitor = LivenessMonitor(SynProber(), failures=1)
    monitor.watch(targets("n1"))
    with pytest.raises(ProbeError, match="raw socket"):
        await monitor.probe_once()
    state = monitor.state("n1")
    assert state is not None and state.failures == 0 and monitor.unreachable() == {}


LISTEN_AND_WAIT = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


@needs_raw
async def test_a_frozen_process_still_answers_syn_probes() -> None:
    """What the module docstring admits: the kernel answers for a SIGSTOPped listener."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LISTEN_AND_WAIT, stdout=asyncio.subprocess.PIPE
    )
    prober = SynProber()
    try:
        assert proc.stdout is not None
        port = int(await asyncio.wait_for(proc.stdout.readline(), 10))
        os.kill(proc.pid, signal.SIGSTOP)
        (result,) = await prober.probe([ProbeTarget("frozen", "127.0.0.1", port)], 0.5)
        assert (result.ok, result.detail) == (True, "answered")
    finally:
        await prober.close()
        proc.kill()
        await asyncio.wait_for(proc.wait(), 10)


@needs_raw
async def test_a_silent_node_gets_its_syn_twice_per_round() -> None:
    """A listener whose accept queue is full drops SYNs: the probe gets no SYN-ACK, and a
    sniffer on loopback sees the SYN sent again at half the timeout, with a bare ACK that the
    kernel resets: the node is up, its listen queue full (a backlog flood, not a dead host)."""
    full = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = port_of(full)
    queued = []
    for _ in range(2):  # never accepted: the accept queue (backlog + 1) is full
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(("127.0.0.1", port))
        queued.append(client)
    await asyncio.sleep(0.1)
    sniffer = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    sniffer.setblocking(False)
    # The sniffer sees every TCP packet on the machine (other tests' servers too, in parallel):
    # a buffer large enough that none of ours is dropped before it is read.
    sniffer.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 64 << 20)
    prober = SynProber()
    try:
        (result,) = await prober.probe([ProbeTarget("silent", "127.0.0.1", port)], 0.6)
        assert (result.ok, result.detail) == (False, liveness.LISTEN_FULL)
        ours = prober._channels[socket.AF_INET].port
        syns = acks = resets = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                parsed = liveness.parse_reply(sniffer.recv(65535), True)
                if parsed and parsed[1:3] == (ours, port):
                    syns += parsed[4] == 0x02
                    acks += parsed[4] == 0x10
                if parsed and parsed[1:3] == (port, ours):
                    resets += bool(parsed[4] & 0x04)
        assert (syns, acks, resets) == (2, 1, 1)
    finally:
        await prober.close()
        sniffer.close()
        for client in queued:
            client.close()
        full.close()
