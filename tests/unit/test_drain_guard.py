"""The blast-radius guard as `isolate` re-checks it on a fresh read of the nodes: it counts nodes
that are out of service, not drain events, so a node that fails again is never counted twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from relaunch.activities.actions import drain_check
from relaunch.models.recovery import Policy, drain_reason
from relaunch.models.scheduler import Node, NodeFlag, NodeState

NOW = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
SINCE = NOW - timedelta(hours=24)
# 4 nodes, 10% share rounded up: one node may be out of service at a time.
POLICY = Policy(drain_share=0.10, drain_cap=4)


def node(name: str, state: NodeState = NodeState.IDLE, *flags: str, reason: str = "") -> Node:
    return Node(
        name=name,
        state=state,
        flags=list(flags),
        reason=reason,
        reason_time=NOW - timedelta(hours=1) if reason else None,
        partitions=["debug"],
    )


def cluster(*changed: Node) -> list[Node]:
    by_name = {n.name: n for n in changed}
    return [by_name.get(f"n{i}", node(f"n{i}", NodeState.ALLOCATED)) for i in range(1, 5)]


def test_a_drained_node_that_crashes_again_is_counted_once() -> None:
    """The incident seen on a 4-node cluster: n2, drained earlier by Relaunch and put back by an
    operator, crashed; the guard counted it as out of service *and* as new (2 > 1), refused
    its drain, and the job stayed on the dead node."""
    crashed = node("n2", NodeState.DOWN, NodeFlag.NOT_RESPONDING, reason="Not responding")
    check = drain_check(POLICY, cluster(crashed), ["n2"], ["n2"], partition="debug", since=SINCE)
    assert check.decision.allowed, check.decision.detail
    assert check.out_of_service == ["n2"] and check.new == []
    # Still drained from the first time: the same, once.
    drained = node("n2", NodeState.DOWN, NodeFlag.DRAIN, reason=drain_reason("i1"))
    again = drain_check(POLICY, cluster(drained), ["n2"], ["n2"], partition="debug", since=SINCE)
    assert again.decision.allowed and again.out_of_service == ["n2"]


def test_a_second_node_is_refused_while_the_first_is_still_out() -> None:
    drained = node("n1", NodeState.IDLE, NodeFlag.DRAIN, reason=drain_reason("i1"))
    check = drain_check(POLICY, cluster(drained), ["n1"], ["n3"], partition="debug", since=SINCE)
    assert not check.decision.allowed
    assert check.new == ["n3"]
    assert "1 out of service" in check.decision.detail and "limit 1" in check.decision.detail


def test_a_node_resumed_by_an_operator_gives_its_place_back() -> None:
    # The audit trail still says n1 was drained in the window, but it is back in service.
    check = drain_check(POLICY, cluster(), ["n1"], ["n3"], partition="debug", since=SINCE)
    assert check.decision.allowed and check.out_of_service == []


def test_a_drain_whose_audit_row_was_lost_still_counts() -> None:
    """A worker killed between `scontrol` and the audit row: Slurm's drain reason says who."""
    drained = node("n1", NodeState.IDLE, NodeFlag.DRAIN, reason=drain_reason("i1"))
    check = drain_check(POLICY, cluster(drained), [], ["n3"], partition="debug", since=SINCE)
    assert not check.decision.allowed and check.out_of_service == ["n1"]


def test_an_operators_drain_is_neither_counted_nor_new() -> None:
    maintenance = node("n1", NodeState.IDLE, NodeFlag.DRAIN, reason="bios update")
    elsewhere = drain_check(
        POLICY, cluster(maintenance), [], ["n3"], partition="debug", since=SINCE
    )
    assert elsewhere.decision.allowed and elsewhere.out_of_service == []
    same = drain_check(POLICY, cluster(maintenance), [], ["n1"], partition="debug", since=SINCE)
    assert same.decision.allowed and same.new == []


def test_the_limit_is_a_share_of_the_jobs_partition() -> None:
    nodes = [
        *cluster(),
        *(node(f"m{i}").model_copy(update={"partitions": ["big"]}) for i in range(16)),
    ]
    # 4 of the 20 nodes are in the job's partition: 10% of 4 rounds up to 1 node.
    check = drain_check(POLICY, nodes, [], ["n1", "n2"], partition="debug", since=SINCE)
    assert not check.decision.allowed and "of 4 nodes" in check.decision.detail
