"""Side nodes behind the project fake BMC, driven as the operator would: Redfish client + SSH prober."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncssh
import pytest
from pydantic import SecretStr
from sidenode_helpers import (
    CONTAINER,
    LoopbackTls,
    eventually,
    probe_state,
    probe_transitions,
    probe_until,
    settings_for,
    target_for,
    uptime,
)

from nodewarden.redfish import RedfishClient, RedfishEndpointConfig
from nodewarden.ssh import SshClientKey, SshProber
from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions
from nodewarden_doubles.sidenode import FakeBmcPower, PoweredSideNode

PASSWORD = "sidenode-bmc-password-7c1e"

Started = tuple[PoweredSideNode, FakeBmc, RedfishEndpointConfig]
StartNode = Callable[..., Awaitable[Started]]


@pytest.fixture
async def bmc_node(tls: LoopbackTls, client_key: SshClientKey) -> AsyncIterator[StartNode]:
    """Start a fake BMC (options) and a side node on its system "1" (settings)."""
    started: list[tuple[PoweredSideNode, FakeBmc]] = []

    async def start(bmc: dict[str, Any] | None = None, **node: Any) -> Started:
        options = FakeBmcOptions(password=PASSWORD, **(bmc or {}))
        fake = FakeBmc(options, ssl_context=tls.context)
        await fake.start()
        side = PoweredSideNode(settings_for(client_key, **node), FakeBmcPower(fake, "1"))
        started.append((side, fake))
        await side.start()
        config = RedfishEndpointConfig(
            endpoint=fake.url,
            username="admin",
            password=SecretStr(PASSWORD),
            ca_bundle_pem=tls.ca_pem,
            request_timeout=5.0,
        )
        return side, fake, config

    yield start
    for side, fake in started:
        await side.stop()
        await fake.stop()


async def test_power_cycle_through_the_fake_bmc(
    bmc_node: StartNode, prober: SshProber, client_key: SshClientKey
) -> None:
    node, bmc, redfish = await bmc_node(
        {"initial_power": "On"}, boot_delay=0.4, ready_delay=1.0, initial_uptime=7200
    )
    target = target_for(node, client_key)
    known_hosts_before = node.known_hosts_line()
    assert await probe_state(prober, target) == "Ready"
    assert await uptime(node, client_key) >= 7200
    await prober.start_runner(target, {"uuid": CONTAINER})
    assert [r.uuid for r in (await prober.list_runners(target)).runners] == [CONTAINER]
    bystander = await asyncssh.connect(
        "127.0.0.1",
        node.port,
        username="root",
        client_keys=[client_key.asyncssh_key],
        known_hosts=asyncssh.import_known_hosts(known_hosts_before + "\n"),
        config=None,
        agent_path=None,
    )

    async with RedfishClient(redfish) as client:
        await client.request_reset("GracefulShutdown")
        assert (await client.read_power_state()).state == "Off"
    await eventually(lambda: node.os == "off", what="node off after the BMC showed Off")
    await eventually(lambda: bystander.is_closed(), what="open SSH connection dropped")
    assert await probe_state(prober, target) == "Unreachable"  # refused: nobody listens
    assert not node.listening
    lost = [e.detail["containers_lost"] for e in node.events if e.kind == "power_off"]
    assert lost == [[CONTAINER]]

    async with RedfishClient(redfish) as client:
        await client.request_reset("On")
    seen, _ = await probe_transitions(prober, target, "Ready")
    # Off until the boot delay is over, then listening but booting, then ready.
    assert [state for state, _ in seen] == ["Unreachable", "Booting", "Ready"], seen
    assert seen[1][1] >= 0.4 - 0.05 and seen[2][1] >= 0.4 + 1.0 - 0.05, seen
    power_on, listening = [e for e in node.events if e.kind in ("power_on", "ssh_listening")][-2:]
    assert (power_on.kind, listening.kind) == ("power_on", "ssh_listening")
    assert listening.monotonic - power_on.monotonic >= 0.4
    # Same host key (the same known_hosts text worked), a fresh boot, the container is gone.
    assert node.known_hosts_line() == known_hosts_before
    assert await uptime(node, client_key) < 5
    outcome = await prober.runner_status(target, CONTAINER)
    assert outcome.state == "unknown"
    assert node.boots == 1
    # The double sent nothing to the BMC: its logs hold only the operator's requests.
    assert [(r.reset_type, r.outcome) for r in bmc.resets] == [
        ("GracefulShutdown", "scheduled"),
        ("On", "scheduled"),
    ]


async def test_poweroff_over_ssh_switches_the_bmc_off(
    bmc_node: StartNode, prober: SshProber, client_key: SshClientKey
) -> None:
    node, bmc, redfish = await bmc_node({"initial_power": "On"}, shutdown_delay=0.2)
    target = target_for(node, client_key)
    assert await probe_state(prober, target) == "Ready"
    requested = await prober.poweroff(target)
    assert requested.exit_status in (0, None)
    await eventually(lambda: not node.listening, what="SSH stops at once")
    assert node.os == "halted" and bmc.power_of("1") == "On"  # the OS is down, power not yet
    await eventually(lambda: bmc.power_of("1") == "Off", what="BMC shows Off")
    await eventually(lambda: node.os == "off")
    async with RedfishClient(redfish) as client:
        assert (await client.read_power_state()).state == "Off"
    assert bmc.resets == []  # the fake BMC's records stay the operator's evidence
    assert [e.kind for e in node.events] == [
        "already_on",
        "ssh_listening",
        "poweroff_over_ssh",
        "switch_off_requested",
        "power_off",
    ]


async def test_a_restart_is_a_power_cycle_even_when_it_settles_between_ticks(
    bmc_node: StartNode, prober: SshProber, client_key: SshClientKey
) -> None:
    node, bmc, redfish = await bmc_node({"initial_power": "On"}, boot_delay=0.2, ready_delay=0.2)
    target = target_for(node, client_key)
    await prober.start_runner(target, {"uuid": CONTAINER})
    async with RedfishClient(redfish) as client:
        await client.request_reset("ForceRestart")  # transition_seconds=0: On -> On at once
    assert bmc.power_of("1") == "On"
    await eventually(lambda: node.boots == 1, what="restart seen as a power cycle")
    await probe_until(prober, target, "Ready")
    assert (await prober.runner_status(target, CONTAINER)).state == "unknown"
