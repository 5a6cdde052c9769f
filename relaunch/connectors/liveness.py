"""Node liveness probes: is each allocated node's slurmd still reachable, second by second?

slurmctld notices a dead node only after ``SlurmdTimeout`` (about 100 s at best on a default
cluster). The watcher instead probes every watched node's slurmd port once per second,
concurrently, with a short timeout; ``failures`` consecutive failed probes make the node
unreachable (``LivenessMonitor.unreachable``), which the watcher turns into a trusted detection.

**Why a half-open (SYN) probe.** A plain TCP connect and close makes slurmd log errors for
every probe (Slurm 22.05 writes two: "slurm_receive_msg_and_forward: ... Zero Bytes were
transmitted or received" and "service_connection: slurm_receive_msg: Zero Bytes ..."; with
SO_LINGER 0, "Connection reset by peer"): 172,800 lines a day per node at 1 probe/s. The
default ``SynProber`` therefore sends only a TCP SYN from a raw socket (root or CAP_NET_RAW).
The node's kernel answers on behalf of slurmd's listening socket; our kernel, which has no
connection for that SYN-ACK, answers it with a RST, so the handshake never completes, slurmd's
``accept()`` never returns and slurmd neither logs nor spends any CPU on the probe.

What a probe result means (``ProbeResult.detail``):

- ``answered`` (ok): a SYN-ACK (or, for ``ConnectProber``, an accepted connection). The node's
  kernel is up, reachable over the network, and slurmd's listening socket exists.
- ``refused`` (failed): a RST. The host is up but nothing listens on the port: slurmd is dead.
- ``timeout`` (failed): no answer within the timeout: the host is powered off, panicked, or off
  the fabric (or a firewall drops the probe).
- ``unreachable: ...``, ``resolve: ...`` or another short error text (failed): the local side
  could not even send the probe (no route, name not resolvable).

**What it cannot see.** A node whose kernel is alive but whose slurmd process is frozen
(SIGSTOP, stuck in D state) still answers SYN probes: the kernel answers SYNs for a listening
socket without the process (tests/unit/test_liveness.py and bench/probe_cost.py show it). The
same holds for ``ConnectProber`` until the listen backlog fills. The node agent's heartbeat
covers that case, not these probes.

A prober raises (a ``RelaunchError``) only when it could not probe at all, for instance when the
SSH host of ``RemoteProber`` is unreachable: that says nothing about the nodes, so the monitor
counts it as an error and leaves every node's state untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import inspect
import ipaddress
import json
import logging
import os
import re
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, cast

from relaunch.models.errors import InvalidNameError, RelaunchError
from relaunch.models.names import node_name

if TYPE_CHECKING:  # relaunch.connectors.slurm imports this module
    from relaunch.connectors.slurm.runner import CommandResult

log = logging.getLogger("relaunch.liveness")

MAX_TARGETS = 4096  # one round probes at most this many nodes
MAX_TIMEOUT_S = 30.0
_DNS_NAME = re.compile(
    r"(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_RESOLVE_TTL_S = 60.0
_DETAIL_MAX = 120
_REMOTE_MARGIN_S = 10.0  # the remote script's start-up and the SSH round trip
_ANSWER_LINE_MAX = 512  # bytes per target in RemoteProber's answer
_SO_ATTACH_FILTER = 26


# ---------------------------------------------------------------------- targets and results


def probe_address(value: object) -> str:
    """Return ``value`` if it is an IPv4/IPv6 literal or a DNS name, else raise
    InvalidNameError (scoped IPv6 addresses such as ``fe80::1%eth0`` are refused)."""
    if isinstance(value, str) and "%" not in value:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(value)
            return value
        if _DNS_NAME.fullmatch(value) and not value.replace(".", "").isdigit():
            return value
    raise InvalidNameError(
        f"invalid node address {value!r}", hint="an address must be an IP literal or a DNS name"
    )


def probe_port(value: object) -> int:
    """Return ``value`` if it is a TCP port number (1-65535), else raise InvalidNameError."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
        return value
    raise InvalidNameError(f"invalid slurmd port {value!r}", hint="a port is 1-65535")


