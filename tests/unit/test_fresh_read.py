"""FreshRead: concurrent callers share reads, and nobody gets a read older than its call."""

from __future__ import annotations

import asyncio

import pytest

from relaunch.connectors.slurm.fresh import FreshRead


class Source:
    """A value that changes; each read takes a while and reports when it started."""

    def __init__(self) -> None:
        self.version = 0
        self.calls = 0

    async def read(self) -> int:
        self.calls += 1
        started = self.version
        await asyncio.sleep(0.05)
        return started


async def test_a_burst_of_callers_costs_at_most_two_reads() -> None:
    source = Source()
    shared = FreshRead(source.read)
    results = await asyncio.gather(*(shared() for _ in range(50)))
    assert source.calls == shared.reads <= 2
    assert set(results) == {0}


async def test_a_caller_never_gets_a_read_that_started_before_it_asked() -> None:
    source = Source()
    shared = FreshRead(source.read)
    first = asyncio.ensure_future(shared())
    await asyncio.sleep(0.01)  # the first read is in flight, having seen version 0
    source.version = 1  # an action changes the state...
    after = await shared()  # ...so a verification must see it
    assert after == 1 and await first == 0
    assert source.calls == 2


async def test_errors_reach_every_waiter_and_the_next_call_reads_again() -> None:
    calls = 0

    async def failing() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if calls == 1:
            raise RuntimeError("controller down")
        return calls

    shared = FreshRead(failing)
    first, second = await asyncio.gather(shared(), shared(), return_exceptions=True)
    assert isinstance(first, RuntimeError) and second == 2
    assert await shared() == 3


async def test_a_cancelled_caller_does_not_cancel_the_shared_read() -> None:
    source = Source()
    shared = FreshRead(source.read)
    impatient = asyncio.ensure_future(shared())
    patient = asyncio.ensure_future(shared())
    await asyncio.sleep(0.01)
    impatient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impatient
    assert await patient == 0
