"""The hollow fleet found the operator's way, through `cloud.driver_plugin`: the stub cloud's
plugin provides no wires (SSH and HTTPS stay), the hollow plugin provides a dialer (told the
replica) and BMC transports over the fleet published under the cloud's name; with them the
real cloud facade creates a VM, the real prober probes it, and the real power control reads
a side node's power -- as `compose` wires them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncssh
import pytest
from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.config import CloudConfig
from nodewarden.cloud.facade import build_cloud
from nodewarden.cloud.model import InstanceState
from nodewarden.cloud.plugins import WirePlugin, wire_plugin
from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.policy.events import RequestAccepted
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.credentials import InstanceSecretTrust, SshClientKey, SshTarget
from nodewarden.ssh.prober import SshProber
from nodewarden_doubles.hollow import (
    HOLLOW_BMC_ENDPOINT,
    HollowBmcSecrets,
    HollowFleet,
)
from nodewarden_doubles.hollow.cloud import hollow_workers
from nodewarden_doubles.stubcloud import StubCloud, StubFaults

SMALL = InstanceType(name="small", provider_type="t3.small", vcpus=2, ram="2Gi", price=0.02)


def config(plugin: str, cloud: str) -> CloudConfig:
    return CloudConfig(
        driver="nodewarden-stub",
        driver_plugin=plugin,
        driver_params={"cloud": cloud},
        image="stub-image",
        ops_per_second=0,
        max_concurrent_creates=0,
        instance_types=[SMALL],
    )


def test_only_a_plugin_with_wires_replaces_them() -> None:
    assert wire_plugin(None) is None
    assert wire_plugin(config("nodewarden_doubles.stubcloud:plugin", "x")) is None
    wires = wire_plugin(config("nodewarden_doubles.hollow.plugin:plugin", "x"))
    assert isinstance(wires, WirePlugin)
    with pytest.raises(LookupError, match="no hollow fleet published as 'x'"):
        wires.dialer({"cloud": "x"}, "replica-a")


async def test_the_operator_parts_run_over_the_plugins_wires() -> None:
    fleet = HollowFleet().publish("hollow-plugin")
    fleet.add(["side-1"])
    cloud = StubCloud(
        "hollow-plugin",
        faults=StubFaults(boot_delay=0, destroy_delay=0),
        catalogue=[SMALL],
        worker_factory=hollow_workers(fleet),
    ).start()
    cloud_config = config("nodewarden_doubles.hollow.plugin:plugin", "hollow-plugin")
    wires = wire_plugin(cloud_config)
    assert wires is not None
    adapter = build_cloud(cloud_config, None, "disp-hollow")
    prober = SshProber(
        resolver=adapter.resolver, dialer=wires.dialer(cloud_config.driver_params, "replica-a")
    )
    resolver = CredentialResolver(
        HollowBmcSecrets(), "ns", CredentialsConfig(bmc_endpoints=["127.0.0.1:9"], secret_ttl="0s")
    )
    power = PowerControl(
        resolver,
        prober,
        None,
        lambda: datetime.now(tz=UTC),
        user_agent="nodewarden/0.1.0 (power; dispatcher=nw; replica=replica-a)",
        bmc_transport=wires.bmc_transport(cloud_config.driver_params),
    )
    key = SshClientKey(
        SecretStr(asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())
    )
    try:
        request, secret = adapter.create_request(
            name="vm-1", instance_type=SMALL, ssh_public_key=key.public_key
        )
        await adapter.create(request)
        for _ in range(200):
            found = [i for i in await adapter.list_managed_instances() if i.name == "vm-1"]
            if found and found[0].state is InstanceState.RUNNING:
                break
            await asyncio.sleep(0.02)
        address = found[0].address(prefer_public=False)
        assert address is not None
        vm = SshTarget("vm-1", address, key, InstanceSecretTrust(secret))
        assert (await prober.probe(vm)).ready.state == "Ready"

        side = NodeRef(
            "side-1",
            WorkerNodeSpec.model_validate(
                {
                    "nodeType": "SideNode",
                    "controlMethod": "Redfish",
                    "capacity": {"vcpus": 4, "ram": "8Gi"},
                    "bmc": {
                        "endpoint": HOLLOW_BMC_ENDPOINT,
                        "systemId": "side-1",
                        "usernameSecretRef": {"name": "bmc", "key": "username"},
                        "passwordSecretRef": {"name": "bmc", "key": "password"},
                    },
                }
            ),
        )
        outcome = await power.request(side, "t-1", 1, "GracefulShutdown")
        assert isinstance(outcome, RequestAccepted), outcome
        assert fleet.actors("side-1") == {"replica-a"}
        assert fleet.node("side-1").power == "Off"
    finally:
        await power.close()
        await prober.aclose()
        await adapter.close()
        cloud.close()
        fleet.withdraw("hollow-plugin")
