"""Connection settings for one BMC: endpoint, credentials, CA bundle, timeouts.

Built by the caller from a WorkerNode's `spec.bmc` and the Secrets it refers to. The
password is a SecretStr, so neither repr nor logs show it. Only https endpoints are
accepted and certificate verification cannot be switched off.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from nodewarden.api.workernode import BmcEndpoint


class RedfishEndpointConfig(BaseModel):
    """Everything a RedfishClient needs to reach and authenticate to one BMC."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str = Field(description="https://host[:port] of the Redfish service.")
    username: str = Field(min_length=1, max_length=256, repr=False)
    """Secret class like the password (docs/security.md): never in a repr or message."""
    password: SecretStr
    system_id: str | None = Field(
        default=None, description="ComputerSystem id; None = the only member of Systems."
    )
    ca_bundle_pem: str | None = Field(
        default=None,
        description="PEM CA certificates that sign the BMC's certificate; None = system store.",
    )
    use_sessions: bool = Field(
        default=True,
        description="Log in through SessionService; Basic auth when the login fails for "
        "another reason than rejected credentials (see auth.py).",
    )
    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    request_timeout: float = Field(default=15.0, gt=0, le=600)

    @field_validator("endpoint")
    @classmethod
    def _https_origin(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "https":
            raise ValueError(f"Redfish endpoint must be https://host[:port], got {value!r}")
        if not parts.hostname:
            raise ValueError(f"Redfish endpoint has no host: {value!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "Redfish endpoint must not carry user info; pass username/password separately"
            )
        if parts.path.rstrip("/") not in ("", "/redfish/v1"):
            raise ValueError(
                f"Redfish endpoint must be the service origin (the service root is always "
                f"/redfish/v1/), got path {parts.path!r}"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"Redfish endpoint must not carry a query or fragment: {value!r}")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"Redfish endpoint has an invalid port: {value!r}") from exc
        host = parts.hostname
        if ":" in host:
            host = f"[{host}]"
        return f"https://{host}" + (f":{port}" if port is not None else "")

    @property
    def source(self) -> str:
        """Provenance label of facts read from this BMC: 'redfish:<endpoint>'."""
        return f"redfish:{self.endpoint}"

    @classmethod
    def from_bmc_endpoint(
        cls,
        bmc: BmcEndpoint,
        *,
        username: str,
        password: SecretStr,
        ca_bundle_pem: str | None,
        **settings: Any,
    ) -> RedfishEndpointConfig:
        """Settings for a WorkerNode's `spec.bmc`, with the values its Secrets hold."""
        return cls(
            endpoint=bmc.endpoint,
            system_id=bmc.system_id,
            use_sessions=bmc.use_sessions,
            username=username,
            password=password,
            ca_bundle_pem=ca_bundle_pem,
            **settings,
        )