@dataclass(frozen=True)
class ProbeTarget:
    """One node's slurmd: Slurm's node name, its NodeAddr and its port. Validated on creation."""

    node: str
    address: str
    port: int

    def __post_init__(self) -> None:
        node_name(self.node)
        probe_address(self.address)
        probe_port(self.port)


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe of one node (see the module docstring for ``detail``)."""

    node: str
    ok: bool
    detail: str
    took_s: float


class ProbeError(RelaunchError):
    """A prober could not probe at all (its SSH host failed, its answer was unreadable): nothing
    is known about the nodes; retry on the next round."""

    retryable = True


class Prober(Protocol):
    """Probes a set of nodes once each, concurrently; one result per target, in order."""

    method: str

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        """Probe every target once; no probe lasts longer than ``timeout_s``."""
        ...

    async def close(self) -> None:
        """Release sockets and connections."""
        ...


def _check_round(targets: Sequence[ProbeTarget], timeout_s: float) -> float:
    if len(targets) > MAX_TARGETS:
        raise ValueError(f"{len(targets)} targets in one round; at most {MAX_TARGETS}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"probe timeout {timeout_s!r}s; must be in (0, {MAX_TIMEOUT_S:g}]")
    return float(timeout_s)


def _short(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return (text or type(exc).__name__)[:_DETAIL_MAX]


def _failure_detail(exc: OSError) -> str:
    if exc.errno == errno.ECONNREFUSED:
        return "refused"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return f"unreachable: {_short(exc)}"
    return _short(exc)


# ---------------------------------------------------------------------- the SYN packet
# These functions (and the BPF helpers below) use the standard library only: RemoteProber sends
# their source to the probe host in its script, so the local and the remote probe share them.


def tcp_checksum(src: bytes, dst: bytes, segment: bytes) -> int:
    """The TCP checksum of ``segment`` from ``src`` to ``dst`` (4- or 16-byte addresses)."""
    if len(src) == 4:
        pseudo = src + dst + struct.pack("!BBH", 0, 6, len(segment))
    else:
        pseudo = src + dst + struct.pack("!IxxxB", len(segment), 6)
    data = pseudo + segment
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def syn_segment(src: bytes, dst: bytes, sport: int, dport: int, seq: int) -> bytes:
    """A TCP SYN with an MSS option (as real clients send) from ``src:sport`` to ``dst:dport``."""
    options = struct.pack("!BBH", 2, 4, 1460)
    header = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 6 << 4, 0x02, 64240, 0, 0)
    segment = header + options
    checksum = tcp_checksum(src, dst, segment)
    return segment[:16] + struct.pack("!H", checksum) + segment[18:]


def parse_reply(packet: bytes, ip_header: bool) -> tuple[bytes, int, int, int, int] | None:
    """``(source address, source port, destination port, ack, flags)`` of a TCP packet read
    from a raw socket (IPv4 packets carry their IP header, IPv6 ones do not: the source
    address of an IPv6 packet is then empty and the caller takes it from recvfrom)."""
    src = b""
    if ip_header:
        if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != 6:
            return None
        src = packet[12:16]
        packet = packet[(packet[0] & 0x0F) * 4 :]
    if len(packet) < 20:
        return None
    sport, dport, _seq, ack, _off, flags = struct.unpack("!HHIIBB", packet[:14])
    return src, sport, dport, ack, flags


def source_address(family: int, address: str, port: int) -> str:
    """The local address the kernel would use to reach ``address`` (a routing lookup)."""
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.connect((address, port))
        return str(udp.getsockname()[0])


def reserve_port(family: int) -> socket.socket:
    """A TCP socket bound to a fresh port and never connected: while it is open no local
    connection can use the port, and the kernel answers every SYN-ACK sent to it with a RST."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    return sock


_SYN_ACK, _RST = 0x12, 0x04


def classify(flags: int) -> str | None:
    """``answered`` for a SYN-ACK, ``refused`` for a RST, None for anything else."""
    if flags & _RST:
        return "refused"
    if flags & _SYN_ACK == _SYN_ACK:
        return "answered"
    return None


