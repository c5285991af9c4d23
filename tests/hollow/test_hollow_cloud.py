"""Hollow VMs under the stub cloud, reached the operator's way: the real cloud facade
through the `cloud.driver_plugin` registry creates a VM, the real prober (hollow dialer)
probes it by the address the cloud lists, a power-off over SSH shows as the VM stopped in
the cloud list, and the destroy leaves the model's node gone, counted per node."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest
from pydantic import SecretStr

from nodewarden.cloud.config import CloudConfig
from nodewarden.cloud.facade import CloudFacade, build_cloud
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.credentials import InstanceSecretTrust, SshClientKey, SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.prober import SshProber
from nodewarden_doubles.hollow import HollowDialer, HollowFleet
from nodewarden_doubles.hollow.cloud import hollow_workers
from nodewarden_doubles.stubcloud import StubCloud, StubFaults

SMALL = InstanceType(name="small", provider_type="t3.small", vcpus=2, ram="2Gi", price=0.02)


def facade(cloud: StubCloud) -> CloudFacade:
    config = CloudConfig(
        driver="nodewarden-stub",
        driver_plugin="nodewarden_doubles.stubcloud:plugin",
        driver_params={"cloud": cloud.name},
        image="stub-image",
        ops_per_second=0,
        max_concurrent_creates=0,
        instance_types=[SMALL],
    )
    return build_cloud(config, None, "disp-hollow")


async def listed(cloud: CloudFacade, name: str, state: InstanceState) -> CloudInstance:
    for _ in range(200):
        found = [i for i in await cloud.list_managed_instances() if i.name == name]
        if found and found[0].state is state:
            return found[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} never {state}: {found}")


async def test_a_hollow_vm_from_create_to_destroy() -> None:
    fleet = HollowFleet()
    cloud = StubCloud(
        "hollow-cloud",
        faults=StubFaults(boot_delay=0, destroy_delay=0),
        catalogue=[SMALL],
        worker_factory=hollow_workers(fleet),
    ).start()
    adapter = facade(cloud)
    key = SshClientKey(
        SecretStr(asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())
    )
    prober = SshProber(resolver=adapter.resolver, dialer=HollowDialer(fleet, actor="replica-a"))
    try:
        request, secret = adapter.create_request(
            name="vm-1", instance_type=SMALL, ssh_public_key=key.public_key
        )
        await adapter.create(request)
        instance = await listed(adapter, "vm-1", InstanceState.RUNNING)
        address = instance.address(prefer_public=False)
        assert address is not None
        vm = SshTarget("vm-1", address, key, InstanceSecretTrust(secret))
        report = await prober.probe(vm)
        assert report.ready.state == "Ready"

        await prober.poweroff(vm)
        await listed(adapter, "vm-1", InstanceState.STOPPED)
        with pytest.raises(SshError):
            await prober.probe(vm)

        stopped = await listed(adapter, "vm-1", InstanceState.STOPPED)
        await adapter.destroy(stopped)
        for _ in range(200):
            if fleet.nodes["vm-1"].gone:
                break
            await asyncio.sleep(0.02)
        counts = fleet.counts()
        assert counts[("vm-1", "ssh:poweroff")] == 1
        assert counts[("vm-1", "cloud:destroy")] == 1
        assert fleet.acted_on_by_several() == {}
    finally:
        await prober.aclose()
        await adapter.close()
        cloud.close()
