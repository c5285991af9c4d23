"""Fault knobs of a side node, changed at run time and seen through the operator's own prober."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pydantic import SecretStr
from sidenode_helpers import (
    LoopbackTls,
    eventually,
    fast_settings,
    probe_state,
    probe_until,
    settings_for,
    target_for,
)

from nodewarden.redfish import RedfishClient, RedfishEndpointConfig, RedfishHttpError
from nodewarden.ssh import ProbeThrottle, SshClientKey, SshProber
from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions
from nodewarden_doubles.sidenode import FAULT_INHIBITOR, FakeBmcPower, PoweredSideNode, WolPower

StartNode = Callable[..., Awaitable[PoweredSideNode]]


@pytest.fixture
async def wol_node(client_key: SshClientKey) -> AsyncIterator[StartNode]:
    nodes: list[PoweredSideNode] = []

    async def start(power: str = "On", **settings: Any) -> PoweredSideNode:
        settings.setdefault("mac", "52:54:00:bb:00:01")
        node = PoweredSideNode(
            settings_for(client_key, "side-fault", **settings), WolPower(power), tick_interval=0.02
        )
        nodes.append(node)
        await node.start()
        return node

    yield start
    for node in nodes:
        await node.stop()


async def test_ready_probe_never_passes_after_a_wake_with_the_fault(
    wol_node: StartNode, prober: SshProber, client_key: SshClientKey
) -> None:
    node = await wol_node("Off", boot_delay=0.1, ready_delay=0.2)
    node.set_faults(ready_fails_after_wake=True)
    assert node.wake() == "woke"
    await eventually(lambda: node.listening, what="SSH up")
    target = target_for(node, client_key)
    await eventually(
        lambda: (node.worker.uptime or 0) > 0.1 + 0.2 + 0.3, what="well past the ready delay"
    )
    ready = await prober.check_ready(target)
    assert (ready.state, ready.detail) == ("Booting", "degraded")
    node.set_faults(ready_fails_after_wake=False)  # mended
    assert (await prober.check_ready(target)).state == "Ready"


async def test_inhibitor_taken_and_released_and_recorded_at_poweroff(
    wol_node: StartNode, prober: SshProber, client_key: SshClientKey
) -> None:
    node = await wol_node()
    target = target_for(node, client_key)
    assert (await prober.inhibitors(target)).shutdown_blockers == ()
    node.set_faults(shutdown_inhibitor=True)
    fact = await prober.inhibitors(target)
    assert [(i.what, i.who, i.mode) for i in fact.shutdown_blockers] == [
        (("shutdown",), FAULT_INHIBITOR.who, "block")
    ]
    node.set_faults(shutdown_inhibitor=False)
    assert (await prober.inhibitors(target)).shutdown_blockers == ()
    node.set_faults(shutdown_inhibitor=True)
    await prober.poweroff(target)  # non-interactive systemctl does not check inhibitors
    await eventually(lambda: node.power == "Off")
    poweroff = next(e for e in node.events if e.kind == "poweroff_over_ssh")
    assert [i["who"] for i in poweroff.detail["inhibitors"]] == [FAULT_INHIBITOR.who]


async def test_ssh_refused_while_powered_then_back_without_a_reboot(
    wol_node: StartNode, prober: SshProber, client_key: SshClientKey
) -> None:
    node = await wol_node(initial_uptime=500)
    target = target_for(node, client_key)
    assert await probe_state(prober, target) == "Ready"
    node.set_faults(ssh_unreachable="refused")
    await eventually(lambda: not node.listening)
    assert await probe_state(prober, target) == "Unreachable"
    assert (node.power, node.os) == ("On", "up")
    node.set_faults(ssh_unreachable="no")
    await probe_until(prober, target, "Ready")
    assert (node.worker.uptime or 0) >= 500  # not rebooted
    assert node.boots == 0


async def test_ssh_partitioned_while_powered(wol_node: StartNode, client_key: SshClientKey) -> None:
    node = await wol_node()
    target = target_for(node, client_key)
    prober = SshProber(
        fast_settings(login_timeout=0.5, command_timeout=0.5), throttle=ProbeThrottle(0)
    )
    try:
        assert await probe_state(prober, target) == "Ready"
        node.set_faults(ssh_unreachable="partitioned")
        assert await probe_state(prober, target) == "CommandTimeout"  # the open connection stalls
        assert await probe_state(prober, target) == "LoginTimeout"  # TCP up, no SSH answer
        assert node.listening and node.power == "On"
        node.set_faults(ssh_unreachable="no")
        assert await probe_state(prober, target) == "Ready"
    finally:
        await prober.aclose()


async def test_wake_packet_ignored(wol_node: StartNode) -> None:
    node = await wol_node("Off")
    node.set_faults(ignore_wake=True)
    assert node.wake() == "ignored_fault"
    node.step()
    assert (node.power, node.os) == ("Off", "off")
    node.set_faults(ignore_wake=False)
    assert node.wake() == "woke"
    assert node.os == "booting"


async def test_bmc_that_accepts_and_never_applies(
    tls: LoopbackTls, prober: SshProber, client_key: SshClientKey
) -> None:
    password = "sidenode-fault-bmc-pw-90ab"
    bmc = FakeBmc(FakeBmcOptions(password=password, initial_power="On"), ssl_context=tls.context)
    await bmc.start()
    node = PoweredSideNode(settings_for(client_key, "side-bmc"), FakeBmcPower(bmc))
    redfish = RedfishEndpointConfig(
        endpoint=bmc.url,
        username="admin",
        password=SecretStr(password),
        ca_bundle_pem=tls.ca_pem,
        use_sessions=False,
    )
    try:
        await node.start()
        target = target_for(node, client_key)
        with pytest.raises(ValueError, match="cannot be changed: password"):
            node.set_bmc_options(password="guessed")
        node.set_bmc_options(never_apply=True, unavailable_reads=1)
        async with RedfishClient(redfish) as client:
            with pytest.raises(RedfishHttpError):  # the one 503 the fault asked for
                await client.read_power_state()
            await client.request_reset("GracefulShutdown")
            await client.request_reset("GracefulShutdown")
            assert (await client.read_power_state()).state == "On"
        for _ in range(3):
            node.step()
        assert await probe_state(prober, target) == "Ready"
        assert [r.outcome for r in bmc.resets] == ["ignored", "ignored"]
        node.set_bmc_options(never_apply=False)
        async with RedfishClient(redfish) as client:
            await client.request_reset("GracefulShutdown")
        await eventually(lambda: node.os == "off")
    finally:
        await node.stop()
        await bmc.stop()


async def test_bad_fault_changes_are_refused_naming_the_field(wol_node: StartNode) -> None:
    node = await wol_node()
    with pytest.raises(ValueError, match=r"unknown side-node fault field.*bogus"):
        node.set_faults(bogus=True)
    with pytest.raises(ValueError, match="ssh_unreachable"):
        node.set_faults(ssh_unreachable="sometimes")
    with pytest.raises(ValueError, match="runner_crash_rate"):
        node.set_worker_faults(runner_crash_rate=2)
    with pytest.raises(ValueError, match="no fake BMC"):
        node.set_bmc_options(never_apply=True)
    assert node.faults.ssh_unreachable == "no" and node.worker.faults.runner_crash_rate == 0
    assert node.set_worker_faults(command_delay=0.1).command_delay == 0.1
