"""The configuration file of a stub cloud server (`python -m nodewarden_doubles.stubcloud.server`).

YAML or JSON, snake_case keys (the same names as the Python models)::

    name: demo                      # label in logs (default "stub")
    credentials:                    # the key/secret drivers must sign with;
      key: AKIASTUBKEY0001          #   omitted = any signature is accepted
      secret: stub-secret-value
    admin_token: 2f0c...            # bearer token of /admin/*; omitted = generated
    faults:                         # nodewarden_doubles.stubcloud.faults.StubFaults
      seed: 1
      instance_quota: 5
      type_capacity: {m5.large: 0}
    instance_types:                 # nodewarden.scheduling.instancetypes.InstanceType;
      - {name: small, provider_type: t3.small, vcpus: 2, ram: 2Gi, price: 0.02}
                                    #   empty = any size accepted (1 vCPU each)

Credentials and the admin token are `SecretStr`: never in reprs or logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud.faults import StubFaults


class StubServerCredentials(BaseModel):
    """The provider credentials the stub cloud server accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr = Field(description="Access key id the driver signs with.")
    secret: SecretStr | None = Field(default=None, description="Secret key (None = empty).")


class StubServerConfig(BaseModel):
    """Everything a stub cloud server starts with (state itself is in memory only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="stub", min_length=1, max_length=64, description="Log label.")
    credentials: StubServerCredentials | None = Field(
        default=None, description="Accepted credentials; None = any signature accepted."
    )
    admin_token: SecretStr | None = Field(
        default=None, description="Bearer token of the admin endpoints; None = generated."
    )
    faults: StubFaults = Field(default_factory=StubFaults)
    instance_types: list[InstanceType] = Field(default_factory=list)

    @classmethod
    def from_file(cls, path: Path) -> StubServerConfig:
        """Read a YAML or JSON file (JSON is YAML)."""
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the stub cloud config must be a mapping")
        return cls.model_validate(data)

    def file_data(self) -> dict[str, Any]:
        """The config as file content, secrets revealed (write it with mode 0600)."""
        data = self.model_dump(mode="json", exclude={"credentials", "admin_token"})
        if self.credentials is not None:
            creds: dict[str, str] = {"key": self.credentials.key.get_secret_value()}
            if self.credentials.secret is not None:
                creds["secret"] = self.credentials.secret.get_secret_value()
            data["credentials"] = creds
        if self.admin_token is not None:
            data["admin_token"] = self.admin_token.get_secret_value()
        return data

    def credential_pair(self) -> tuple[str, str | None] | None:
        """(key, secret) in the clear, for the signature check."""
        if self.credentials is None:
            return None
        secret = self.credentials.secret
        return (
            self.credentials.key.get_secret_value(),
            secret.get_secret_value() if secret is not None else None,
        )
