"""The Temporal client connection, the one place that builds it: the address, namespace and
TLS from the cluster's configuration, and the pydantic data converter. Used by the worker, the
watcher, the command line and the console."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client, Interceptor, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, TLSConfig

from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import TemporalTlsSettings
from relaunch.models.errors import RelaunchError

log = logging.getLogger("relaunch.temporal")

# The memo entry by which a signal-with-start's sender knows whether its call started the run
# (started_by): the token of the sender that started it.
STARTED_BY_MEMO = "relaunch-started-by"


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


def start_token() -> str:
    """A token for a signal-with-start's memo (STARTED_BY_MEMO), unique to this call."""
    return uuid.uuid4().hex


async def started_by(client: Client, handle: WorkflowHandle[Any, Any], token: str) -> bool:
    """Whether the signal-with-start that returned ``handle``, with ``token`` in its memo,
    started the workflow's run (False: the signal reached a run already under way, or the
    server could not be asked). One read of the server's record of the run; no worker is
    asked."""
    run = client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    try:
        described = await run.describe()
    except RPCError as exc:
        log.warning("could not tell whether %s was started by this signal: %s", handle.id, exc)
        return False
    return bool(await described.memo_value(STARTED_BY_MEMO, None) == token)
