"""The Temporal client connection, the one place that builds it: the address, namespace and
TLS from the cluster's configuration, and the pydantic data converter. Used by the worker, the
watcher, the command line and the console."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import TemporalTlsSettings
from relaunch.models.errors import RelaunchError


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


async def connect(config: ClusterConfig) -> Client:
    tls = tls_config(config.temporal_tls)  # an unreadable file is a config error, not retried
    try:
        return await Client.connect(
            config.temporal_address,
            namespace=config.temporal_namespace,
            data_converter=pydantic_data_converter,
            tls=tls,
        )
    except RuntimeError as exc:  # the SDK's "Failed client connect"
        raise TemporalUnavailableError(
            f"cannot reach Temporal at {config.temporal_address}",
            hint="is the Temporal server running (`relaunch dev status`)?",
        ) from exc
