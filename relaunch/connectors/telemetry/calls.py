"""A daemon thread that runs blocking calls in order, each awaited with its own timeout.

NVML calls go through one per GPU: a call that hangs (a sick GPU can hang the driver) marks
that thread stuck, later calls on it fail fast, and the other GPUs' threads carry on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from relaunch.models.errors import RelaunchError


class NvmlTimeoutError(RelaunchError):
    """An NVML call did not return within its timeout (the GPU or driver may be hung)."""

    retryable = True


class CallThread:
    """One daemon thread that runs NVML calls in order, each awaited with a timeout."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stuck_on: str | None = None
        self._lock = threading.Lock()
        self._jobs: list[tuple[str, Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self._ready = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if not self._jobs:
                    return
                _label, fn, fut = self._jobs.pop(0)
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)
            with self._lock:
                self.stuck_on = None

    async def call(self, label: str, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` on this thread; NvmlTimeoutError if it takes longer than ``timeout``."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._ready:
            if self.stuck_on is not None:
                raise NvmlTimeoutError(f"NVML still hung in {self.stuck_on}")
            self._jobs.append((label, fn, fut))
            self._ready.notify()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        except TimeoutError:
            with self._lock:
                if not fut.done():
                    self.stuck_on = label
            raise NvmlTimeoutError(f"{label}: no answer within {timeout:g}s") from None

    @property
    def idle(self) -> bool:
        with self._lock:
            return self.stuck_on is None and not self._jobs

    def close(self) -> None:
        """Let the thread end once its queue is empty (a stuck call keeps it, as a daemon)."""
        with self._ready:
            self._closed = True
            self._ready.notify()
