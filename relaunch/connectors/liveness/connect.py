"""``ConnectProber``: a full TCP connect and close per node, for hosts without raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Sequence

from relaunch.connectors.liveness.targets import (
    ProbeResult,
    ProbeTarget,
    check_round,
    failure_detail,
    short_error,
)


class ConnectProber:
    """A full TCP connect and close per node (asyncio.open_connection), for hosts without raw
    sockets. Noisy: slurmd logs errors ("Zero Bytes were transmitted or received", two lines
    on Slurm 22.05) for every probe, 172,800 lines a day per node at 1 probe/s, and accepts,
    reads and closes each connection (about 90 µs of its CPU, bench/results/probe_cost.md);
    prefer ``SynProber``."""

    method = "connect"

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        timeout_s = check_round(targets, timeout_s)
        return list(await asyncio.gather(*(self._one(t, timeout_s) for t in targets)))

    async def _one(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(target.address, target.port)
        except TimeoutError:
            return ProbeResult(target.node, False, "timeout", time.monotonic() - start)
        except socket.gaierror as exc:
            return ProbeResult(target.node, False, f"resolve: {short_error(exc)}", _since(start))
        except OSError as exc:
            return ProbeResult(target.node, False, failure_detail(exc), _since(start))
        took = _since(start)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return ProbeResult(target.node, True, "answered", took)

    async def close(self) -> None:
        return None


def _since(start: float) -> float:
    return time.monotonic() - start
