"""Typed clients of the per-node workflows (a node's decision, its lifecycle), for the
watcher and the activities that report a node, join its decision or tell its lifecycle of a
fault: signal-with-start by the workflow's own methods, never by their names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from relaunch.connectors.temporal import STARTED_BY_MEMO, start_token, started_by
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import SchedulerError
from relaunch.models.lifecycle import LifecycleFault, LifecycleInput, lifecycle_id
from relaunch.models.node_decision import (
    JoinRequest,
    NodeDecisionInput,
    NodeReport,
    node_decision_id,
    node_task_queue,
)
from relaunch.models.recovery import Policy
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from relaunch.workflows.node_decision import NodeDecisionWorkflow

# How many decisions of one node a signal looks past (closed ones: the node failed before).
MAX_DECISIONS_PER_NODE = 10_000

# A node decision's workflow tasks take milliseconds (a few hundred under a burst's load). One
# that a worker took and never answered (measured in a 500-job burst on 2 cores: the first task
# of one decision of four, on a worker busy with the others) is handed out again after this
# long instead of Temporal's default 10 s: the node's drain, every job's first action, waits
# for it.
DECISION_TASK_TIMEOUT = timedelta(seconds=4)


class _PerNodeSignals:
    """Signal-with-start into a node's current workflow of one kind: the running one, or the
    node's next when the latest has closed. A closed one is never started again
    (REJECT_DUPLICATE): the node's next failure is the next one. Each node's latest number is
    remembered in this process, so a signal does not try every closed one from the first."""

    what = ""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._latest: dict[tuple[str, str], int] = {}

    def _id(self, cluster: str, node: str, n: int) -> str:
        raise NotImplementedError

    def _run(self) -> Callable[[Any, Any], Awaitable[Any]]:
        """The workflow's run method: what is started."""
        raise NotImplementedError

    async def _send(
        self,
        cluster: str,
        node: str,
        start: Callable[[int], BaseModel],
        signal: Callable[[Any, Any], Any],
        arg: BaseModel,
        *,
        say: bool = False,
    ) -> tuple[str, bool]:
        """Send ``signal`` (a signal method of the workflow) with ``arg`` to ``node``'s current
        workflow (started with the input ``start(n)`` where none runs): its id and, with
        ``say``, whether this signal started it (else True)."""
        key = (cluster, node)
        n = self._latest.get(key, 1)
        token = start_token()
        for _ in range(MAX_DECISIONS_PER_NODE):
            workflow_id = self._id(cluster, node, n)
            try:
                handle = await self.client.start_workflow(
                    self._run(),
                    start(n),
                    id=workflow_id,
                    task_queue=node_task_queue(cluster),
                    # Relaunch's signals keep the SDK's default name: the method's own.
                    start_signal=signal.__name__,
                    start_signal_args=[arg],
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    task_timeout=DECISION_TASK_TIMEOUT,
                    memo={STARTED_BY_MEMO: token},
                )
            except WorkflowAlreadyStartedError:
                n += 1
                continue
            self._latest[key] = n
            return workflow_id, (await started_by(self.client, handle, token)) if say else True
        raise SchedulerError(f"node {node} has more than {MAX_DECISIONS_PER_NODE} {self.what}")


class NodeDecisionSignals(_PerNodeSignals):
    """Signal-with-start into a node's current decision (relaunch/workflows/node_decision.py)."""

    def _run(self) -> Callable[[Any, Any], Awaitable[Any]]:
        return NodeDecisionWorkflow.run

    what = "decisions"

    def _id(self, cluster: str, node: str, n: int) -> str:
        return node_decision_id(cluster, node, n)

    async def join(self, cluster: str, node: str, policy: Policy, request: JoinRequest) -> str:
        """A job recovery joins ``node``'s current decision; the decision's id."""
        return (await self._decision(cluster, node, policy, NodeDecisionWorkflow.join, request))[0]

    async def report(
        self, cluster: str, node: str, policy: Policy, report: NodeReport
    ) -> tuple[str, bool]:
        """The watcher reports ``node`` to its current decision: the decision's id, and
        whether this report started it (False: it reached one that was running already, maybe
        since an earlier failure of the node)."""
        return await self._decision(
            cluster, node, policy, NodeDecisionWorkflow.report, report, say=True
        )

    async def _decision(
        self,
        cluster: str,
        node: str,
        policy: Policy,
        signal: Callable[[Any, Any], Any],
        arg: BaseModel,
        *,
        say: bool = False,
    ) -> tuple[str, bool]:
        return await self._send(
            cluster,
            node,
            lambda n: NodeDecisionInput(cluster=cluster, node=node, n=n, policy=policy),
            signal,
            arg,
            say=say,
        )


class LifecycleSignals(_PerNodeSignals):
    """Signal-with-start of a node's current lifecycle (relaunch/workflows/lifecycle.py): one
    at a time per node; a drain while one runs reaches it as another fault."""

    def _run(self) -> Callable[[Any, Any], Awaitable[Any]]:
        return NodeLifecycleWorkflow.run

    what = "lifecycles"

    def _id(self, cluster: str, node: str, n: int) -> str:
        return lifecycle_id(cluster, node, n)

    async def fault(self, config: ClusterConfig, node: str, fault: LifecycleFault) -> str:
        """Tell ``node``'s lifecycle about ``fault`` (starting it where none runs); its id."""
        cluster = config.name
        mode = config.lifecycle.mode or config.policy.mode

        def start(n: int) -> LifecycleInput:
            return LifecycleInput(
                cluster=cluster,
                node=node,
                n=n,
                mode=mode,
                approval_timeout_s=config.policy.approval_timeout_s,
                settings=config.lifecycle,
                auto_actions=config.policy.auto_actions,
            )

        return (await self._send(cluster, node, start, NodeLifecycleWorkflow.fault, fault))[0]