def raw_sockets_permitted() -> bool:
    """Whether this process may open a raw TCP socket (root or CAP_NET_RAW)."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close()
    except OSError:
        return False
    return True


def _port_filter(port: int, ip_header: bool) -> bytes:
    """A classic BPF program keeping only TCP packets to ``port``: a raw TCP socket otherwise
    receives a copy of every TCP packet the host receives."""
    ld_port = [(0xB1, 0, 0, 0), (0x48, 0, 0, 2)] if ip_header else [(0x28, 0, 0, 2)]
    program = [*ld_port, (0x15, 0, 1, port), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0)]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def _attach_filter(sock: socket.socket, program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)


# ---------------------------------------------------------------------- SynProber


@dataclass
class _Pending:
    seq: int
    sent: float
    future: asyncio.Future[tuple[str, float]]
    segment: bytes = b""
    address: str = ""


class _Resolver:
    """Host names to addresses, cached for a minute; a stale answer is kept when DNS fails."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, int, str]] = {}

    async def resolve(self, host: str) -> tuple[int, str]:
        with contextlib.suppress(ValueError):
            ip = ipaddress.ip_address(host)
            return (socket.AF_INET if ip.version == 4 else socket.AF_INET6), host
        cached = self._cache.get(host)
        if cached and time.monotonic() - cached[0] < _RESOLVE_TTL_S:
            return cached[1], cached[2]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
        except OSError:
            if cached:
                return cached[1], cached[2]
            raise
        family, address = infos[0][0], str(infos[0][4][0])
        if len(self._cache) >= MAX_TARGETS:
            self._cache.clear()
        self._cache[host] = (time.monotonic(), family, address)
        return family, address


class _RawChannel:
    """One raw socket of one address family, its reserved source port and the probes waiting
    for an answer on it."""

    def __init__(self, family: int) -> None:
        self.family = family
        self.ip_header = family == socket.AF_INET
        self.loop = asyncio.get_running_loop()
        self.sock = socket.socket(family, socket.SOCK_RAW, socket.IPPROTO_TCP)
        try:
            self.reserved = reserve_port(family)
        except OSError:
            self.sock.close()
            raise
        self.port = int(self.reserved.getsockname()[1])
        self.sock.setblocking(False)
        with contextlib.suppress(OSError):  # without the filter it still works, only dearer
            _attach_filter(self.sock, _port_filter(self.port, self.ip_header))
        with contextlib.suppress(BlockingIOError):
            while self.sock.recv(65535):  # what arrived before the filter was attached
                pass
        self.pending: dict[tuple[bytes, int], _Pending] = {}
        self._sources: dict[str, tuple[float, bytes]] = {}
        self.loop.add_reader(self.sock.fileno(), self._readable)

    def source(self, address: str, port: int) -> bytes:
        """Our address towards ``address`` (it enters the checksum), re-read every minute so
        that a changed route or address never leaves every probe unanswered."""
        now = time.monotonic()
        cached = self._sources.get(address)
        if cached is not None and now - cached[0] < _RESOLVE_TTL_S:
            return cached[1]
        src = socket.inet_pton(self.family, source_address(self.family, address, port))
        if len(self._sources) >= MAX_TARGETS:
            self._sources.clear()
        self._sources[address] = (now, src)
        return src

    def _readable(self) -> None:
        for _ in range(1024):  # bounded work per wake-up
            try:
                packet, peer = self.sock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("raw socket read failed: %s", exc)
                return
            parsed = parse_reply(packet, self.ip_header)
            if parsed is None:
                continue
            src, sport, dport, ack, flags = parsed
            if not self.ip_header:
                src = socket.inet_pton(self.family, str(peer[0]))
            waiting = self.pending.get((src, sport))
            outcome = classify(flags)
            if (
                dport == self.port
                and waiting is not None
                and outcome is not None
                and ack == (waiting.seq + 1) & 0xFFFFFFFF
                and not waiting.future.done()
            ):
                waiting.future.set_result((outcome, time.monotonic() - waiting.sent))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.reserved.close()
        for waiting in self.pending.values():
            if not waiting.future.done():
                waiting.future.cancel()
        self.pending.clear()


