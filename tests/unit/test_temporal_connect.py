"""The Temporal connection (relaunch.connectors.temporal): TLS built from the ``temporal_tls``
section, what the client is connected with, and an unreachable frontend as a retryable error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from relaunch.connectors import temporal
from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import TemporalTlsSettings


def cluster(**sections: Any) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"name": "c1", "database_url": "postgresql://x/y", "bundle_dir": "/tmp/b", **sections}
    )


def test_tls_config_is_built_from_the_files(tmp_path: Path) -> None:
    files = {name: tmp_path / name for name in ("tls.crt", "tls.key", "ca.crt")}
    for name, path in files.items():
        path.write_bytes(f"-----BEGIN {name}-----\n".encode())
    settings = TemporalTlsSettings(
        client_cert=str(files["tls.crt"]),
        client_key=str(files["tls.key"]),
        server_root_ca_cert=str(files["ca.crt"]),
        server_name="temporal.internal",
    )
    assert temporal.tls_config(settings) == TLSConfig(
        server_root_ca_cert=b"-----BEGIN ca.crt-----\n",
        domain="temporal.internal",
        client_cert=b"-----BEGIN tls.crt-----\n",
        client_private_key=b"-----BEGIN tls.key-----\n",
    )
    assert temporal.tls_config(None) is False
    server_only = temporal.tls_config(TemporalTlsSettings())
    assert server_only == TLSConfig()  # TLS with the system's trust store, no client cert
    files["tls.key"].unlink()
    with pytest.raises(temporal.TemporalTlsError, match="temporal_tls.client_key"):
        temporal.tls_config(settings)


async def test_connect_passes_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"CA")
    seen: dict[str, Any] = {}

    async def fake_connect(target: str, **kwargs: Any) -> str:
        seen.update(kwargs, target=target)
        return "client"

    monkeypatch.setattr(Client, "connect", fake_connect)
    await temporal.connect(cluster(temporal_tls={"server_root_ca_cert": str(ca)}))
    assert seen["tls"] == TLSConfig(server_root_ca_cert=b"CA")
    await temporal.connect(cluster())
    assert seen["tls"] is False


async def test_an_unreachable_frontend_is_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(target: str, **kwargs: Any) -> Client:
        raise RuntimeError("Failed client connect")

    monkeypatch.setattr(Client, "connect", refuse)
    with pytest.raises(temporal.TemporalUnavailableError, match="cannot reach Temporal") as info:
        await temporal.connect(cluster())
    assert info.value.retryable
