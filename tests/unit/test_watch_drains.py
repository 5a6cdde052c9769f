"""Drains made by others (NHC, an admin) on the nodes of watched jobs: read back from the
watcher's own node listing and recorded once per drain; Relaunch's own drains and nodes no
watched job holds are left alone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from relaunch.models.recovery import drain_reason
from relaunch.models.scheduler import Job, JobState, Node, NodeFlag, NodeState
from relaunch.workers.watch_drains import ExternalDrain, ExternalDrains, external_drains
from relaunch.workers.watcher import WatchConfig, Watcher
from tests.support.fake_scheduler import FakeScheduler

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NHC = "NHC: check_hw_ib: No IB port is ACTIVE"


def job(job_id: str = "7", nodes: tuple[str, ...] = ("n1", "n2"), **changes: object) -> Job:
    fields: dict[str, object] = {
        "job_id": job_id,
        "state": JobState.RUNNING,
        "comment": "relaunch=on",
        "partition": "gpu",
        "nodes": list(nodes),
    }
    return Job.model_validate({**fields, **changes})


def node(name: str, reason: str = "", **changes: object) -> Node:
    drained = {"flags": [NodeFlag.DRAIN], "reason": reason} if reason else {}
    return Node.model_validate({"name": name, "state": NodeState.MIXED, **drained, **changes})


def listing(*nodes: Node) -> dict[str, Node]:
    return {n.name: n for n in nodes}


def test_a_drain_by_someone_else_on_a_watched_job_s_node_is_read_back() -> None:
    nodes = listing(
        node("n1"),
        node("n2", NHC, reason_user="root", reason_time=T0),
        node("n3", "admin: bad fan", reason_user="ops"),  # no watched job holds n3
        node("n4", drain_reason("relaunch-c-node-n4-1")),  # Relaunch's own
        node("n5", "relaunch: checks failed (gpu)"),  # a lifecycle's own
    )
    jobs = [
        job("7", ("n1", "n2")),
        job("8", ("n2",)),
        job("9", ("n4", "n5")),
        job("10", ("n3",), state=JobState.PENDING),
    ]
    [drain] = external_drains("c", jobs, nodes, T0 + timedelta(seconds=3))
    assert (drain.node, drain.reason, drain.user, drain.reason_time) == ("n2", NHC, "root", T0)
    assert drain.jobs == ["7", "8"] and drain.state == "MIXED+DRAIN"
    row = drain.record()
    assert (row.incident_id, row.kind, row.nodes, row.actor) == (
        "intake-c",
        "external_drain",
        ["n2"],
        "root",
    )
    assert row.data["reason"] == NHC and row.data["jobs"] == ["7", "8"]
    assert row.data["reason_time"] == T0.isoformat()
    assert "drained outside Relaunch by root" in row.summary and NHC in row.summary


def test_one_row_per_drain_node_reason_and_time() -> None:
    first = ExternalDrain(
        cluster="c", node="n2", reason=NHC, state="DRAIN", reason_time=T0, jobs=["7"], seen_at=T0
    )
    later_look = first.model_copy(update={"seen_at": T0 + timedelta(minutes=5), "jobs": ["8"]})
    again = first.model_copy(update={"reason_time": T0 + timedelta(hours=1)})
    other = first.model_copy(update={"reason": "NHC: check_fs_mount: /scratch not mounted"})
    assert first.key == later_look.key  # the same drain seen again
    assert len({first.key, again.key, other.key}) == 3
    assert first.key.startswith("intake-c:external_drain:n2:")


async def test_recorded_once_in_the_background_and_tried_again_after_a_failure() -> None:
    recorded: list[list[str]] = []
    fail = [True]

    async def record(drains: list[ExternalDrain]) -> None:
        if fail.pop() if fail else False:
            raise OSError("database down")
        recorded.append([d.node for d in drains])

    follower = ExternalDrains("c", record, interval_s=5.0)
    jobs, nodes = [job()], listing(node("n1"), node("n2", NHC, reason_time=T0))
    follower.observe(jobs, nodes, T0, clock=100.0)
    await follower.wait(1)
    assert recorded == []  # the write failed: nothing is taken as recorded
    follower.observe(jobs, nodes, T0, clock=102.0)  # within the interval: not looked at
    await follower.wait(1)
    assert recorded == []
    follower.observe(jobs, nodes, T0, clock=105.0)
    await follower.wait(1)
    assert recorded == [["n2"]]
    follower.observe(jobs, nodes, T0, clock=111.0)  # recorded already
    await follower.wait(1)
    assert recorded == [["n2"]]
    redrained = listing(node("n1"), node("n2", NHC, reason_time=T0 + timedelta(hours=1)))
    follower.observe(jobs, redrained, T0, clock=117.0)
    await follower.wait(1)
    assert recorded == [["n2"], ["n2"]]


async def test_the_watcher_reads_them_from_its_own_poll_s_listing() -> None:
    drained = node("n2", NHC, reason_user="root", reason_time=T0)
    sched = FakeScheduler(nodes=[node("n1"), drained], jobs=[job()])
    seen: list[ExternalDrain] = []

    async def record(drains: list[ExternalDrain]) -> None:
        seen.extend(drains)

    async def ignore(_: object) -> None:
        return None

    watcher = Watcher(WatchConfig(cluster="c"), sched, ignore, on_external_drains=record)
    await watcher.poll_once(T0)
    await asyncio.sleep(0.05)  # the write runs beside the poll
    await watcher.poll_once(T0 + timedelta(seconds=1))
    await asyncio.sleep(0.05)
    assert [(d.node, d.reason, d.user, d.jobs) for d in seen] == [("n2", NHC, "root", ["7"])]
    # Nothing asked of Slurm for it: one job listing and one node listing per poll.
    assert [c[0] for c in sched.calls] == ["list_jobs", "list_nodes"] * 2
