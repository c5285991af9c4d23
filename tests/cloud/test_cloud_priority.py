"""Creates before tags under rate limits (issue 19, item 5).

The chaos CI run that left two `large` containers Queued with "waiting: cloud API rate
limit; creates paused" had its mechanism here: every provider rate-limit answer, most of
them to low-value probe-time tag writes, paused every call -- creates included -- and tag
writes took ops/s slots in arrival order, ahead of creates that came later. Now a rate
limit holds back calls of its own priority and lower ones only (creates and destroys >
list > tag writes), waiting creates and destroys take the next slot first, and a tag
write waits (bounded) while any create or destroy is pending.

The back-off rules are pure (fake clock); the layer runs over the real in-process stub
cloud driver, whose API log is the count of what was sent.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from cloud.cloud_peers import MutableClock, OperatorKey, StubCloudFactory, create, stub_facade
from cloud.test_cloud_layers import base_set
from nodewarden.cloud import (
    CloudBackoff,
    CloudError,
    CloudInstance,
    CreateBlocked,
    CreateRequest,
    RateLimited,
)
from nodewarden.cloud.backoff import CallPriority, call_priority
from nodewarden.cloud.facade import CloudFacade
from nodewarden.cloud.layers import RateLimitLayer, _Layer
from nodewarden.cloud.protocol import InstanceSet
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud import StubCloud

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TAG_WRITES = ("create_tags", "delete_tags")


def rate_limit(operation: str, retry_after: float = 5.0) -> RateLimited:
    return RateLimited(
        "RequestLimitExceeded",
        operation=operation,
        observed_at=T0,
        retry_at=T0 + timedelta(seconds=retry_after),
    )


def test_priorities_of_the_operations() -> None:
    assert call_priority("create") is call_priority("destroy") is CallPriority.MUTATE
    assert call_priority("list") is CallPriority.LIST
    assert call_priority("set_tags") is CallPriority.TAG
    assert call_priority("something-new") is CallPriority.MUTATE  # the careful default


def test_a_rate_limit_drawn_by_a_tag_write_pauses_tag_writes_only(
    catalogue: list[InstanceType],
) -> None:
    b = CloudBackoff()
    b.record_error(rate_limit("set_tags"), T0)
    at = T0 + timedelta(seconds=1)
    assert b.call_allowed_at(at, "set_tags") == T0 + timedelta(seconds=5)
    assert b.call_allowed_at(at, "list") is None
    assert b.call_allowed_at(at, "create") is None
    assert b.call_allowed_at(at, "destroy") is None
    assert all(b.may_create(t, at).allowed for t in catalogue)


def test_a_rate_limit_drawn_by_a_list_pauses_lists_and_tags_not_creates(
    catalogue: list[InstanceType],
) -> None:
    b = CloudBackoff()
    b.record_error(rate_limit("list"), T0)
    at = T0 + timedelta(seconds=1)
    assert b.call_allowed_at(at, "list") is not None
    assert b.call_allowed_at(at, "set_tags") is not None
    assert b.call_allowed_at(at, "create") is None
    assert b.may_create(catalogue[0], at).allowed


def test_a_rate_limit_drawn_by_a_create_pauses_everything(catalogue: list[InstanceType]) -> None:
    b = CloudBackoff()
    b.record_error(rate_limit("create"), T0)
    at = T0 + timedelta(seconds=1)
    for operation in ("create", "destroy", "list", "set_tags"):
        assert b.call_allowed_at(at, operation) == T0 + timedelta(seconds=5)
    assert not b.may_create(catalogue[0], at).allowed


def test_each_priority_has_its_own_delay() -> None:
    b = CloudBackoff()
    for _ in range(3):  # tag writes keep drawing rate limits: their delay grows
        b.record_error(rate_limit("set_tags", retry_after=0), T0)
    assert b.rate_limit_delay_of("set_tags") == 4.75
    assert b.rate_limit_delay_of("create") == 0.0
    b.record_error(rate_limit("create", retry_after=0), T0)
    assert b.rate_limit_delay_of("create") == 1.0  # not 4.75 * 1.5 + 1
    b.record_success(T0 + timedelta(seconds=10), "create")
    assert b.rate_limit_delay_of("create") == 0.0
    assert b.rate_limit_delay_of("set_tags") == 4.75  # a create's success does not reset it


async def test_a_provider_rate_limit_on_a_tag_write_does_not_pause_creates(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory()
    clock = MutableClock()
    facade = stub_facade(cloud, catalogue, clock=clock)
    vm, _ = await create(facade, "small", operator_key, name="wn-0")
    cloud.force_rate_limit(1, retry_after=30)
    with pytest.raises(RateLimited) as refused:
        await facade.set_tags(vm, {facade.tag_keys.node: "wn-0"})
    assert not refused.value.locally_throttled
    clock.advance(1)
    # the dispatcher's question: creates are not paused by a tag write's rate limit
    assert all(facade.may_create(t).allowed for t in catalogue)
    sent = len(cloud.api_log)
    second, _ = await create(facade, "small", operator_key, name="wn-1")
    assert cloud.api_log[sent][0] == "create"
    # tag writes themselves wait out the provider's Retry-After, locally
    with pytest.raises(RateLimited) as throttled:
        await facade.set_tags(second, {facade.tag_keys.node: "wn-1"})
    assert throttled.value.locally_throttled
    assert not any(op in TAG_WRITES for op, _ in list(cloud.api_log)[sent:])


async def try_create(facade: CloudFacade, key: OperatorKey, name: str) -> CloudInstance:
    """Create like the dispatcher would ask again: after a refusal, at its retry time."""
    for _ in range(20):
        try:
            vm, _ = await create(facade, "small", key, name=name)
            return vm
        except (RateLimited, CreateBlocked) as exc:
            wait = (exc.retry_at - datetime.now(UTC)).total_seconds() if exc.retry_at else 0.0
            await asyncio.sleep(max(0.0, wait))
    raise AssertionError(f"{name} was never created")


async def try_tag(facade: CloudFacade, vm: CloudInstance, tags: dict[str, str]) -> bool:
    """A probe-time refresh: sent once; a refusal drops it (the next probe retries)."""
    try:
        await facade.set_tags(vm, tags)
    except CloudError:
        return False
    return True


def tag_writes_before_last_create(cloud: StubCloud, since: int) -> int:
    log = list(cloud.api_log)[since:]
    last_create = max(i for i, (op, _) in enumerate(log) if op == "create")
    return sum(1 for op, _ in log[:last_create] if op in TAG_WRITES)


async def test_no_tag_write_is_sent_before_pending_creates_under_3_percent_rate_limits(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory()
    facade = stub_facade(
        cloud, catalogue, ops_per_second=100, max_concurrent_creates=1, tag_write_max_wait=60
    )
    existing = [await try_create(facade, operator_key, f"wn-old-{i}") for i in range(4)]
    cloud.set_faults(rate_limit_rate=0.03, rate_limit_retry_after=0.2)
    since = len(cloud.api_log)
    creates = [
        asyncio.ensure_future(try_create(facade, operator_key, f"wn-new-{i}")) for i in range(8)
    ]
    await asyncio.sleep(0)  # the creates are pending; now the probes' refreshes come
    tags = [
        asyncio.ensure_future(
            try_tag(facade, existing[i % 4], {facade.tag_keys.last_probe: f"probe-{i}"})
        )
        for i in range(24)
    ]
    created = await asyncio.gather(*creates)
    sent = await asyncio.gather(*tags)
    assert len({vm.id for vm in created}) == 8
    assert tag_writes_before_last_create(cloud, since) == 0
    assert any(sent)  # not starved: the refreshes went once the creates were done
    assert sum(1 for op, _ in list(cloud.api_log)[since:] if op == "create") >= 8


class HeldCreates(_Layer):
    """Test-only inner layer: every create waits until `release` is set (a create that
    hangs at the provider); everything else passes through to the stub driver."""

    def __init__(self, inner: InstanceSet) -> None:
        super().__init__(inner)
        self.release = asyncio.Event()

    async def create(self, request: CreateRequest) -> CloudInstance:
        await self.release.wait()
        return await self.inner.create(request)


async def test_a_tag_write_waits_for_pending_creates_at_most_tag_write_max_wait(
    stub_cloud_factory: StubCloudFactory, catalogue: list[InstanceType]
) -> None:
    cloud = stub_cloud_factory()
    held = HeldCreates(base_set(cloud, catalogue))
    layer = RateLimitLayer(held, CloudBackoff(), ops_per_second=0, tag_write_max_wait=0.3)
    held.release.set()
    vm = await layer.create(CreateRequest(name="wn-0", instance_type=catalogue[0], image="i"))
    held.release.clear()
    hanging = asyncio.ensure_future(
        layer.create(CreateRequest(name="wn-1", instance_type=catalogue[0], image="i"))
    )
    try:
        await asyncio.sleep(0)
        assert layer.pending_mutations == 1
        await asyncio.wait_for(layer.set_tags(vm, {"k": "v"}), 20)
        assert not hanging.done()  # sent while the create was still pending
        assert cloud.api_log[-1][0] in TAG_WRITES
    finally:
        held.release.set()
        await hanging
