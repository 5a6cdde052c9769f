"""One probe of a node serves every recovery that asks within a moment of it.

When a rack fails, hundreds of recoveries gather evidence at once and each probes its job's
nodes: the same few dead nodes, hundreds of times, each probe waiting out its timeout while it
holds an activity slot. ``SharedProber`` sends one probe per node for all of them: a caller
that asks while a probe of the node is in flight, or within ``fresh_s`` of its answer, gets that
answer; a probe that started more than ``fresh_s`` ago is never reused, so a recovery's read
stays fresh (the evidence step's second try, 1.5 s after its first, is a probe of its own)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from relaunch.connectors.liveness.targets import Prober, ProbeResult, ProbeTarget


class SharedProber:
    """A ``Prober`` whose concurrent and near-simultaneous probes of a node are one probe."""

    def __init__(self, inner: Prober, fresh_s: float = 1.0) -> None:
        self.inner = inner
        self.method = inner.method
        self.fresh_s = fresh_s
        # (node, address, port, timeout) → (when the probe started, its answer to come)
        self._probes: dict[tuple[str, str, int, float], tuple[float, asyncio.Future[ProbeResult]]]
        self._probes = {}
        self.sent = 0  # probes actually sent (for tests and benchmarks)

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        now = time.monotonic()
        waits: list[asyncio.Future[ProbeResult]] = []
        mine: list[tuple[ProbeTarget, asyncio.Future[ProbeResult]]] = []
        loop = asyncio.get_running_loop()
        for target in targets:
            key = (target.node, target.address, target.port, timeout_s)
            known = self._probes.get(key)
            if known is not None and now - known[0] <= self.fresh_s:
                waits.append(known[1])
                continue
            future: asyncio.Future[ProbeResult] = loop.create_future()
            self._probes[key] = (now, future)
            mine.append((target, future))
            waits.append(future)
        if mine:
            self.sent += len(mine)
            try:
                results = await self.inner.probe([t for t, _ in mine], timeout_s)
            except BaseException as exc:
                for target, future in mine:
                    self._probes.pop((target.node, target.address, target.port, timeout_s), None)
                    if not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: the callers that share it re-raise it
                raise
            for (_, future), result in zip(mine, results, strict=True):
                future.set_result(result)
        self._forget(now)
        return list(await asyncio.gather(*waits))

    def _forget(self, now: float) -> None:
        """Drop answers too old to be shared (the map stays as small as the nodes probed)."""
        stale = [k for k, (at, f) in self._probes.items() if f.done() and now - at > self.fresh_s]
        for key in stale:
            del self._probes[key]

    async def close(self) -> None:
        await self.inner.close()
