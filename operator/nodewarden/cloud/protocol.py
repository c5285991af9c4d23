"""The seams of the cloud adapter: the `InstanceSet` protocol every layer implements and the
metrics hook. (The address resolver between a cloud address and the SSH endpoint is
`nodewarden.ssh.addressing.AddressResolver`; the stub cloud provides one.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from nodewarden.cloud.model import CloudInstance, CreateRequest


@runtime_checkable
class InstanceSet(Protocol):
    """The cloud as the dispatcher sees it (the Arvados `InstanceSet`).

    Every method raises only `nodewarden.cloud.errors.CloudError` subclasses.
    """

    async def list_instances(self) -> list[CloudInstance]:
        """Instances that exist (terminated ones are left out)."""
        ...

    async def create(self, request: CreateRequest) -> CloudInstance:
        """Create one instance; returns it as the cloud first reported it."""
        ...

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        """Replace the instance's nodewarden tags (keys under the tag prefix) by `tags`.

        Keys under the prefix that are not in `tags` are removed; tags outside the prefix
        (e.g. `Name`, tags set by cloud administrators) are left alone unless `tags` sets
        them.
        """
        ...

    async def destroy(self, instance: CloudInstance) -> None:
        """Destroy the instance. An instance that no longer exists counts as destroyed."""
        ...

    async def close(self) -> None:
        """Release threads and connections."""
        ...


class CloudMetricsHook(Protocol):
    """Receives one observation per cloud call made (not per locally throttled call)."""

    def observe(self, operation: str, outcome: str, seconds: float) -> None:
        """`outcome` is "ok" or a `CloudErrorKind` value."""
        ...
