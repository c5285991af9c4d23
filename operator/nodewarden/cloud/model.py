"""What the cloud adapter hands to callers: the instance view and the create request."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from nodewarden.scheduling.instancetypes import InstanceType


class InstanceState(StrEnum):
    """Cloud-side state of an instance (not its readiness; that comes from the SSH probe)."""

    PENDING = "Pending"
    RUNNING = "Running"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    TERMINATED = "Terminated"
    ERROR = "Error"
    UNKNOWN = "Unknown"


class CloudInstance(BaseModel):
    """One instance as the cloud API reported it, with when and from where."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Provider instance id.")
    name: str = Field(description="Instance name (EC2: the Name tag).")
    instance_type: str | None = Field(
        description="Catalogue name: from our instance-type tag, else matched by provider type."
    )
    provider_type: str | None = Field(description="The provider's size id, when reported.")
    state: InstanceState
    tags: dict[str, str] = Field(default_factory=dict, description="All tags of the instance.")
    public_ips: tuple[str, ...] = ()
    private_ips: tuple[str, ...] = ()
    price: float | None = Field(description="Hourly price from the catalogue, when known.")
    created_at: datetime | None = Field(description="Launch time reported by the cloud.")
    observed_at: datetime = Field(description="When this view was read from the cloud.")
    source: str = Field(description="Which cloud reported it, e.g. 'cloud:ec2'.")

    def same_as(self, other: CloudInstance) -> bool:
        """What the dispatcher acts on is unchanged: state, tags, addresses, name, type
        and launch time (`observed_at`, new with every list, is no change)."""
        return self is other or (
            self.state == other.state
            and self.tags == other.tags
            and self.private_ips == other.private_ips
            and self.public_ips == other.public_ips
            and self.name == other.name
            and self.instance_type == other.instance_type
            and self.created_at == other.created_at
        )

    def address(self, prefer_public: bool = False) -> str | None:
        """The address to reach the instance at: private first unless `prefer_public`."""
        first, second = (
            (self.public_ips, self.private_ips)
            if prefer_public
            else (self.private_ips, self.public_ips)
        )
        for ip in (*first, *second):
            if ip:
                return ip
        return None


class CreateRequest(BaseModel):
    """What to create. `user_data` carries the SSH key and instance secret: never logged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    instance_type: InstanceType
    image: str | None = Field(default=None, description="Image id; None = the configured image.")
    tags: dict[str, str] = Field(default_factory=dict)
    user_data: SecretStr = Field(
        default=SecretStr(""), description="Init script / user data given to the instance."
    )
