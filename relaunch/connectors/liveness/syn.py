"""``SynProber``: half-open TCP probes from raw sockets, so that slurmd never sees them (the
package docstring says why), with the raw channel of each address family and the resolver it
keeps."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from relaunch.connectors.liveness.connect import ConnectProber
from relaunch.connectors.liveness.packets import (
    RST,
    ack_segment,
    attach_filter,
    classify,
    parse_reply,
    port_filter,
    reply_seq,
    reserve_port,
    source_address,
    syn_segment,
)
from relaunch.connectors.liveness.targets import (
    LISTEN_FULL,
    MAX_TARGETS,
    SILENT,
    ProbeError,
    ProbeResult,
    ProbeTarget,
    check_round,
    failure_detail,
    short_error,
)

log = logging.getLogger("relaunch.liveness")

_RESOLVE_TTL_S = 60.0
# Read the raw socket after every this many sends: answers that arrive while a round is still
# sending (on a fast network, or loopback, all of them) wait in the socket's receive buffer,
# which at net.core.rmem_default (208 KiB) holds about 380 replies; a round of 1,000 nodes that
# sent everything first lost the rest and called those live nodes silent
# (tests/unit/test_probe_scale.py, bench/results/probe_scale.md).
_READ_EVERY = 32


@dataclass
class _Pending:
    seq: int
    sent: float
    future: asyncio.Future[tuple[str, float]]
    segment: bytes = b""
    address: str = ""
    ack: bytes = b""  # the bare ACK sent with the SYN's second copy
    ack_number: int = -1  # its acknowledgement number: a RST to it carries it as its seq
    kernel: bool = False  # the node's kernel reset that ACK


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
            attach_filter(self.sock, port_filter(self.port, self.ip_header))
        with contextlib.suppress(BlockingIOError):
            while self.sock.recv(65535):  # what arrived before the filter was attached
                pass
        self.pending: dict[tuple[bytes, int], _Pending] = {}
        self._sources: dict[str, tuple[float, bytes]] = {}
        self.loop.add_reader(self.sock.fileno(), self.read_answers)

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

    def read_answers(self) -> None:
        """Read what the raw socket holds now (at most 1,024 packets): called by the event loop
        when the socket is readable, and by a round between its sends (``_READ_EVERY``)."""
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
                flags & RST
                and dport == self.port
                and waiting is not None
                and reply_seq(packet, self.ip_header) == waiting.ack_number
            ):
                waiting.kernel = True  # the RST to our bare ACK: the node's kernel is alive
                continue
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
    probe (the package docstring says why). Nodes that share an address:port share one probe.
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
                        f"cannot open a raw socket for SYN probes: {short_error(exc)}",
                        hint="run as root or grant CAP_NET_RAW, or use the connect method",
                    ) from exc
                if self._fallback is None:
                    log.warning("no raw IPv6 socket (%s): IPv6 nodes get connect probes", exc)
                    self._fallback = ConnectProber()
                return None
            self._channels[family] = channel
        return channel

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        timeout_s = check_round(targets, timeout_s)
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
                    fut.set_result((f"resolve: {short_error(res)}", time.monotonic() - start))
                    continue
                family, address = res
                channel = self._channel(family)
                if channel is None:
                    connect[i] = ProbeTarget(target.node, address, target.port)
                    continue
                key = (address, target.port)
                if key not in by_key:
                    by_key[key] = self._send(channel, address, target.port, used)
                    if len(by_key) % _READ_EVERY == 0:
                        channel.read_answers()
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
            detail, seconds = (SILENT, took)
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
        that one lost packet does not count as a failed probe, and a bare ACK: a node whose
        kernel resets it but answers no SYN has a full accept queue (``LISTEN_FULL``), not a
        dead host (``SILENT``): a job can fill slurmd's backlog with idle connections."""
        deadline = time.monotonic() + timeout_s
        waiting = [f for f in by_key.values() if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=timeout_s / 2)
        for n, (channel, key) in enumerate(used, 1):
            pending = channel.pending.get(key)
            if pending is not None and not pending.future.done():
                with contextlib.suppress(OSError):  # the first send's outcome stands
                    channel.sock.sendto(pending.segment, (pending.address, 0))
                    channel.sock.sendto(pending.ack, (pending.address, 0))
            if n % _READ_EVERY == 0:
                channel.read_answers()
        waiting = [f for f in by_key.values() if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
        for channel, key in used:
            pending = channel.pending.get(key)
            if pending is not None and pending.kernel and not pending.future.done():
                pending.future.set_result((LISTEN_FULL, time.monotonic() - pending.sent))

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
            number = int.from_bytes(os.urandom(4), "big")
            ack = ack_segment(src, dst, channel.port, port, (seq + 1) & 0xFFFFFFFF, number)
            channel.pending[key] = _Pending(seq, sent, fut, segment, address, ack, number)
            used.append((channel, key))
            channel.sock.sendto(segment, (address, 0))
        except OSError as exc:
            if not fut.done():
                fut.set_result((failure_detail(exc), time.monotonic() - sent))
        return fut

    async def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
