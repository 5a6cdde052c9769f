"""Long actions keep heartbeating while they wait, repeating what they last said they do."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.testing import ActivityEnvironment

from relaunch.activities import deps
from relaunch.activities.deps import beat, keeps_heartbeating


def recording(
    monkeypatch: pytest.MonkeyPatch, every_s: float
) -> tuple[ActivityEnvironment, list[tuple[object, ...]]]:
    """An activity environment that records every heartbeat, the heartbeater at ``every_s``."""
    monkeypatch.setattr(deps, "HEARTBEAT_EVERY_S", every_s)
    seen: list[tuple[object, ...]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: seen.append(details)
    return env, seen


async def test_an_action_that_waits_keeps_heartbeating(monkeypatch: pytest.MonkeyPatch) -> None:
    env, seen = recording(monkeypatch, 0.02)

    @keeps_heartbeating
    async def requeue_on_a_busy_cluster() -> str:
        beat("requeue 42")
        await asyncio.sleep(0.15)  # waiting out COMPLETING, longer than the beat interval
        return "requeued"

    assert await env.run(requeue_on_a_busy_cluster) == "requeued"
    assert seen[0] == ("requeue 42",)
    assert len(seen) >= 4  # the explicit beat, then the heartbeater's while it waited
    assert set(seen) == {("requeue 42",)}
    count = len(seen)
    await asyncio.sleep(0.1)
    assert len(seen) == count  # no heartbeat after the activity ended


async def test_the_heartbeater_stops_when_the_action_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, seen = recording(monkeypatch, 0.01)

    @keeps_heartbeating
    async def fails() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("scontrol failed")

    with pytest.raises(RuntimeError, match="scontrol failed"):
        await env.run(fails)
    count = len(seen)
    assert count >= 2
    await asyncio.sleep(0.05)
    assert len(seen) == count


async def test_a_failing_heartbeat_does_not_fail_the_action(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, _ = recording(monkeypatch, 0.01)

    def refuse(*_: object) -> None:
        raise RuntimeError("worker shutting down")

    env.on_heartbeat = refuse

    @keeps_heartbeating
    async def drain() -> str:
        await asyncio.sleep(0.05)
        return "drained"

    assert await env.run(drain) == "drained"
