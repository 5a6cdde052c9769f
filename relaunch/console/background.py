"""Work the console process does besides serving pages: each served cluster's notifier (when
its configuration names channels), and each cluster's pause state for the pages' banner."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.notify.notifier import Notifier
from relaunch.connectors.pause import pause_state
from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.pause import PauseState

log = logging.getLogger("relaunch.console")
# How often the pages' pause banner is read again (a pause through the API shows at once).
PAUSE_POLL_S = 2.0


def newer(state: PauseState, known: PauseState | None) -> bool:
    """Whether ``state`` (read from the trail) is as new as ``known`` (what the console holds)."""
    if known is None or known.at is None:
        return True
    return state.at is not None and state.at >= known.at


class Background:
    """Started by the app's lifespan, stopped (and awaited) when it ends. One notifier per
    cluster (``configs``: the primary first), each sending its own cluster's announcements."""

    def __init__(
        self,
        configs: Sequence[ClusterConfig],
        db: ConsoleDb,
        pauses: dict[str, PauseState] | None = None,
    ) -> None:
        self._configs, self._db = list(configs), db
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.notifiers: list[Notifier] = []
        self.pauses = pauses if pauses is not None else {}

    async def _read_pauses(self) -> None:
        """Keep ``pauses`` current: each cluster's latest pause or unpause, every few seconds
        (a database that does not answer leaves the last state read)."""
        while not self._stop.is_set():
            for config in self._configs:

                async def query(store: AuditStore, name: str = config.name) -> PauseState:
                    return await pause_state(store, name)

                try:
                    state = await self._db.from_store(query)
                    known = self.pauses.get(config.name)
                    # A read that began before a pause through the API (which sets the state at
                    # once) must not put the older state back.
                    if newer(state, known):
                        self.pauses[config.name] = state
                except RelaunchError as exc:
                    log.warning("pause state of %s not read: %s", config.name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=PAUSE_POLL_S)

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._read_pauses()))
        for config in self._configs:
            if not config.notify.channels:
                continue
            notifier = Notifier(config.name, config.notify, self._db.store, config.database_url)
            self.notifiers.append(notifier)
            self._tasks.append(asyncio.create_task(notifier.run(self._stop)))
            names = ", ".join(c.name for c in config.notify.channels)
            log.info("notifier for cluster %s started for channels %s", config.name, names)

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await asyncio.wait_for(task, timeout=10)
                except TimeoutError:
                    task.cancel()
