"""A side node behind the real sushy-tools emulator: resets land after sushy's random 1-11 s."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr
from sidenode_helpers import (
    LoopbackTls,
    eventually,
    probe_state,
    probe_until,
    settings_for,
    target_for,
    uptime,
)

from nodewarden.redfish import RedfishClient, RedfishEndpointConfig
from nodewarden.ssh import SshClientKey, SshProber
from nodewarden_doubles.sidenode import PoweredSideNode, SushyEmulator, SushyPower, SushySystem

PASSWORD = "sidenode-sushy-password-41d9"
SUSHY_APPLY_MAX = 12.0  # sushy applies a reset 1-11 s after it accepted it (+ one poll)

pytestmark = pytest.mark.slow


async def test_power_cycle_through_sushy_tools(
    tmp_path: Path, tls: LoopbackTls, prober: SshProber, client_key: SshClientKey
) -> None:
    system = str(uuid.uuid4())
    sushy = SushyEmulator(
        tmp_path / "sushy",
        [SushySystem(system, "side-sushy", "On")],
        username="admin",
        password=SecretStr(PASSWORD),
        cert_file=tls.cert_file,
        key_file=tls.key_file,
        ca_pem=tls.ca_pem,
    )
    endpoint = await sushy.start()
    source = SushyPower(
        endpoint,
        system,
        username="admin",
        password=SecretStr(PASSWORD),
        ca_pem=tls.ca_pem,
        interval=0.25,
    )
    node = PoweredSideNode(
        settings_for(client_key, "side-sushy", boot_delay=0.3, ready_delay=0.3), source
    )
    redfish = RedfishEndpointConfig(
        endpoint=endpoint,
        username="admin",
        password=SecretStr(PASSWORD),
        system_id=system,
        ca_bundle_pem=tls.ca_pem,
    )
    try:
        await node.start()
        await eventually(lambda: node.os == "up", what="first sushy reading: On")
        target = target_for(node, client_key)
        known_hosts = node.known_hosts_line()
        await probe_until(prober, target, "Ready")

        # `systemctl poweroff`: SSH goes at once, sushy shows Off once its delay is over.
        await prober.poweroff(target)
        await eventually(lambda: not node.listening, what="SSH stops at once")
        await eventually(lambda: source.resets_sent == ["ForceOff"], what="ForceOff sent")
        off_took = await eventually(
            lambda: node.os == "off", SUSHY_APPLY_MAX + 3, what="sushy shows Off"
        )
        async with RedfishClient(redfish) as client:
            assert (await client.read_power_state()).state == "Off"
            assert await probe_state(prober, target) == "Unreachable"
            await client.request_reset("On")
        started = time.monotonic()
        seen, _ = await probe_until(prober, target, "Ready", SUSHY_APPLY_MAX + 3)
        on_took = time.monotonic() - started
        assert seen[0] == "Unreachable" and seen[-1] == "Ready", seen
        assert node.known_hosts_line() == known_hosts  # same port, same host key
        assert await uptime(node, client_key) < on_took
        assert node.boots == 1
        print(f"sushy: poweroff->Off {off_took:.1f} s, reset On->ready {on_took:.1f} s")
    finally:
        await node.stop()
        await sushy.stop()
