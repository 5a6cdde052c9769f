"""Shared reads that are never stale for the caller: many concurrent readers, few Slurm calls.

A burst of recoveries (a switch takes out a rack: hundreds of jobs at once) makes every activity
read the queue; with one ``squeue --json`` each, they queue behind each other for seconds.
:class:`FreshRead` lets concurrent callers share reads without giving anyone an answer older
than its own call: while a read is in flight, newcomers wait for the *next* read, which starts
as soon as the current one ends and serves all of them. So N concurrent callers cost at most
two reads, and a verification after an action still sees the state after that action.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class FreshRead(Generic[T]):
    """Coalesces concurrent calls of ``read`` (see the module docstring)."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._current: asyncio.Future[T] | None = None
        self._next: asyncio.Future[T] | None = None
        self.reads = 0  # how many reads actually ran (for tests and benchmarks)

    async def __call__(self) -> T:
        if self._current is None:
            self._current = asyncio.ensure_future(self._run_first())
            return await asyncio.shield(self._current)
        if self._next is None:
            self._next = asyncio.ensure_future(self._run_after(self._current))
        return await asyncio.shield(self._next)

    async def _run_first(self) -> T:
        me = asyncio.current_task()
        try:
            self.reads += 1
            return await self._read()
        finally:
            if self._current is me:
                self._current = None

    async def _run_after(self, previous: asyncio.Future[T]) -> T:
        # The read in flight began before these callers asked: wait for it to end, then read.
        await asyncio.wait([previous])
        me = asyncio.current_task()
        assert isinstance(me, asyncio.Future)
        if self._next is me:
            self._next = None
        self._current = me
        try:
            self.reads += 1
            return await self._read()
        finally:
            if self._current is me:
                self._current = None
