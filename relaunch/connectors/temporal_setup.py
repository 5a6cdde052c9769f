"""`relaunch setup temporal`: the namespace and the search attributes Relaunch needs on a
Temporal cluster, checked and registered through the frontend's own services (the workflow
service for the namespace, the operator service for the attributes). Idempotent: what is there
already is reported, never changed; an attribute registered with another type is an error."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta

from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from relaunch.models.errors import RelaunchError
from relaunch.models.search_attributes import ALL, SearchAttribute

# The names of this module's types, as the operator service takes them.
_TYPES: dict[str, IndexedValueType.ValueType] = {
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "KeywordList": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST,
    "Bool": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
}
_NAMES = {
    IndexedValueType.INDEXED_VALUE_TYPE_TEXT: "Text",
    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD: "Keyword",
    IndexedValueType.INDEXED_VALUE_TYPE_INT: "Int",
    IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE: "Double",
    IndexedValueType.INDEXED_VALUE_TYPE_BOOL: "Bool",
    IndexedValueType.INDEXED_VALUE_TYPE_DATETIME: "Datetime",
    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST: "KeywordList",
}
RPC_TIMEOUT = timedelta(seconds=10)
# A namespace just registered reaches every frontend's cache within seconds (10 s by default).
NAMESPACE_VISIBLE_S = 30.0


class TemporalSetupError(RelaunchError):
    """The namespace or the search attributes cannot be set up; a person must act."""


class TemporalSetupUnavailableError(TemporalSetupError):
    """The frontend stopped answering mid-way: running the command again may succeed."""

    retryable = True


@dataclass
class TemporalSetup:
    """What `relaunch setup temporal` found and did."""

    namespace: str
    namespace_created: bool = False
    retention: timedelta | None = None
    registered: list[SearchAttribute] = field(default_factory=list)
    present: list[SearchAttribute] = field(default_factory=list)

    def lines(self) -> list[str]:
        days = f", retention {self.retention.days} days" if self.retention is not None else ""
        verb = "created" if self.namespace_created else "exists"
        out = [f"namespace {self.namespace}: {verb}{days}"]
        out += [f"  {a.name} ({a.kind}): registered" for a in self.registered]
        out += [f"  {a.name} ({a.kind}): already there" for a in self.present]
        return out


def _rights_or(exc: RPCError, what: str) -> TemporalSetupError:
    """The RPC failure as one sentence: missing rights named as such."""
    if exc.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
        return TemporalSetupError(
            f"Temporal refused to {what}: {exc.message}",
            hint="this needs Temporal's admin rights on the namespace (an operator's "
            "client certificate or token); run it as such an identity, once",
        )
    if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return TemporalSetupUnavailableError(
            f"Temporal did not answer while trying to {what}: {exc.message}",
            hint="is the frontend address right, and reachable from here?",
        )
    return TemporalSetupError(f"Temporal could not {what}: {exc.message}")


async def _retention(client: Client, namespace: str) -> timedelta | None:
    """The namespace's retention; None when it does not exist."""
    try:
        answer = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace), timeout=RPC_TIMEOUT
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise _rights_or(exc, f"describe namespace {namespace}") from exc
    return answer.config.workflow_execution_retention_ttl.ToTimedelta()


async def _create_namespace(client: Client, namespace: str, retention: timedelta) -> None:
    try:
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(
                namespace=namespace,
                description="Relaunch: recoveries of Slurm jobs",
                workflow_execution_retention_period=Duration(
                    seconds=int(retention.total_seconds())
                ),
            ),
            timeout=RPC_TIMEOUT,
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.ALREADY_EXISTS:  # another caller just made it: fine
            raise _rights_or(exc, f"create namespace {namespace}") from exc
    # Visible to every service of the frontend once its namespace cache refreshes (the
    # workflow service may answer for it before the operator service does).
    deadline = time.monotonic() + NAMESPACE_VISIBLE_S
    while True:
        try:
            await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=namespace), timeout=RPC_TIMEOUT
            )
            return
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise _rights_or(exc, f"list the search attributes of {namespace}") from exc
        if time.monotonic() > deadline:
            raise TemporalSetupError(
                f"namespace {namespace} was created but is not visible after "
                f"{NAMESPACE_VISIBLE_S:.0f} s",
                hint="run the command again in a minute",
            )
        await asyncio.sleep(0.5)


async def _registered(client: Client, namespace: str) -> dict[str, str]:
    """The namespace's custom search attributes: name → type name."""
    try:
        answer = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace), timeout=RPC_TIMEOUT
        )
    except RPCError as exc:
        raise _rights_or(exc, f"list the search attributes of {namespace}") from exc
    return {name: _NAMES.get(kind, str(kind)) for name, kind in answer.custom_attributes.items()}


async def setup_temporal(
    client: Client,
    namespace: str,
    *,
    create_retention: timedelta | None = None,
    attributes: tuple[SearchAttribute, ...] = ALL,
) -> TemporalSetup:
    """Check ``namespace`` (create it with ``create_retention`` when given and missing), then
    register each of ``attributes`` that is not there. Safe to run again."""
    done = TemporalSetup(namespace=namespace)
    done.retention = await _retention(client, namespace)
    if done.retention is None:
        if create_retention is None:
            raise TemporalSetupError(
                f"namespace {namespace} does not exist",
                hint="create it: add --create-namespace (with --retention-days), or "
                f"`temporal operator namespace create --namespace {namespace}`",
            )
        await _create_namespace(client, namespace, create_retention)
        done.namespace_created = True
        done.retention = create_retention
    have = await _registered(client, namespace)
    wrong = [a for a in attributes if a.name in have and have[a.name] != a.kind]
    if wrong:
        raise TemporalSetupError(
            "search attributes registered with another type: "
            + ", ".join(f"{a.name} is {have[a.name]}, Relaunch needs {a.kind}" for a in wrong),
            hint="a search attribute's type cannot change: remove it "
            "(`temporal operator search-attribute remove`) or use another namespace",
        )
    done.present = [a for a in attributes if a.name in have]
    missing = [a for a in attributes if a.name not in have]
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace,
                    search_attributes={a.name: _TYPES[a.kind] for a in missing},
                ),
                timeout=RPC_TIMEOUT,
            )
        except RPCError as exc:
            raise _rights_or(exc, f"register search attributes on {namespace}") from exc
        done.registered = missing
    return done
