"""What a probe round is about: the nodes to probe (``ProbeTarget``), what each probe found
(``ProbeResult``), the ``Prober`` protocol every prober follows, ``ProbeError``, and the checks
every prober applies to its inputs and to the error texts it reports."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from relaunch.models.errors import InvalidNameError, RelaunchError
from relaunch.models.names import node_name

MAX_TARGETS = 4096  # one round probes at most this many nodes
MAX_TIMEOUT_S = 30.0
DETAIL_MAX = 120  # characters of a probe's detail
# A SYN probe's failures with no answer to the SYN: nothing at all came back, not even a RST to
# a bare ACK sent after it (the host is gone or off the fabric), or the node's kernel reset the
# ACK while the listener dropped the SYNs (its accept queue is full: any job can fill it).
SILENT = "silent: no answer to a SYN or an ACK"
LISTEN_FULL = "no SYN-ACK, but the node resets an ACK: listen queue full"
_DNS_NAME = re.compile(
    r"(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


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
    """The outcome of one probe of one node (the package docstring says what ``detail`` means)."""

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


def check_round(targets: Sequence[ProbeTarget], timeout_s: float) -> float:
    """``timeout_s`` as a float, once the round's size and timeout are within bounds; else
    raise ValueError."""
    if len(targets) > MAX_TARGETS:
        raise ValueError(f"{len(targets)} targets in one round; at most {MAX_TARGETS}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"probe timeout {timeout_s!r}s; must be in (0, {MAX_TIMEOUT_S:g}]")
    return float(timeout_s)


def short_error(exc: BaseException) -> str:
    """A short text for ``exc``, fit for a probe's detail."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return (text or type(exc).__name__)[:DETAIL_MAX]


def failure_detail(exc: OSError) -> str:
    """The detail of a probe that failed with ``exc``: ``refused``, ``unreachable: ...`` or
    the error's own short text."""
    if exc.errno == errno.ECONNREFUSED:
        return "refused"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return f"unreachable: {short_error(exc)}"
    return short_error(exc)
