"""Layered `InstanceSet` wrappers (the Arvados manner), each adding one concern.

Composed once by `nodewarden.cloud.facade.build_cloud`, outermost first:

    TagFilterLayer        list only instances carrying our dispatcher tag
      DefaultTagsLayer    add the default tags (dispatcher id, ...) to creates and tag sets
        RateLimitLayer    ops/s cap (creates and destroys first), max concurrent
                          creates, back-off from CloudBackoff
          FenceLayer      creates, destroys and tag writes only while leadership is
                          valid (`nodewarden.cloud.fence`), checked after every wait above
            MetricsLayer  one observation per real cloud call
              LibcloudInstanceSet   the driver in a bounded thread pool; lists the
                                    instances of every dispatcher (tag key present)

A second, read-mostly view shares the RateLimitLayer and below (so the ops/s cap is
global): `TagFilterLayer(dispatcher key present)` -- the instances of every dispatcher,
for taking over the instances of a dispatcher that stopped probing them.

Every layer implements `nodewarden.cloud.protocol.InstanceSet` and raises only
`CloudError`s, so layers can be tested, reordered or dropped independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from nodewarden.clock import utc_now
from nodewarden.cloud.backoff import CallPriority, CloudBackoff, call_priority
from nodewarden.cloud.errors import CloudError, CreateBlocked, RateLimited
from nodewarden.cloud.libcloudset import Clock
from nodewarden.cloud.model import CloudInstance, CreateRequest
from nodewarden.cloud.protocol import CloudMetricsHook, InstanceSet

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Layer:
    """Delegates every operation to the inner set."""

    def __init__(self, inner: InstanceSet) -> None:
        self.inner = inner

    async def list_instances(self) -> list[CloudInstance]:
        return await self.inner.list_instances()

    async def create(self, request: CreateRequest) -> CloudInstance:
        return await self.inner.create(request)

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        await self.inner.set_tags(instance, tags)

    async def destroy(self, instance: CloudInstance) -> None:
        await self.inner.destroy(instance)

    async def close(self) -> None:
        await self.inner.close()


# ---- metrics ---------------------------------------------------------------------------


class NoMetrics:
    """A metrics hook that records nothing."""

    def observe(self, operation: str, outcome: str, seconds: float) -> None:
        return None


class PrometheusCloudMetrics:
    """`CloudMetricsHook` exporting nodewarden_cloud_calls_total / _call_seconds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "nodewarden_cloud_calls_total",
            "Cloud API calls by operation (list, create, set_tags, destroy) and outcome "
            "(ok or the error kind: quota, capacity, quota-group, rate-limit, transient, "
            "auth, not-found, permanent).",
            ["operation", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "nodewarden_cloud_call_seconds",
            "Duration of cloud API calls by operation.",
            ["operation"],
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )

    def observe(self, operation: str, outcome: str, seconds: float) -> None:
        self.calls.labels(operation, outcome).inc()
        self.seconds.labels(operation).observe(seconds)


