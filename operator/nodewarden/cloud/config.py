"""Cloud configuration (`CloudConfig`) and the resolved provider credentials.

`CloudConfig` is plain configuration (YAML / Helm values): which libcloud driver with
which parameters, the image, the tag prefix, the rate limits and back-off, the
instance-type catalogue and the instance-type choice knobs. It never holds credentials:
it names the Kubernetes Secret keys that hold them (`credentials`). The operator reads
the Secret and builds `CloudCredentials`, whose values are `SecretStr` (repr and str
show `**********`) and are handed to the libcloud driver only.

Example (YAML, snake_case or camelCase keys)::

    driver: ec2
    driver_params: {region: eu-west-1}
    credentials:
      key_ref: {name: nodewarden-cloud, key: access-key-id}
      secret_ref: {name: nodewarden-cloud, key: secret-access-key}
    image: ami-0123456789abcdef0
    ops_per_second: 10
    max_concurrent_creates: 1
    instance_types:
      - {name: m5.large, provider_type: m5.large, vcpus: 2, ram: 8Gi, scratch: 32Gi,
         price: 0.096, quota_group: standard}
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from nodewarden.api.base import SecretKeyReference
from nodewarden.cloud.backoff import BackoffSettings
from nodewarden.cloud.tags import DEFAULT_TAG_PREFIX
from nodewarden.scheduling.instancetypes import InstanceType, InstanceTypePolicy

DriverParam = str | int | float | bool


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CloudCredentialsRef(_Config):
    """Where the provider credentials live: keys of Secrets in the operator's namespace."""

    key_ref: SecretKeyReference = Field(
        description="Secret key holding the driver's `key` (EC2: access key id)."
    )
    secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="Secret key holding the driver's `secret` (EC2: secret access key).",
    )


class CloudCredentials(BaseModel):
    """Resolved provider credentials. Values never appear in repr, str, logs or errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: SecretStr
    secret: SecretStr | None = None

    def values(self) -> list[str]:
        """The plain values, for redaction filters only."""
        out = [self.key.get_secret_value()]
        if self.secret is not None:
            out.append(self.secret.get_secret_value())
        return [v for v in out if v]

    @classmethod
    def from_secret_data(
        cls,
        ref: CloudCredentialsRef,
        secrets: Mapping[str, Mapping[str, str]],
    ) -> CloudCredentials:
        """Build from Kubernetes Secret `data` (base64 values) keyed by Secret name.

        Raises KeyError naming the Secret and key (never a value) when one is missing.
        """

        def read(key_ref: SecretKeyReference) -> SecretStr:
            data = secrets.get(key_ref.name)
            if data is None or key_ref.key not in data:
                raise KeyError(f"Secret {key_ref.name!r} has no key {key_ref.key!r}")
            try:
                raw = base64.b64decode(data[key_ref.key], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise KeyError(
                    f"Secret {key_ref.name!r} key {key_ref.key!r} is not valid base64"
                ) from exc
            return SecretStr(raw.decode().strip())

        return cls(
            key=read(ref.key_ref),
            secret=read(ref.secret_ref) if ref.secret_ref is not None else None,
        )


class CloudConfig(_Config):
    """Everything the cloud adapter needs except credentials values and the dispatcher id."""

    driver: str = Field(
        description="libcloud provider name, e.g. 'ec2', or 'nodewarden-stub' for the stub cloud."
    )
    driver_plugin: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        description=(
            "For a provider outside libcloud: 'package.module:attribute' of a driver plugin "
            "that registers it (the stub cloud among the test doubles is one; README 'Cloud')."
        ),
    )
    driver_params: dict[str, DriverParam] = Field(
        default_factory=dict,
        description=(
            "Keyword arguments for the driver (region, host, port, secure, "
            "signature_version, timeout; stub: cloud)."
        ),
    )
    credentials: CloudCredentialsRef | None = Field(
        default=None, description="Secret keys holding the provider credentials."
    )
    image: str = Field(min_length=1, description="Image id used for new instances.")
    tag_prefix: str = Field(
        default=DEFAULT_TAG_PREFIX,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/=+-]*$",
        description="Prefix of every tag key nodewarden writes.",
    )
    default_tags: dict[str, str] = Field(
        default_factory=dict, description="Extra tags written on every instance."
    )
    ops_per_second: float = Field(
        default=10.0, ge=0, description="Cloud API calls per second (0 = unlimited)."
    )
    max_concurrent_creates: int = Field(
        default=1, ge=0, description="Creates in flight at once (0 = unlimited)."
    )
    tag_write_max_wait: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description=(
            "Seconds a tag write (probe-time refresh, idle behaviour, takeover claim) waits "
            "while creates or destroys are pending before it is sent anyway; keep it well "
            "below the policy's takeoverAfter (a late refresh must not look like a stopped "
            "dispatcher)."
        ),
    )
    max_threads: int = Field(
        default=8, ge=1, le=256, description="Threads running libcloud calls (bounds concurrency)."
    )
    list_in_process: bool = Field(
        default=True,
        description=(
            "Decode the instance list in a worker process that sends back only what "
            "changed (cloud/listproc.py); false: in a libcloud thread."
        ),
    )
    backoff: BackoffSettings = Field(default_factory=BackoffSettings)
    instance_types: list[InstanceType] = Field(
        default_factory=list, description="The instance-type catalogue."
    )
    currency: str = Field(
        default="USD",
        pattern=r"^[A-Z]{3}$",
        description=(
            "ISO 4217 code of the catalogue's prices (and of the energy prices): the "
            "`currency` label of nodewarden_cloud_spend_per_hour and of money saved."
        ),
    )
    instance_type_policy: InstanceTypePolicy = Field(
        default_factory=InstanceTypePolicy,
        description="RAM overhead / discount and price factor of the instance-type choice.",
    )
    ssh_port: int = Field(default=22, ge=1, le=65535, description="SSH port of instances.")
    use_public_ip: bool = Field(
        default=False, description="Reach instances at their public address (default private)."
    )

    @model_validator(mode="after")
    def _unique_type_names(self) -> Self:
        names = [t.name for t in self.instance_types]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"instance_types: names listed twice: {', '.join(duplicates)}")
        for key in self.default_tags:
            if key.startswith(self.tag_prefix):
                raise ValueError(
                    f"default_tags: key {key!r} uses the reserved prefix {self.tag_prefix!r}"
                )
        return self
