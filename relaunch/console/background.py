"""Work the console process does besides serving pages: each served cluster's notifier (when
its configuration names channels)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from relaunch.connectors.notify.notifier import Notifier
from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig

log = logging.getLogger("relaunch.console")


class Background:
    """Started by the app's lifespan, stopped (and awaited) when it ends. One notifier per
    cluster (``configs``: the primary first), each sending its own cluster's announcements."""

    def __init__(self, configs: Sequence[ClusterConfig], db: ConsoleDb) -> None:
        self._configs, self._db = list(configs), db
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.notifiers: list[Notifier] = []

    def start(self) -> None:
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
