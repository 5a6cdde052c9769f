"""Work the console process does besides serving pages: the notifier (when channels are set)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relaunch.connectors.notify.notifier import Notifier
from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig

log = logging.getLogger("relaunch.console")


class Background:
    """Started by the app's lifespan, stopped (and awaited) when it ends."""

    def __init__(self, config: ClusterConfig, db: ConsoleDb) -> None:
        self._config, self._db = config, db
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.notifier: Notifier | None = None

    def start(self) -> None:
        if self._config.notify.channels:
            self.notifier = Notifier(
                self._config.name, self._config.notify, self._db.store, self._config.database_url
            )
            self._tasks.append(asyncio.create_task(self.notifier.run(self._stop)))
            names = ", ".join(c.name for c in self._config.notify.channels)
            log.info("notifier started for channels %s", names)

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await asyncio.wait_for(task, timeout=10)
                except TimeoutError:
                    task.cancel()
