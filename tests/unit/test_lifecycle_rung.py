"""A rung is asked once per fault, even across a worker that dies mid-rung, and never skipped
because a worker died before it asked: the start row alone does not stand for the ask.

The real stack's side (a worker killed once the reboot was asked):
tests/integration/test_lifecycle.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import relaunch.activities.lifecycle as lifecycle_activities
from relaunch.activities.deps import Deps
from relaunch.activities.lifecycle import LifecycleActivities
from relaunch.models.config import ClusterConfig
from relaunch.models.lifecycle import LifecycleSettings, Rung, RungInput
from relaunch.models.scheduler import NodeState
from tests.support.fake_scheduler import FakeScheduler

LID = "relaunch-c-lifecycle-n1-1"


class Audit:
    """The audit store's dedupe rule: a second row with the same key is not written."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.keys: set[str] = set()

    async def record(self, record: Any, *, dedupe_key: str | None = None) -> bool:
        if dedupe_key is not None:
            if dedupe_key in self.keys:
                return False
            self.keys.add(dedupe_key)
        self.rows.append(record)
        return True

    async def events(self, incident_id: str) -> list[Any]:
        return [r for r in self.rows if r.incident_id == incident_id]

    def kinds(self) -> list[str]:
        return [r.kind for r in self.rows]


def rung(tmp_path: Path) -> tuple[RungInput, Path]:
    asks = tmp_path / "reboots"
    settings = LifecycleSettings(
        reboot_command=["sh", "-c", f'echo "$0" >> {asks}', "{node}"], reboot_timeout_s=5
    )
    inp = RungInput(
        lifecycle_id=LID, cluster="c", node="n1", settings=settings, rung=Rung.REBOOT,
        reason="relaunch: test",
    )  # fmt: skip
    return inp, asks


def activities(audit: Audit) -> LifecycleActivities:
    sched = FakeScheduler()
    sched.set_node("n1", state=NodeState.IDLE, flags=["DRAIN"], reason="relaunch incident x")
    config = ClusterConfig(name="c", database_url="postgresql://x", bundle_dir="/tmp")
    return LifecycleActivities(Deps(config=config, scheduler=sched, audit=audit))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle_activities, "BACK_READS", 1)


async def test_a_reboot_is_asked_once_and_a_retry_after_the_ask_only_waits(
    tmp_path: Path,
) -> None:
    audit = Audit()
    inp, asks = rung(tmp_path)
    first = await ActivityEnvironment().run(activities(audit).apply_rung, inp)
    assert first.done and "the site's reboot command" in first.detail, first.detail
    assert audit.kinds() == ["rung_started", "rung_asked"]
    # The worker dies after the ask (e.g. while the node reboots): the retry does not reboot.
    again = await ActivityEnvironment().run(activities(audit).apply_rung, inp)
    assert again.done and "not asked again" in again.detail, again.detail
    assert asks.read_text().split() == ["n1"]


async def test_a_worker_that_died_before_its_ask_was_confirmed_is_followed_by_an_ask(
    tmp_path: Path,
) -> None:
    """Before the fix the retry took the start row for the ask and only waited: the node was
    never rebooted, its lifecycle waited out `reboot_timeout_s` and its checks then waited
    for a node that never answered (CI, Slurm 24.11)."""
    audit = Audit()
    inp, asks = rung(tmp_path)
    # The earlier attempt wrote its start row and died before its command was taken.
    await activities(audit).deps.audit_row(
        LID, "rung_started", "reboot n1", dedupe="rung_started:reboot", nodes=["n1"]
    )
    again = await ActivityEnvironment().run(activities(audit).apply_rung, inp)
    assert again.done, again.detail
    assert "asked again: the earlier attempt died before its ask was confirmed" in again.detail
    assert asks.read_text().split() == ["n1"]
    assert audit.kinds() == ["rung_started", "rung_asked"]


async def test_a_rung_an_earlier_attempt_could_not_apply_is_not_asked_again(
    tmp_path: Path,
) -> None:
    audit = Audit()
    inp, asks = rung(tmp_path)
    inp = inp.model_copy(
        update={"settings": inp.settings.model_copy(update={"reboot_command": ["false"]})}
    )
    first = await ActivityEnvironment().run(activities(audit).apply_rung, inp)
    assert first.done and "reboot command failed (exit 1)" in first.detail, first.detail
    assert audit.kinds() == ["rung_started"]  # a failed command is not a confirmed ask
    # A GPU reset without nvidia-smi is "not applied": the retry says so, it does not ask.
    reset = inp.model_copy(update={"rung": Rung.GPU_RESET})
    await activities(audit).deps.audit_row(
        LID, "rung_started", "gpu_reset n1", dedupe="rung_started:gpu_reset", nodes=["n1"]
    )
    await activities(audit).deps.audit_row(
        LID, "rung_not_applied", "gpu_reset n1: nvidia-smi is not installed on n1",
        dedupe="rung_not_applied:gpu_reset", nodes=["n1"],
        data={"detail": "nvidia-smi is not installed on n1"},
    )  # fmt: skip
    skipped = await ActivityEnvironment().run(activities(audit).apply_rung, reset)
    assert not skipped.done and "an earlier attempt: nvidia-smi is not installed" in skipped.detail
    assert not asks.exists()