class SynProber:
    """Half-open TCP probes from one raw socket per address family (root or CAP_NET_RAW).

    A round sends one SYN per distinct address:port from a reserved source port, with a random
    sequence number (sent again at half the timeout to a node still silent, so that one lost
    packet is not a failed probe), and waits for the SYN-ACKs and RSTs, matched by source
    address, source port, destination port and acknowledgement number. slurmd never sees the
    probe (the module docstring says why). Nodes that share an address:port share one probe.
    The sockets are opened on the first round, on the running event loop, and kept until
    ``close``.

    Raises ProbeError when no raw IPv4 socket can be opened (that says nothing about the
    nodes); IPv6 targets are probed with connects when no raw IPv6 socket can be opened."""

    method = "syn"

    def __init__(self) -> None:
        self._channels: dict[int, _RawChannel] = {}
        self._resolver = _Resolver()
        self._lock = asyncio.Lock()
        self._fallback: ConnectProber | None = None

    def _channel(self, family: int) -> _RawChannel | None:
        """The raw channel of ``family`` on the running loop; None for IPv6 without raw
        sockets (those targets are connected to instead)."""
        channel = self._channels.get(family)
        if channel is not None and channel.loop is not asyncio.get_running_loop():
            channel.close()
            channel = None
        if channel is None:
            try:
                channel = _RawChannel(family)
            except OSError as exc:
                if family == socket.AF_INET:
                    raise ProbeError(
                        f"cannot open a raw socket for SYN probes: {_short(exc)}",
                        hint="run as root or grant CAP_NET_RAW, or use the connect method",
                    ) from exc
                if self._fallback is None:
                    log.warning("no raw IPv6 socket (%s): IPv6 nodes get connect probes", exc)
                    self._fallback = ConnectProber()
                return None
            self._channels[family] = channel
        return channel

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        timeout_s = _check_round(targets, timeout_s)
        # Rounds may overlap only through separate callers; one lock keeps the pending table simple.
        async with self._lock:
            return await self._round(targets, timeout_s)

    async def _round(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        start = time.monotonic()
        by_key: dict[tuple[str, int], asyncio.Future[tuple[str, float]]] = {}
        outcome: list[asyncio.Future[tuple[str, float]]] = []
        resolved = await asyncio.gather(
            *(self._resolver.resolve(t.address) for t in targets), return_exceptions=True
        )
        loop = asyncio.get_running_loop()
        used: list[tuple[_RawChannel, tuple[bytes, int]]] = []
        connect: dict[int, ProbeTarget] = {}  # position -> target, for IPv6 without raw sockets
        connected: asyncio.Task[list[ProbeResult]] | None = None
        try:
            for i, (target, res) in enumerate(zip(targets, resolved, strict=True)):
                fut: asyncio.Future[tuple[str, float]] = loop.create_future()
                outcome.append(fut)
                if isinstance(res, BaseException):
                    fut.set_result((f"resolve: {_short(res)}", time.monotonic() - start))
                    continue
                family, address = res
                channel = self._channel(family)
                if channel is None:
                    connect[i] = ProbeTarget(target.node, address, target.port)
                    continue
                key = (address, target.port)
                if key not in by_key:
                    by_key[key] = self._send(channel, address, target.port, used)
                outcome[i] = by_key[key]
            left = max(0.0, timeout_s - (time.monotonic() - start))
            if connect:
                connected = asyncio.create_task(self._connect(list(connect.values()), left))
            await self._wait(by_key, left, used)
            for i, result in zip(connect, await connected if connected else [], strict=True):
                outcome[i].set_result((result.detail, result.took_s))
        finally:
            if connected is not None and not connected.done():
                connected.cancel()
            for channel, sent_key in used:
                channel.pending.pop(sent_key, None)
        took = time.monotonic() - start
        results = []
        for target, fut in zip(targets, outcome, strict=True):
            detail, seconds = ("timeout", took)
            if fut.done() and not fut.cancelled():
                detail, seconds = fut.result()
            results.append(ProbeResult(target.node, detail == "answered", detail, seconds))
        return results

    async def _wait(
        self,
        by_key: dict[tuple[str, int], asyncio.Future[tuple[str, float]]],
        timeout_s: float,
        used: list[tuple[_RawChannel, tuple[bytes, int]]],
    ) -> None:
        """Wait for the answers; at half time, send the SYN once more to the silent nodes, so
        that one lost packet does not count as a failed probe."""
        deadline = time.monotonic() + timeout_s
        waiting = [f for f in by_key.values() if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=timeout_s / 2)
        for channel, key in used:
            pending = channel.pending.get(key)
            if pending is not None and not pending.future.done():
                with contextlib.suppress(OSError):  # the first send's outcome stands
                    channel.sock.sendto(pending.segment, (pending.address, 0))
        waiting = [f for f in by_key.values() if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))

    async def _connect(self, targets: list[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        if not targets or self._fallback is None:
            return []
        return await self._fallback.probe(targets, max(timeout_s, 0.01))

    def _send(
        self,
        channel: _RawChannel,
        address: str,
        port: int,
        used: list[tuple[_RawChannel, tuple[bytes, int]]],
    ) -> asyncio.Future[tuple[str, float]]:
        fut: asyncio.Future[tuple[str, float]] = asyncio.get_running_loop().create_future()
        sent = time.monotonic()
        try:
            src = channel.source(address, port)
            dst = socket.inet_pton(channel.family, address)
            seq = int.from_bytes(os.urandom(4), "big")
            key = (dst, port)
            segment = syn_segment(src, dst, channel.port, port, seq)
            channel.pending[key] = _Pending(seq, sent, fut, segment, address)
            used.append((channel, key))
            channel.sock.sendto(segment, (address, 0))
        except OSError as exc:
            if not fut.done():
                fut.set_result((_failure_detail(exc), time.monotonic() - sent))
        return fut

    async def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


# ---------------------------------------------------------------------- ConnectProber


class ConnectProber:
    """A full TCP connect and close per node (asyncio.open_connection), for hosts without raw
    sockets. Noisy: slurmd logs errors ("Zero Bytes were transmitted or received", two lines
    on Slurm 22.05) for every probe, 172,800 lines a day per node at 1 probe/s, and accepts,
    reads and closes each connection (about 90 µs of its CPU, bench/results/probe_cost.md);
    prefer ``SynProber``."""

    method = "connect"

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        timeout_s = _check_round(targets, timeout_s)
        return list(await asyncio.gather(*(self._one(t, timeout_s) for t in targets)))

    async def _one(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(target.address, target.port)
        except TimeoutError:
            return ProbeResult(target.node, False, "timeout", time.monotonic() - start)
        except socket.gaierror as exc:
            return ProbeResult(target.node, False, f"resolve: {_short(exc)}", _since(start))
        except OSError as exc:
            return ProbeResult(target.node, False, _failure_detail(exc), _since(start))
        took = _since(start)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return ProbeResult(target.node, True, "answered", took)

    async def close(self) -> None:
        return None


def _since(start: float) -> float:
    return time.monotonic() - start


# ---------------------------------------------------------------------- RemoteProber


class Runner(Protocol):
    """What RemoteProber needs of a runner (``SshRunner``, ``LocalRunner``)."""

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult: ...


_REMOTE_MAIN = '''
def _connect_one(host, port, deadline):
    try:
        with socket.create_connection((host, port), max(0.01, deadline - time.monotonic())):
            return "answered"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        if exc.errno == 111:
            return "refused"
        prefix = "unreachable: " if exc.errno in (101, 112, 113) else ""
        return prefix + str(exc.strerror or exc)[:80]


def _syn_send(raw, port, targets, start, details):
    """Send the SYN probes of the IPv4 targets: (probes waiting, targets left to connect to)."""
    pending, rest = {}, []
    for node, host, dport in targets:
        try:
            addr = socket.getaddrinfo(host, dport, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        except OSError:
            rest.append((node, host, dport))
            continue
        try:
            src = socket.inet_aton(source_address(socket.AF_INET, addr, dport))
            dst = socket.inet_aton(addr)
            seq = int.from_bytes(os.urandom(4), "big")
            raw.sendto(syn_segment(src, dst, port, dport, seq), (addr, 0))
            pending.setdefault((dst, dport), []).append((node, seq))
        except OSError as exc:
            prefix = "unreachable: " if exc.errno in (101, 112, 113) else ""
            details[node] = (prefix + str(exc.strerror or exc)[:80], time.monotonic() - start)
    return pending, rest


def _syn_wait(raw, port, pending, start, deadline, details):
    while pending and time.monotonic() < deadline:
        if not select.select([raw], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        for _ in range(1024):
            try:
                packet = raw.recv(65535)
            except OSError:
                break
            parsed = parse_reply(packet, True)
            if parsed is None:
                continue
            src, sport, dport, ack, flags = parsed
            outcome = classify(flags)
            waiting = pending.get((src, sport))
            if dport != port or outcome is None or waiting is None:
                continue
            if any(ack == (seq + 1) & 0xFFFFFFFF for _, seq in waiting):
                for node, _ in pending.pop((src, sport)):
                    details[node] = (outcome, time.monotonic() - start)


def _main(targets, timeout_s):
    start = time.monotonic()
    deadline = start + timeout_s
    details = {}
    method, rest, pending, port = "connect", targets, {}, 0
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
        raw.setblocking(False)
    except OSError:
        raw = None
    if raw is not None:
        method = "syn"
        reserved = reserve_port(socket.AF_INET)
        port = reserved.getsockname()[1]
        try:
            _attach_filter(raw, _port_filter(port, True))
        except OSError:
            pass
        pending, rest = _syn_send(raw, port, targets, start, details)
    queue = list(rest)

    def worker():
        while queue:
            try:
                node, host, dport = queue.pop()
            except IndexError:
                return
            detail = _connect_one(host, dport, deadline)
            details[node] = (detail, time.monotonic() - start)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(len(rest), 256))]
    for thread in threads:
        thread.start()
    if raw is not None:
        _syn_wait(raw, port, pending, start, deadline, details)
        reserved.close()
        raw.close()
    for thread in threads:
        thread.join(max(0.0, deadline + 0.5 - time.monotonic()))
    took = time.monotonic() - start
    for node, _, _ in targets:
        detail, seconds = details.get(node, ("timeout", took))
        line = {"node": node, "ok": detail == "answered", "detail": detail}
        line["took_s"] = round(seconds, 4)
        line["method"] = method
        print(json.dumps(line))
    sys.stdout.flush()
'''


def remote_script(targets: Sequence[ProbeTarget], timeout_s: float) -> str:
    """The python3 script RemoteProber sends: every name validated, then written as a literal."""
    checked = [(node_name(t.node), probe_address(t.address), probe_port(t.port)) for t in targets]
    helpers = "\n\n".join(
        inspect.getsource(f)
        for f in (
            tcp_checksum,
            syn_segment,
            parse_reply,
            source_address,
            reserve_port,
            classify,
            _port_filter,
            _attach_filter,
        )
    )
    return (
        "from __future__ import annotations\n"
        "import ctypes, json, os, select, socket, struct, sys, threading, time\n"
        f"_SYN_ACK, _RST, _SO_ATTACH_FILTER = {_SYN_ACK}, {_RST}, {_SO_ATTACH_FILTER}\n\n"
        f"{helpers}\n{_REMOTE_MAIN}\n"
        f"_main({checked!r}, {float(timeout_s)!r})\n"
    )


class RemoteProber:
    """Probes run on the SSH host (the controller or login host, which can reach the nodes when
    Relaunch cannot): one ``python3 -`` command per round, the script on stdin. The script sends
    SYN probes when it may open a raw socket (it runs as root there) and connects otherwise;
    ``last_method`` says which it used. The host needs python3 (3.7 or later), nothing else. A
    failed command raises ``ProbeError`` (nothing is then known about the nodes)."""

    method = "ssh"

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self.last_method = ""

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        timeout_s = _check_round(targets, timeout_s)
        if not targets:
            return []
        script = remote_script(targets, timeout_s)
        result = await self._runner.run(
            ["python3", "-"], stdin=script, timeout=timeout_s + _REMOTE_MARGIN_S
        )
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or [""])[-1][:_DETAIL_MAX]
            raise ProbeError(
                f"the probe script failed on the probe host (exit {result.returncode}): {tail}",
                hint="python3 must be installed on the SSH host",
            )
        return self._parse(targets, result.stdout)

    def _parse(self, targets: Sequence[ProbeTarget], stdout: str) -> list[ProbeResult]:
        limit = _ANSWER_LINE_MAX * (len(targets) + 1)
        if len(stdout) > limit:
            raise ProbeError(f"the probe host's answer is {len(stdout)} bytes; at most {limit}")
        wanted = {t.node for t in targets}
        found: dict[str, ProbeResult] = {}
        for line in stdout.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if not isinstance(item, dict):
                continue
            node, ok, detail = item.get("node"), item.get("ok"), item.get("detail")
            took = item.get("took_s")
            if (
                node in wanted
                and isinstance(node, str)
                and isinstance(ok, bool)
                and isinstance(detail, str)
                and isinstance(took, int | float)
            ):
                clean = "".join(c for c in detail[:_DETAIL_MAX] if c.isprintable())
                found[node] = ProbeResult(node, ok, clean, min(max(float(took), 0.0), 3600.0))
                if isinstance(item.get("method"), str) and item["method"] in ("syn", "connect"):
                    self.last_method = item["method"]
        if not found:
            raise ProbeError("the probe host answered nothing readable")
        return [
            found.get(t.node, ProbeResult(t.node, False, "no answer from the probe host", 0.0))
            for t in targets
        ]

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------------- choosing a prober

_warned_connect = False


def make_prober(method: str = "auto", *, runner: object | None = None) -> Prober:
    """The prober for ``method``: "syn", "connect", "ssh" (needs ``runner``) or "auto".

    auto: RemoteProber when a runner is given, else SynProber when raw sockets are permitted,
    else ConnectProber (with a warning, once, that slurmd will log each probe)."""
    global _warned_connect
    if method == "auto":
        if runner is not None:
            method = "ssh"
        elif raw_sockets_permitted():
            method = "syn"
        else:
            if not _warned_connect:
                _warned_connect = True
                log.warning(
                    "raw sockets are not permitted (run as root or grant CAP_NET_RAW): probing "
                    "nodes with TCP connects, and slurmd logs errors for every probe"
                )
            method = "connect"
    if method == "syn":
        if not raw_sockets_permitted():
            raise ProbeError(
                "SYN probes need a raw socket, which this process may not open",
                hint="run as root or grant CAP_NET_RAW, or use the connect method",
            )
        return SynProber()
    if method == "connect":
        return ConnectProber()
    if method == "ssh":
        if runner is None or not callable(getattr(runner, "run", None)):
            raise ValueError("the ssh probe method needs a runner with an async run()")
        return RemoteProber(cast(Runner, runner))
    raise ValueError(f"unknown probe method {method!r}; one of auto, syn, connect, ssh")


# ---------------------------------------------------------------------- the monitor


@dataclass
class NodeLiveness:
    """What the probes say about one node."""

    failures: int = 0  # consecutive failed probes
    failing_since: datetime | None = None  # wall time (UTC) of the streak's first failed probe
    last_ok: datetime | None = None
    detail: str = ""  # the last probe's detail


@dataclass
class LivenessStats:
    """Counters of a LivenessMonitor, for /metrics and the benchmark."""

    rounds: int = 0
    probes: int = 0
    failed: int = 0
    last_round_s: float = 0.0
    errors: int = 0


@dataclass
class _Watched:
    target: ProbeTarget
    state: NodeLiveness = field(default_factory=NodeLiveness)


class LivenessMonitor:
    """Probes a set of nodes every ``interval_s``, one probe per node per round however many
    jobs share it, and keeps each node's consecutive-failure streak.

    ``round_done`` is cleared when a round starts and set when it ends (also when it failed)."""

    def __init__(
        self,
        prober: Prober,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        failures: int = 3,
    ) -> None:
        if not 0.05 <= interval_s <= 3600:
            raise ValueError(f"interval {interval_s!r}s; must be in [0.05, 3600]")
        _check_round([], timeout_s)
        if not 1 <= failures <= 1000:
            raise ValueError(f"failures {failures!r}; must be in [1, 1000]")
        self.prober = prober
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.failures = failures
        self.stats = LivenessStats()
        self.round_done = asyncio.Event()
        self._watched: dict[str, _Watched] = {}

    def watch(self, targets: Iterable[ProbeTarget]) -> None:
        """Probe these nodes from now on; others are forgotten with their state. A node whose
        address or port changed starts a fresh state."""
        wanted: dict[str, ProbeTarget] = {}
        for target in targets:
            if not isinstance(target, ProbeTarget):
                raise TypeError(f"not a ProbeTarget: {target!r}")
            wanted[target.node] = target
            if len(wanted) > MAX_TARGETS:
                raise ValueError(f"more than {MAX_TARGETS} nodes to watch")
        kept: dict[str, _Watched] = {}
        for node, target in wanted.items():
            old = self._watched.get(node)
            kept[node] = old if old is not None and old.target == target else _Watched(target)
        self._watched = kept

    def state(self, node: str) -> NodeLiveness | None:
        """A copy of ``node``'s state, or None when it is not watched."""
        watched = self._watched.get(node)
        return dataclasses.replace(watched.state) if watched else None

    def unreachable(self) -> dict[str, NodeLiveness]:
        """Copies of the states of the nodes with at least ``failures`` consecutive failures."""
        return {
            node: dataclasses.replace(w.state)
            for node, w in self._watched.items()
            if w.state.failures >= self.failures
        }

    async def probe_once(self) -> list[ProbeResult]:
        """One round: every watched node once, concurrently; updates the states. Raises what
        the prober raises (then no state changes)."""
        self.round_done.clear()
        snapshot = {node: w.target for node, w in self._watched.items()}
        sent = datetime.now(UTC)
        start = time.monotonic()
        try:
            results = (
                await self.prober.probe(list(snapshot.values()), self.timeout_s) if snapshot else []
            )
            self._apply(snapshot, results, sent)
            self.stats.rounds += 1
            self.stats.probes += len(results)
            self.stats.failed += sum(not r.ok for r in results)
            return results
        finally:
            self.stats.last_round_s = time.monotonic() - start
            self.round_done.set()

    def _apply(
        self, snapshot: dict[str, ProbeTarget], results: list[ProbeResult], sent: datetime
    ) -> None:
        for result in results:
            watched = self._watched.get(result.node)
            if watched is None or watched.target != snapshot.get(result.node):
                continue  # forgotten or re-addressed while the round ran
            state = watched.state
            state.detail = result.detail
            if result.ok:
                state.failures = 0
                state.failing_since = None
                state.last_ok = sent
            else:
                if state.failures == 0:
                    state.failing_since = sent
                state.failures += 1

    async def run(self, stop: asyncio.Event) -> None:
        """A round every ``interval_s`` until ``stop`` is set. A round that overruns its slot is
        followed at once by the next (never two in flight); errors are logged and counted."""
        next_start = time.monotonic()
        stopping = asyncio.create_task(stop.wait())
        round_task: asyncio.Task[None] | None = None
        try:
            while not stop.is_set():
                round_task = asyncio.create_task(self._guarded_round())
                await asyncio.wait({round_task, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not round_task.done():
                    round_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await round_task
                    break
                next_start += self.interval_s
                delay = next_start - time.monotonic()
                if delay <= 0:
                    next_start = time.monotonic()  # late: start now, keep the pace from here
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(stopping), delay)
        finally:
            for task in (stopping, round_task):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _guarded_round(self) -> None:
        try:
            await self.probe_once()
        except asyncio.CancelledError:
            raise
        except RelaunchError as exc:
            self.stats.errors += 1
            log.warning("liveness round failed: %s", exc)
        except Exception:
            self.stats.errors += 1
            log.exception("liveness round failed")
