"""``LivenessMonitor``: probes the watched nodes every interval, one probe per node per round,
and keeps each node's consecutive-failure streak (``NodeLiveness``) and its own counters
(``LivenessStats``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from relaunch.connectors.liveness.targets import (
    MAX_TARGETS,
    Prober,
    ProbeResult,
    ProbeTarget,
    check_round,
)
from relaunch.models.errors import RelaunchError

log = logging.getLogger("relaunch.liveness")


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
        check_round([], timeout_s)
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
