"""The Temporal client connection, the one place that builds it: the address, namespace and
TLS from the cluster's configuration, and the pydantic data converter. Used by the worker, the
watcher, the command line and the console."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import Client, Interceptor
from temporalio.common import WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import TLSConfig

from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import TemporalTlsSettings
from relaunch.models.errors import RelaunchError, SchedulerError
from relaunch.models.lifecycle import LifecycleFault, LifecycleInput, lifecycle_id
from relaunch.models.node_decision import NodeDecisionInput, node_decision_id, node_task_queue
from relaunch.models.recovery import Policy

# The workflow type of relaunch/workflows/node_decision.py, named rather than imported: the
# activities and the watcher that signal it do not depend on workflow code.
NODE_DECISION_WORKFLOW = "NodeDecisionWorkflow"
LIFECYCLE_WORKFLOW = "NodeLifecycleWorkflow"
# How many decisions of one node a signal looks past (closed ones: the node failed before).
MAX_DECISIONS_PER_NODE = 10_000


class TemporalUnavailableError(RelaunchError):
    """The Temporal frontend does not answer."""

    retryable = True


class TemporalTlsError(RelaunchError):
    """A file named in ``temporal_tls`` cannot be read; a person must fix the configuration."""


def tls_config(settings: TemporalTlsSettings | None) -> TLSConfig | bool:
    """The SDK's TLS settings from the ``temporal_tls`` section (PEM files read now), or False
    for plaintext when the section is absent."""
    if settings is None:
        return False

    def read(what: str, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise TemporalTlsError(
                f"cannot read temporal_tls.{what} {path}: {exc.strerror}",
                hint="is the TLS Secret mounted, and readable by this user?",
            ) from exc

    return TLSConfig(
        server_root_ca_cert=read("server_root_ca_cert", settings.server_root_ca_cert),
        domain=settings.server_name,
        client_cert=read("client_cert", settings.client_cert),
        client_private_key=read("client_key", settings.client_key),
    )


async def connect(config: ClusterConfig, interceptors: Sequence[Interceptor] = ()) -> Client:
    """The client; ``interceptors`` (the worker's and the watcher's tracing) also apply to the
    workers built on it."""
    tls = tls_config(config.temporal_tls)  # an unreadable file is a config error, not retried
    try:
        return await Client.connect(
            config.temporal_address,
            namespace=config.temporal_namespace,
            data_converter=pydantic_data_converter,
            tls=tls,
            interceptors=interceptors,
        )
    except RuntimeError as exc:  # the SDK's "Failed client connect"
        raise TemporalUnavailableError(
            f"cannot reach Temporal at {config.temporal_address}",
            hint="is the Temporal server running (`relaunch dev status`)?",
        ) from exc


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

    workflow = ""
    what = ""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._latest: dict[tuple[str, str], int] = {}

    def _id(self, cluster: str, node: str, n: int) -> str:
        raise NotImplementedError

    async def _send(
        self,
        cluster: str,
        node: str,
        start: Callable[[int], BaseModel],
        signal: str,
        arg: BaseModel,
    ) -> tuple[str, bool]:
        """Send ``signal`` with ``arg`` to ``node``'s current workflow (started with the input
        ``start(n)`` where none runs): its id, and whether this signal started it."""
        key = (cluster, node)
        n = self._latest.get(key, 1)
        for _ in range(MAX_DECISIONS_PER_NODE):
            workflow_id = self._id(cluster, node, n)
            try:
                handle = await self.client.start_workflow(
                    self.workflow,
                    start(n),
                    id=workflow_id,
                    task_queue=node_task_queue(cluster),
                    start_signal=signal,
                    start_signal_args=[arg],
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    task_timeout=DECISION_TASK_TIMEOUT,
                )
            except WorkflowAlreadyStartedError:
                n += 1
                continue
            self._latest[key] = n
            # Signal-with-start's answer says whether it started the run; the SDK keeps it on
            # the handle, not in its API (an SDK without it: taken as started).
            answer = getattr(handle, "_start_workflow_response", None)
            return workflow_id, bool(getattr(answer, "started", True))
        raise SchedulerError(f"node {node} has more than {MAX_DECISIONS_PER_NODE} {self.what}")


class NodeDecisionSignals(_PerNodeSignals):
    """Signal-with-start into a node's current decision (relaunch/workflows/node_decision.py)."""

    workflow = NODE_DECISION_WORKFLOW
    what = "decisions"

    def _id(self, cluster: str, node: str, n: int) -> str:
        return node_decision_id(cluster, node, n)

    async def send(
        self, cluster: str, node: str, policy: Policy, signal: str, arg: BaseModel
    ) -> str:
        """Send ``signal`` with ``arg`` to ``node``'s current decision; its id."""
        return (await self.send_and_say(cluster, node, policy, signal, arg))[0]

    async def send_and_say(
        self, cluster: str, node: str, policy: Policy, signal: str, arg: BaseModel
    ) -> tuple[str, bool]:
        """``send``, and whether this signal started the decision (False: it reached one that
        was running already, maybe since an earlier failure of the node)."""
        return await self._send(
            cluster,
            node,
            lambda n: NodeDecisionInput(cluster=cluster, node=node, n=n, policy=policy),
            signal,
            arg,
        )


class LifecycleSignals(_PerNodeSignals):
    """Signal-with-start of a node's current lifecycle (relaunch/workflows/lifecycle.py): one
    at a time per node; a drain while one runs reaches it as another fault."""

    workflow = LIFECYCLE_WORKFLOW
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

        return (await self._send(cluster, node, start, "fault", fault))[0]
