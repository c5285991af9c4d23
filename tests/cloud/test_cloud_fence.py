"""The cloud layers' fence (`nodewarden.cloud.fence`) over the real stub cloud driver.

A cloud cannot check a fencing token: the replica's own validity check, made after the
rate-limit waits and right before the driver call, is the fence. A call not sent is no
cloud call: it reaches neither the provider nor the back-off.
"""

from __future__ import annotations

import pytest

from cloud.cloud_peers import OperatorKey, StubCloudFactory, create, stub_facade
from fencekit import Clock, held
from nodewarden.cloud.fence import NotSent
from nodewarden.scheduling.instancetypes import InstanceType


async def test_creates_destroys_and_tag_writes_need_valid_leadership(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory()
    clock = Clock()
    lead = held(5, clock, "nodewarden-disp-a")
    facade = stub_facade(cloud, catalogue, fence=lead)
    vm, _ = await create(facade, "small", operator_key, name="wn-1")  # leading: sent
    clock.run(10.0, lead)  # no renewal for 10 s (the heartbeat beats): validity runs out
    with pytest.raises(NotSent, match="not renewed in time"):
        await create(facade, "small", operator_key, name="wn-2")
    with pytest.raises(NotSent):
        await facade.set_tags(vm, {facade.tag_keys.node: "wn-1"})
    with pytest.raises(NotSent):
        await facade.destroy(vm)
    listed = await facade.list_instances()  # reading is not fenced
    assert [i.id for i in listed] == [vm.id]
    assert [v.name for v in cloud.vms()] == ["wn-1"]  # the provider saw one create only
    itype = facade.instance_type("small")
    assert itype is not None
    assert facade.may_create(itype).allowed  # the back-off did not count the refusals
