"""How the processes reach slurmrestd (in-cluster mode) and Temporal (TLS): the ``slurmrestd`` and
``temporal_tls`` sections of a cluster's configuration, with the keys the Helm chart writes.

Both name files (the JWT key, certificates); no secret is ever part of the configuration."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relaunch.models import names

_API_VERSION = re.compile(r"v\d+\.\d+\.\d+")
# The slurmrestd data parsers Relaunch reads and writes, oldest first: v0.0.38 (Slurm 22.05),
# v0.0.40 to v0.0.42 (Slurm 24.11). Each was checked against a real slurmrestd of its release.
SLURMREST_API_VERSIONS = ("v0.0.38", "v0.0.40", "v0.0.41", "v0.0.42")


class SlurmRestSettings(BaseModel):
    """slurmrestd as the read path (and for the actions its API supports) of the worker and
    the watcher.

    ``url`` is ``http(s)://host:port`` (JWT authentication: the processes mint their own
    HS256 tokens from ``jwt_key_file`` for ``user`` and renew them ``renew_before_s`` before
    they expire), or a unix socket path (``/run/slurmrestd.sock`` or ``unix:/run/...``) of a
    ``rest_auth/local`` slurmrestd, where the kernel vouches for the caller and no key is needed.
    The key file is read when the process starts and never logged; it can mint a token for any
    user, so it belongs in its own Secret."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="http(s)://host:port, or a unix socket path")
    user: str | None = Field(
        default=None,
        description="the Slurm user the tokens are for (actions need root, SlurmUser, or an "
        "operator/admin in Slurm's accounting)",
    )
    jwt_key_file: str | None = Field(
        default=None, description="Slurm's jwt key (AuthAltParameters=jwt_key=...)"
    )
    token_lifetime_s: int = Field(default=1800, ge=2, le=86400)
    renew_before_s: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="mint a new token this long before the current expires",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    api_version: str = Field(
        default="auto",
        description="the data parser to use: auto (the newest one both slurmrestd and Relaunch "
        "support, read from the server's OpenAPI document), or one of "
        + ", ".join(SLURMREST_API_VERSIONS),
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value.startswith(("http://", "https://")):
            parts = urlsplit(value)
            if not parts.hostname or "@" in parts.netloc or parts.query or parts.fragment:
                raise ValueError(f"invalid slurmrestd url {value!r}: http(s)://host[:port]")
            return value.rstrip("/")
        path = value.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(
                f"invalid slurmrestd url {value!r}: http(s)://host[:port] or a socket path"
            )
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return None if value is None else names.user_name(value)

    @field_validator("api_version")
    @classmethod
    def _api_version(cls, value: str) -> str:
        if value == "auto":
            return value
        if not _API_VERSION.fullmatch(value):
            raise ValueError(f"invalid slurmrestd api_version {value!r}: auto, or e.g. v0.0.42")
        if value not in SLURMREST_API_VERSIONS:
            raise ValueError(
                f"slurmrestd api_version {value} is not one Relaunch supports: auto, or one of "
                + ", ".join(SLURMREST_API_VERSIONS)
            )
        return value

    @model_validator(mode="after")
    def _auth(self) -> SlurmRestSettings:
        if self.socket_path is None and self.jwt_key_file is None:
            raise ValueError("an http(s) slurmrestd needs jwt_key_file (JWT authentication)")
        if self.jwt_key_file is not None and self.user is None:
            raise ValueError("slurmrestd.jwt_key_file needs slurmrestd.user (the token's user)")
        if self.renew_before_s >= self.token_lifetime_s:
            raise ValueError("slurmrestd.renew_before_s must be shorter than token_lifetime_s")
        return self

    @property
    def socket_path(self) -> str | None:
        """The unix socket to connect to, or None for http(s)."""
        if self.url.startswith(("http://", "https://")):
            return None
        return self.url.removeprefix("unix:")

    @property
    def base_url(self) -> str:
        return "http://localhost" if self.socket_path else self.url


class TemporalTlsSettings(BaseModel):
    """TLS (and mTLS) to the Temporal frontend: PEM files, read when the process connects.

    Without ``server_root_ca_cert`` the server's certificate is checked against the system's
    trust store; ``server_name`` overrides the name checked (and sent as SNI)."""

    model_config = ConfigDict(extra="forbid")

    client_cert: str | None = Field(default=None, description="client certificate (PEM) for mTLS")
    client_key: str | None = Field(default=None, description="its private key (PEM)")
    server_root_ca_cert: str | None = Field(
        default=None, description="the CA that signed the server's certificate (PEM)"
    )
    server_name: str | None = None

    @model_validator(mode="after")
    def _pair(self) -> TemporalTlsSettings:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("temporal_tls: client_cert and client_key go together")
        return self
