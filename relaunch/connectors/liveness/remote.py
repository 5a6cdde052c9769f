"""``RemoteProber``: the probes run on the SSH host, one ``python3 -`` command per round, and
the script it sends (``remote_script``), assembled from the source of the packet helpers in
``packets`` so that the local and the remote probe share them."""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from relaunch.connectors.liveness.packets import (
    RST,
    SO_ATTACH_FILTER,
    SYN_ACK,
    attach_filter,
    classify,
    parse_reply,
    port_filter,
    reserve_port,
    source_address,
    syn_segment,
    tcp_checksum,
)
from relaunch.connectors.liveness.targets import (
    DETAIL_MAX,
    ProbeError,
    ProbeResult,
    ProbeTarget,
    check_round,
    probe_address,
    probe_port,
)
from relaunch.models.names import node_name

if TYPE_CHECKING:  # relaunch.connectors.slurm imports this package
    from relaunch.connectors.slurm.runner import CommandResult

_REMOTE_MARGIN_S = 10.0  # the remote script's start-up and the SSH round trip
_ANSWER_LINE_MAX = 512  # bytes per target in RemoteProber's answer


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
    """Send the SYN probes of the IPv4 targets: (probes waiting, targets left to connect to).
    Reads the answers every 32 sends: those that arrive while it still sends would overflow
    the raw socket's receive buffer (about 380 at the default 208 KiB)."""
    pending, rest = {}, []
    for sent, (node, host, dport) in enumerate(targets, 1):
        if sent % 32 == 0:
            _syn_read(raw, port, pending, start, details)
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


def _syn_read(raw, port, pending, start, details):
    """Read the answers the raw socket holds now (at most 1,024 packets)."""
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


def _syn_wait(raw, port, pending, start, deadline, details):
    while pending and time.monotonic() < deadline:
        if not select.select([raw], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        _syn_read(raw, port, pending, start, details)


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
            attach_filter(raw, port_filter(port, True))
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
            port_filter,
            attach_filter,
        )
    )
    return (
        "from __future__ import annotations\n"
        "import ctypes, json, os, select, socket, struct, sys, threading, time\n"
        f"SYN_ACK, RST, SO_ATTACH_FILTER = {SYN_ACK}, {RST}, {SO_ATTACH_FILTER}\n\n"
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
        timeout_s = check_round(targets, timeout_s)
        if not targets:
            return []
        script = remote_script(targets, timeout_s)
        result = await self._runner.run(
            ["python3", "-"], stdin=script, timeout=timeout_s + _REMOTE_MARGIN_S
        )
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or [""])[-1][:DETAIL_MAX]
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
                clean = "".join(c for c in detail[:DETAIL_MAX] if c.isprintable())
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
