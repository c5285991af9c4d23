"""The innermost `InstanceSet`: a libcloud driver run in a bounded thread pool.

libcloud is synchronous; every driver call runs in a `ThreadPoolExecutor` owned by this
object (`max_threads` bounds the threads and therefore the concurrent cloud calls).
libcloud connection objects are not thread-safe (`Connection.request` keeps the current
action/method on the shared connection, and AWS signing reads them back), so each
worker thread gets its own driver instance from `driver_factory`.
Exceptions are classified into `nodewarden.cloud.errors.CloudError` here, with the
configured credentials redacted from every message. Nodes are converted to
`CloudInstance` views stamped with the time they were read and the driver as source.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TypeVar

from libcloud.compute.base import Node, NodeDriver
from libcloud.compute.types import NodeState

from nodewarden.clock import utc_now
from nodewarden.cloud.dialects import DriverDialect, dialect_for
from nodewarden.cloud.errors import CloudError, InstanceNotFound, Redactor, classify
from nodewarden.cloud.model import CloudInstance, CreateRequest, InstanceState
from nodewarden.cloud.tags import TagKeys
from nodewarden.scheduling.instancetypes import InstanceType

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], datetime]

_STATE_MAP: dict[str, InstanceState] = {
    NodeState.PENDING.value: InstanceState.PENDING,
    NodeState.STARTING.value: InstanceState.PENDING,
    NodeState.REBOOTING.value: InstanceState.RUNNING,
    NodeState.RUNNING.value: InstanceState.RUNNING,
    NodeState.NORMAL.value: InstanceState.RUNNING,
    NodeState.UPDATING.value: InstanceState.RUNNING,
    NodeState.RECONFIGURING.value: InstanceState.RUNNING,
    NodeState.MIGRATING.value: InstanceState.RUNNING,
    NodeState.STOPPING.value: InstanceState.STOPPING,
    NodeState.STOPPED.value: InstanceState.STOPPED,
    NodeState.SUSPENDED.value: InstanceState.STOPPED,
    NodeState.PAUSED.value: InstanceState.STOPPED,
    NodeState.TERMINATED.value: InstanceState.TERMINATED,
    NodeState.ERROR.value: InstanceState.ERROR,
}


class LibcloudInstanceSet:
    """`InstanceSet` over one libcloud `NodeDriver` instance."""

    def __init__(
        self,
        driver_factory: Callable[[], NodeDriver],
        *,
        image: str,
        catalogue: list[InstanceType],
        tag_keys: TagKeys,
        list_filter: Mapping[str, str | None] | None = None,
        max_threads: int = 8,
        redactor: Redactor | None = None,
        dialect: DriverDialect | None = None,
        clock: Clock = utc_now,
        source: str | None = None,
    ) -> None:
        self._driver_factory = driver_factory
        self._local = threading.local()
        first = driver_factory()  # fails early on bad parameters; used by the first thread
        self._spare: list[NodeDriver] = [first]
        self._spare_lock = threading.Lock()
        self._dialect = dialect or dialect_for(first)
        self.process_local = bool(getattr(first, "process_local", False))
        """The driver's instances live in this process (a test double's in-memory cloud):
        no worker process can list them."""
        self._image = image
        self._catalogue = list(catalogue)
        self._by_name = {t.name: t for t in self._catalogue}
        self._tag_keys = tag_keys
        self._list_filter = dict(list_filter or {})
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, max_threads), thread_name_prefix="nodewarden-cloud"
        )
        self._redact = redactor or Redactor()
        self._clock = clock
        self.source = source or f"cloud:{self._dialect.name}"

    def _driver(self) -> NodeDriver:
        """This thread's driver instance."""
        driver: NodeDriver | None = getattr(self._local, "driver", None)
        if driver is None:
            with self._spare_lock:
                driver = self._spare.pop() if self._spare else None
            if driver is None:
                driver = self._driver_factory()
            self._local.driver = driver
        return driver

    async def _call(
        self,
        operation: str,
        fn: Callable[[NodeDriver], T],
        *,
        instance_type: InstanceType | None = None,
    ) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(self._driver()))
        except Exception as exc:
            # Chain nothing: the original exception text may carry unredacted details.
            raise self._classified(exc, operation, instance_type) from None

    def _classified(
        self, exc: Exception, operation: str, instance_type: InstanceType | None
    ) -> CloudError:
        error = classify(
            exc,
            operation=operation,
            now=self._clock(),
            instance_type=instance_type.name if instance_type else None,
            quota_group=instance_type.quota_group if instance_type else None,
            redact=self._redact,
        )
        log.debug(
            "cloud call failed",
            extra={
                "operation": operation,
                "error_kind": error.kind.value,
                "exception_type": type(exc).__name__,
                "provider_code": error.provider_code,
            },
        )
        return error

    async def list_instances(self) -> list[CloudInstance]:
        # the decode (libcloud's nodes into CloudInstance views) runs in the thread too:
        # on the event loop it held it for ~150 ms per 8,000 instances
        return await self._call("list", self._decode_list)

    def list_blocking(self) -> list[CloudInstance]:
        """`list_instances` in the calling thread (a worker process's `ProcessListLayer`
        calls this); raises `CloudError`."""
        try:
            return self._decode_list(self._driver())
        except Exception as exc:
            raise self._classified(exc, "list", None) from None

    def _decode_list(self, driver: NodeDriver) -> list[CloudInstance]:
        nodes = self._dialect.list_nodes(driver, self._list_filter)
        now = self._clock()
        out = [self._to_instance(node, now) for node in nodes]
        return [i for i in out if i.state is not InstanceState.TERMINATED]

    async def create(self, request: CreateRequest) -> CloudInstance:
        image = request.image or self._image
        tags = dict(request.tags)
        node = await self._call(
            "create",
            lambda driver: self._dialect.create_node(driver, request, image, tags),
            instance_type=request.instance_type,
        )
        instance = self._to_instance(node, self._clock(), fallback_tags=tags)
        if instance.instance_type is None:
            instance = instance.model_copy(
                update={
                    "instance_type": request.instance_type.name,
                    "price": request.instance_type.price,
                }
            )
        log.info(
            "cloud instance created",
            extra={
                "instance_id": instance.id,
                "instance_type": request.instance_type.name,
                "instance_name": request.name,
            },
        )
        return instance

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        remove = [k for k in instance.tags if self._tag_keys.owns(k) and k not in tags]
        changed = {k: v for k, v in tags.items() if instance.tags.get(k) != v}
        if not changed and not remove:
            return
        await self._call(
            "set_tags",
            lambda driver: self._dialect.set_tags(driver, instance.id, changed, remove),
        )

    async def destroy(self, instance: CloudInstance) -> None:
        try:
            await self._call(
                "destroy", lambda driver: self._dialect.destroy_node(driver, instance.id)
            )
        except InstanceNotFound:
            log.info("cloud instance already gone", extra={"instance_id": instance.id})
            return
        log.info("cloud instance destroyed", extra={"instance_id": instance.id})

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _to_instance(
        self, node: Node, now: datetime, fallback_tags: Mapping[str, str] | None = None
    ) -> CloudInstance:
        tags = self._dialect.node_tags(node) or dict(fallback_tags or {})
        provider_type = self._dialect.node_provider_type(node)
        itype = self._by_name.get(tags.get(self._tag_keys.instance_type, ""))
        if itype is None and provider_type is not None:
            itype = next((t for t in self._catalogue if t.provider_type == provider_type), None)
        created = node.created_at
        if isinstance(created, datetime) and created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return CloudInstance(
            id=str(node.id),
            name=str(node.name or node.id),
            instance_type=itype.name if itype else None,
            provider_type=provider_type or (itype.provider_type if itype else None),
            state=_STATE_MAP.get(_state_value(node.state), InstanceState.UNKNOWN),
            tags=tags,
            public_ips=tuple(str(ip) for ip in node.public_ips or () if ip),
            private_ips=tuple(str(ip) for ip in node.private_ips or () if ip),
            price=itype.price if itype else None,
            created_at=created if isinstance(created, datetime) else None,
            observed_at=now,
            source=self.source,
        )


def _state_value(state: object) -> str:
    value = getattr(state, "value", state)
    return str(value).lower()
