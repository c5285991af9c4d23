"""The cloud layer stack's fence: creates, destroys and tag writes only while leadership is valid.

`FenceLayer` sits below the rate-limit layer and above the metrics layer and the driver
(`nodewarden.cloud.facade.build_cloud`), so the check is made after every wait the
other layers add -- the ops/s slot, the create slot -- immediately before the call is
handed to the driver's thread pool (a call not sent is no cloud call for the metrics). A cloud API cannot compare a fencing token: this
local check of the replica's own monotonic validity (`nodewarden.fence`) is the fence
there, together with the status written before the call where one is (a WorkerNode is
created before its instance). Listing only reads: not fenced.

A refused call raises `NotSent`, a `CloudError` marked locally throttled so the back-off
does not count it against the provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from nodewarden.clock import utc_now
from nodewarden.cloud.errors import TransientCloudError
from nodewarden.cloud.libcloudset import Clock
from nodewarden.cloud.model import CloudInstance, CreateRequest
from nodewarden.cloud.protocol import InstanceSet
from nodewarden.fence import Fence, NotLeader
from nodewarden.metrics import FENCED


class NotSent(TransientCloudError):
    """The call was not sent: this replica's leadership is not valid."""


class FenceLayer:
    """Asks the fence before every call that changes something at the provider."""

    def __init__(self, inner: InstanceSet, fence: Fence, clock: Clock = utc_now) -> None:
        self.inner = inner
        self.fence = fence
        self._clock = clock

    def _check(self, operation: str, subject: str) -> None:
        try:
            self.fence.check(f"cloud {operation} {subject}")
        except NotLeader as exc:
            FENCED.labels("cloud").inc()
            now: datetime = self._clock()
            raise NotSent(
                str(exc), operation=operation, observed_at=now, locally_throttled=True
            ) from None

    async def list_instances(self) -> list[CloudInstance]:
        return await self.inner.list_instances()

    async def create(self, request: CreateRequest) -> CloudInstance:
        self._check("create", request.name)
        return await self.inner.create(request)

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        self._check("set_tags", instance.id)
        await self.inner.set_tags(instance, tags)

    async def destroy(self, instance: CloudInstance) -> None:
        self._check("destroy", instance.id)
        await self.inner.destroy(instance)

    async def close(self) -> None:
        await self.inner.close()