class MetricsLayer(_Layer):
    """Reports each call's operation, outcome and duration to a `CloudMetricsHook`."""

    def __init__(self, inner: InstanceSet, hook: CloudMetricsHook) -> None:
        super().__init__(inner)
        self.hook = hook

    async def _timed(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        start = time.perf_counter()
        outcome = "ok"
        try:
            return await call()
        except CloudError as err:
            outcome = err.kind.value
            raise
        finally:
            try:
                self.hook.observe(operation, outcome, time.perf_counter() - start)
            except Exception:  # a broken metrics hook must not fail cloud calls
                log.exception("cloud metrics hook failed")

    async def list_instances(self) -> list[CloudInstance]:
        return await self._timed("list", self.inner.list_instances)

    async def create(self, request: CreateRequest) -> CloudInstance:
        return await self._timed("create", lambda: self.inner.create(request))

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        await self._timed("set_tags", lambda: self.inner.set_tags(instance, tags))

    async def destroy(self, instance: CloudInstance) -> None:
        await self._timed("destroy", lambda: self.inner.destroy(instance))


# ---- rate limiting and back-off -----------------------------------------------------------


class _Slots:
    """At most one call starts per `interval`, highest priority first (lower
    `CallPriority` value), in arrival order within a priority. A call that finds no one
    waiting and its slot free starts at once."""

    def __init__(
        self,
        interval: float,
        monotonic: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._interval = interval
        self._monotonic = monotonic
        self._sleep = sleep
        self._next = float("-inf")
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._releaser: asyncio.Task[None] | None = None

    async def take(self, priority: CallPriority) -> None:
        if self._interval <= 0:
            return
        now = self._monotonic()
        if not self._waiting and now >= self._next:
            self._next = now + self._interval
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (int(priority), next(self._order), turn))
        if self._releaser is None or self._releaser.done():
            self._releaser = asyncio.ensure_future(self._release())
        await turn

    async def _release(self) -> None:
        while self._waiting:
            now = self._monotonic()
            if now < self._next:
                await self._sleep(self._next - now)
                continue
            _, _, turn = heapq.heappop(self._waiting)
            if turn.done():  # its caller gave up (cancelled)
                continue
            self._next = now + self._interval
            turn.set_result(None)


class RateLimitLayer(_Layer):
    """Caps calls per second and concurrent creates; applies and feeds `CloudBackoff`.

    - At most `ops_per_second` calls start per second (0 = unlimited): a call waits for
      its slot; waiting creates and destroys take the next slot before a waiting list,
      and a list before a waiting tag write (`CallPriority`).
    - At most `max_concurrent_creates` creates run at once (0 = unlimited).
    - A tag write waits while any create or destroy is pending here (called and not
      finished, waiting for its slot or a create slot included), for at most
      `tag_write_max_wait` seconds: tag refreshes take no budget a create needs, yet
      still land well before another dispatcher's takeover would need them.
    - While the back-off holds a call's priority back (a rate limit drawn at that
      priority or a higher one), the call fails at once with
      `RateLimited(locally_throttled=True, retry_at=...)` instead of reaching the cloud.
      A rate limit drawn by a tag write never holds back a create.
    - A create the back-off does not allow fails at once with `CreateBlocked` carrying
      the reason and `retry_at`.
    - Every outcome of a real call is recorded in the back-off.
    """

    def __init__(
        self,
        inner: InstanceSet,
        backoff: CloudBackoff,
        *,
        ops_per_second: float = 10.0,
        max_concurrent_creates: int = 1,
        tag_write_max_wait: float = 10.0,
        clock: Clock = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(inner)
        self.backoff = backoff
        self._slots = _Slots(1.0 / ops_per_second if ops_per_second > 0 else 0.0, monotonic, sleep)
        self._create_slots = (
            asyncio.Semaphore(max_concurrent_creates) if max_concurrent_creates > 0 else None
        )
        self._tag_write_max_wait = tag_write_max_wait
        self._clock = clock
        self._mutations = 0
        self._no_mutations = asyncio.Event()
        self._no_mutations.set()

    @property
    def pending_mutations(self) -> int:
        """Creates and destroys called here and not finished."""
        return self._mutations

    @contextlib.asynccontextmanager
    async def _mutation(self) -> AsyncIterator[None]:
        self._mutations += 1
        self._no_mutations.clear()
        try:
            yield
        finally:
            self._mutations -= 1
            if self._mutations == 0:
                self._no_mutations.set()

    async def _tag_slot(self) -> None:
        """Take a slot for a tag write once no create or destroy is pending, or once it
        has waited `tag_write_max_wait` for them. A create that arrives while the write
        waits for its slot sends it back to waiting."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._tag_write_max_wait
        while True:
            if not self._no_mutations.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(give_up):
                        await self._no_mutations.wait()
            await self._slots.take(CallPriority.TAG)
            if self._no_mutations.is_set():
                return
            if loop.time() >= give_up:
                log.info(
                    "tag write sent after waiting %gs for %d pending create(s)/destroy(s)",
                    self._tag_write_max_wait,
                    self._mutations,
                )
                return

    def _check_calls_allowed(self, operation: str) -> None:
        now = self._clock()
        until = self.backoff.call_allowed_at(now, operation)
        if until is not None:
            raise RateLimited(
                f"throttled locally after a provider rate limit; retry after {until.isoformat()}",
                operation=operation,
                observed_at=now,
                retry_at=until,
                locally_throttled=True,
            )

    async def _guarded(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        request: CreateRequest | None = None,
    ) -> T:
        self._check_calls_allowed(operation)
        if operation == "set_tags":
            await self._tag_slot()
        else:
            await self._slots.take(call_priority(operation))
        self._check_calls_allowed(operation)
        if request is not None:
            self._check_create_allowed(request)
        try:
            result = await call()
        except CloudError as err:
            self.backoff.record_error(
                err, self._clock(), request.instance_type if request else None
            )
            raise
        self.backoff.record_success(self._clock(), operation)
        return result

    def _check_create_allowed(self, request: CreateRequest) -> None:
        now = self._clock()
        permission = self.backoff.may_create(request.instance_type, now)
        if not permission.allowed:
            assert permission.blocked_by is not None
            raise CreateBlocked(
                permission.reason,
                cause_kind=permission.blocked_by,
                operation="create",
                observed_at=now,
                instance_type=request.instance_type.name,
                quota_group=request.instance_type.quota_group,
                retry_at=permission.retry_at,
            )

    async def list_instances(self) -> list[CloudInstance]:
        return await self._guarded("list", self.inner.list_instances)

    async def create(self, request: CreateRequest) -> CloudInstance:
        self._check_create_allowed(request)
        async with self._mutation():
            if self._create_slots is None:
                return await self._guarded("create", lambda: self.inner.create(request), request)
            async with self._create_slots:
                return await self._guarded("create", lambda: self.inner.create(request), request)

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        await self._guarded("set_tags", lambda: self.inner.set_tags(instance, tags))

    async def destroy(self, instance: CloudInstance) -> None:
        async with self._mutation():
            await self._guarded("destroy", lambda: self.inner.destroy(instance))


# ---- tags ------------------------------------------------------------------------------


class DefaultTagsLayer(_Layer):
    """Adds `default_tags` to every create and every tag replacement (caller's tags win)."""

    def __init__(self, inner: InstanceSet, default_tags: Mapping[str, str]) -> None:
        super().__init__(inner)
        self.default_tags = dict(default_tags)

    async def create(self, request: CreateRequest) -> CloudInstance:
        tags = {**self.default_tags, **request.tags}
        return await self.inner.create(request.model_copy(update={"tags": tags}))

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        await self.inner.set_tags(instance, {**self.default_tags, **tags})


class TagFilterLayer(_Layer):
    """Lists only instances whose tags contain every (key, value) of `filter_tags`.

    A value of None means "the key is present, with any value".
    """

    def __init__(self, inner: InstanceSet, filter_tags: Mapping[str, str | None]) -> None:
        super().__init__(inner)
        self.filter_tags = dict(filter_tags)

    def matches(self, instance: CloudInstance) -> bool:
        for key, value in self.filter_tags.items():
            if key not in instance.tags:
                return False
            if value is not None and instance.tags[key] != value:
                return False
        return True

    async def list_instances(self) -> list[CloudInstance]:
        return [i for i in await self.inner.list_instances() if self.matches(i)]


def retry_delay(err: CloudError, now: datetime) -> float:
    """Seconds until `err.retry_at` (0 if unset or past): a convenience for callers."""
    if err.retry_at is None:
        return 0.0
    return max(0.0, (err.retry_at - now).total_seconds())
