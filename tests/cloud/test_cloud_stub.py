"""The cloud facade against the stub cloud: lifecycle, SSH-reachable VMs, every fault.

Real peers: the stub cloud's libcloud driver (provider "nodewarden-stub") and, behind
each VM, a real asyncssh server (`nodewarden_doubles.stubworker.StubWorker`) reached over TCP on
127.0.0.1 through the stub's address resolver.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncssh
import pytest
from pydantic import SecretStr

from cloud.cloud_peers import (
    MutableClock,
    OperatorKey,
    StubCloudFactory,
    create,
    poll_until,
    ssh_run,
    stub_facade,
    wait_for_ssh,
)
from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.cloud import (
    CapacityUnavailable,
    CloudAuthError,
    CloudCredentials,
    CloudErrorKind,
    CloudInstance,
    CreateBlocked,
    InstanceState,
    QuotaExceeded,
    QuotaGroupExceeded,
    RateLimited,
    TransientCloudError,
)
from nodewarden.scheduling.instancetypes import ChoiceOutcome, InstanceType
from nodewarden.ssh.addressing import ResolutionRefused
from nodewarden.ssh.protocol import DEFAULT_INSTANCE_SECRET_COMMAND, DEFAULT_READY_COMMAND
from nodewarden_doubles.stubcloud import StubFaults


async def test_lifecycle_and_ssh_to_the_vm(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(ssh_start_delay=0.2))
    facade = stub_facade(cloud, catalogue)
    vm, secret = await create(facade, "medium", operator_key, name="wn-1")
    assert vm.state is InstanceState.PENDING
    assert vm.instance_type == "medium" and vm.provider_type == "m5.large"
    assert vm.price == pytest.approx(0.096)
    address = vm.address()
    assert address is not None and address.startswith("198.18.")
    assert vm.source == "cloud:ex-tags"

    # Before the SSH server listens the fake address resolves to nothing.
    with pytest.raises(ResolutionRefused):
        facade.ssh_endpoint(vm)
    endpoint = await wait_for_ssh(facade, vm)
    assert endpoint.host == "127.0.0.1" and endpoint.port > 0

    worker: Any = cloud.worker(vm.id)
    proof = await ssh_run(
        endpoint, operator_key.private, worker.host_public_key, DEFAULT_INSTANCE_SECRET_COMMAND
    )
    assert proof.exit_status == 0
    assert str(proof.stdout).strip() == secret.get_secret_value()
    ready = await ssh_run(
        endpoint, operator_key.private, worker.host_public_key, DEFAULT_READY_COMMAND
    )
    assert ready.exit_status == 0

    (listed,) = await facade.list_instances()
    assert listed.id == vm.id and listed.state is InstanceState.RUNNING

    await facade.set_tags(listed, {facade.tag_keys.node: "wn-1"})
    (tagged,) = await facade.list_instances()
    assert tagged.tags[facade.tag_keys.node] == "wn-1"
    assert tagged.tags[facade.tag_keys.dispatcher] == "disp-a"
    assert facade.tag_keys.instance_type not in tagged.tags  # replaced: ours not given go

    await facade.destroy(tagged)
    assert await facade.list_instances() == []
    with pytest.raises(ResolutionRefused):
        facade.ssh_endpoint(tagged)

    # The VM's SSH server goes away: its port refuses connections.
    async def refused() -> bool | None:
        try:
            _, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        except OSError:
            return True
        writer.close()
        return None

    await poll_until(refused, timeout=10)
    await facade.close()


async def test_dispatchers_see_only_their_own_instances(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory()
    a = stub_facade(cloud, catalogue, dispatcher="disp-a")
    b = stub_facade(cloud, catalogue, dispatcher="disp-b")
    vm_a, _ = await create(a, "small", operator_key)
    vm_b, _ = await create(b, "small", operator_key)
    assert [i.id for i in await a.list_instances()] == [vm_a.id]
    assert [i.id for i in await b.list_instances()] == [vm_b.id]
    assert len(cloud.vms()) == 2

    # Takeover: A sees B's instance among the managed ones and claims it with set_tags.
    managed = {i.id: i for i in await a.list_managed_instances()}
    assert set(managed) == {vm_a.id, vm_b.id}
    await a.set_tags(managed[vm_b.id], {a.tag_keys.node: "adopted"})
    assert {i.id for i in await a.list_instances()} == {vm_a.id, vm_b.id}
    assert await b.list_instances() == []


async def test_quota_is_classified_and_blocks_all_creates(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(instance_quota=1))
    clock = MutableClock()
    facade = stub_facade(cloud, catalogue, clock=clock)
    await create(facade, "small", operator_key)
    with pytest.raises(QuotaExceeded) as info:
        await create(facade, "medium", operator_key)
    assert info.value.provider_code == "InstanceLimitExceeded"
    assert info.value.kind is CloudErrorKind.QUOTA
    calls = cloud.api_calls["create"]

    # Every type now waits a minute, without asking the cloud again.
    assert facade.blocked_types() == {t.name for t in catalogue}
    permission = facade.may_create(catalogue[3])
    assert not permission.allowed and permission.blocked_by is CloudErrorKind.QUOTA
    with pytest.raises(CreateBlocked) as blocked:
        await create(facade, "gpu", operator_key)
    assert blocked.value.kind is CloudErrorKind.QUOTA
    assert blocked.value.retry_at == permission.retry_at == clock.now + timedelta(seconds=60)
    assert cloud.api_calls["create"] == calls

    clock.advance(61)
    cloud.set_faults(instance_quota=2)
    await create(facade, "gpu", operator_key)


async def test_capacity_for_one_type_and_the_price_factor(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(type_capacity={"m5.large": 0}))
    facade = stub_facade(
        cloud, catalogue, instance_type_policy={"ram_overhead": 0, "price_factor": 5.0}
    )
    need = ContainerResources(vcpus=2, ram="4Gi")
    first = facade.choose_instance_type(need)
    assert first.instance_type is not None and first.instance_type.name == "medium"
    with pytest.raises(CapacityUnavailable) as info:
        await create(facade, "medium", operator_key)
    assert info.value.provider_code == "InsufficientInstanceCapacity"
    assert info.value.instance_type == "medium"
    assert facade.blocked_types() == {"medium"}
    # Other types are still allowed, and the choice moves to a dearer type in the factor.
    assert facade.may_create(catalogue[2]).allowed
    second = facade.choose_instance_type(need)
    assert second.outcome is ChoiceOutcome.DEARER_AT_CAPACITY
    assert second.instance_type is not None and second.instance_type.name == "large"
    vm, _ = await create(facade, "large", operator_key)
    assert vm.instance_type == "large"


async def test_quota_group_blocks_its_group_only(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(vcpu_quota={"standard": 4}))
    facade = stub_facade(cloud, catalogue)
    await create(facade, "medium", operator_key)
    await create(facade, "medium", operator_key)
    with pytest.raises(QuotaGroupExceeded) as info:
        await create(facade, "small", operator_key)
    assert info.value.provider_code == "VcpuLimitExceeded"
    assert facade.blocked_types() == {"small", "medium", "large"}
    vm, _ = await create(facade, "gpu", operator_key)  # group "g" is not affected
    assert vm.instance_type == "gpu"


@pytest.mark.parametrize("style", ["ec2-503", "http-429"])
async def test_rate_limit_with_retry_after(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    style: str,
) -> None:
    cloud = stub_cloud_factory(StubFaults(rate_limit_style=style))
    clock = MutableClock()
    facade = stub_facade(cloud, catalogue, clock=clock)
    cloud.force_rate_limit(1, retry_after=5)
    with pytest.raises(RateLimited) as info:
        await facade.list_instances()
    err = info.value
    assert not err.locally_throttled
    assert err.http_status == (503 if style == "ec2-503" else 429)
    if style == "ec2-503":
        assert err.provider_code == "RequestLimitExceeded"
    assert err.retry_at is not None
    assert 4 <= (err.retry_at - clock.now).total_seconds() <= 5

    # Until then calls fail locally, without reaching the cloud.
    calls = cloud.api_calls["list"]
    clock.advance(2)
    with pytest.raises(RateLimited) as again:
        await facade.list_instances()
    assert again.value.locally_throttled
    assert cloud.api_calls["list"] == calls
    # a rate limit drawn by a list pauses lists and tag writes, never creates
    assert facade.backoff.call_allowed_at(clock.now, "set_tags") is not None
    assert facade.may_create(catalogue[0]).allowed

    clock.advance(4)
    assert await facade.list_instances() == []
    assert facade.backoff.rate_limit_delay == 0


async def test_rate_limit_without_retry_after_backs_off_x1_5_plus_1(
    stub_cloud_factory: StubCloudFactory, catalogue: list[InstanceType]
) -> None:
    cloud = stub_cloud_factory(StubFaults(rate_limit_retry_after=None))
    clock = MutableClock()
    facade = stub_facade(cloud, catalogue, clock=clock)
    waits = []
    for _ in range(3):
        cloud.force_rate_limit(1)
        with pytest.raises(RateLimited):
            await facade.list_instances()
        until = facade.backoff.call_allowed_at(clock.now, "list")
        assert until is not None
        waits.append((until - clock.now).total_seconds())
        clock.now = until
    assert waits == [1.0, 2.5, 4.75]


async def test_transient_create_and_destroy_errors(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(create_error_rate=1.0))
    facade = stub_facade(cloud, catalogue)
    with pytest.raises(TransientCloudError) as info:
        await create(facade, "small", operator_key)
    assert info.value.provider_code == "InternalError"
    assert facade.may_create(catalogue[0]).allowed  # transient: no block
    cloud.set_faults(create_error_rate=0.0, destroy_error_rate=1.0)
    vm, _ = await create(facade, "small", operator_key)
    with pytest.raises(TransientCloudError):
        await facade.destroy(vm)
    assert [i.id for i in await facade.list_instances()] == [vm.id]


async def test_wrong_credentials_are_an_auth_error_without_the_secret(
    stub_cloud_factory: StubCloudFactory, catalogue: list[InstanceType]
) -> None:
    cloud = stub_cloud_factory(credentials=("AKIASTUBRIGHTKEY0001", "right-secret-value-123"))
    wrong = CloudCredentials(
        key=SecretStr("AKIASTUBWRONGKEY0001"), secret=SecretStr("wrong-secret-value-456")
    )
    facade = stub_facade(cloud, catalogue, credentials=wrong)
    with pytest.raises(CloudAuthError) as info:
        await facade.list_instances()
    text = f"{info.value} {info.value!r} {info.value.__cause__!r} {info.value.__context__!r}"
    assert "wrong-secret-value-456" not in text and "AKIASTUBWRONGKEY0001" not in text
    right = CloudCredentials(
        key=SecretStr("AKIASTUBRIGHTKEY0001"), secret=SecretStr("right-secret-value-123")
    )
    assert await stub_facade(cloud, catalogue, credentials=right).list_instances() == []


async def test_stale_tags_and_slow_destroy(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(stale_tags_for=2.0, destroy_delay=2.0))
    facade = stub_facade(cloud, catalogue)
    vm, _ = await create(facade, "small", operator_key)
    key = facade.tag_keys.node
    await facade.set_tags(vm, {key: "wn-new"})
    (stale,) = await facade.list_instances()
    assert key not in stale.tags  # the list still shows the old tags ...

    async def fresh() -> CloudInstance | None:
        (now,) = await facade.list_instances()
        return now if now.tags.get(key) == "wn-new" else None

    await poll_until(fresh, timeout=10)  # ... until they catch up.

    await facade.destroy(vm)
    (stopping,) = await facade.list_instances()
    assert stopping.state is InstanceState.STOPPING

    async def gone() -> bool | None:
        return True if not await facade.list_instances() else None

    await poll_until(gone, timeout=10)


async def test_boot_delay_broken_and_hung_vms(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory(StubFaults(boot_delay=60))
    facade = stub_facade(cloud, catalogue)
    booting, _ = await create(facade, "small", operator_key)
    endpoint = await wait_for_ssh(facade, booting)
    worker: Any = cloud.worker(booting.id)
    result = await ssh_run(
        endpoint, operator_key.private, worker.host_public_key, DEFAULT_READY_COMMAND
    )
    assert result.exit_status != 0  # still booting

    cloud.set_faults(boot_delay=0, broken_rate=1.0)
    broken, _ = await create(facade, "small", operator_key)
    endpoint = await wait_for_ssh(facade, broken)
    worker = cloud.worker(broken.id)
    for _ in range(2):
        result = await ssh_run(
            endpoint, operator_key.private, worker.host_public_key, DEFAULT_READY_COMMAND
        )
        assert result.exit_status != 0  # never ready

    cloud.set_faults(broken_rate=0.0, hung_ssh_rate=1.0)
    hung, _ = await create(facade, "small", operator_key)
    endpoint = await wait_for_ssh(facade, hung)
    worker = cloud.worker(hung.id)
    with pytest.raises((asyncio.TimeoutError, asyncssh.Error)):
        await ssh_run(endpoint, operator_key.private, worker.host_public_key, "true", timeout=1)
