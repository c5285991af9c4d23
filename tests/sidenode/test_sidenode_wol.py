"""Wake-on-LAN side nodes: magic packets from the product's sender, SecureOn, poweroff over SSH."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretBytes
from sidenode_helpers import eventually, probe_state, probe_until, settings_for, target_for

from nodewarden.ssh import SshClientKey, SshProber
from nodewarden.wol import WakeOnLanSender, magic_packet
from nodewarden_doubles.sidenode import (
    PoweredSideNode,
    SideNodeGroup,
    WolPower,
    parse_magic_packet,
)

MAC = "52:54:00:aa:00:01"
OTHER_MAC = "52:54:00:aa:00:02"
SECURE_ON = SecretBytes(bytes.fromhex("0a1b2c3d4e5f"))
WRONG = SecretBytes(bytes.fromhex("0a1b2c3d4e50"))


@pytest.fixture
async def wol_group(client_key: SshClientKey) -> AsyncIterator[SideNodeGroup]:
    """A SecureOn node (Off) and a plain one (Off), ticked by one group with its listener."""
    secure = PoweredSideNode(
        settings_for(client_key, "wol-secure", mac=MAC, secure_on=SECURE_ON), WolPower()
    )
    plain = PoweredSideNode(settings_for(client_key, "wol-plain", mac=OTHER_MAC), WolPower())
    group = SideNodeGroup([secure, plain], tick_interval=0.02)
    await group.start()
    yield group
    await group.stop()


async def send(group: SideNodeGroup, mac: str, secure_on: SecretBytes | None = None) -> None:
    before = len(group.wol.packets)
    await WakeOnLanSender().send(
        mac, destination="127.0.0.1", port=group.wol.port, secure_on=secure_on
    )
    await eventually(lambda: len(group.wol.packets) > before, what="packet received")


async def test_magic_packet_wakes_the_node_and_poweroff_over_ssh_switches_it_off(
    wol_group: SideNodeGroup, prober: SshProber, client_key: SshClientKey
) -> None:
    node = wol_group.node("wol-secure")
    target = target_for(node, client_key)
    assert await probe_state(prober, target) == "Unreachable"

    await send(wol_group, MAC, WRONG)
    await send(wol_group, MAC)  # SecureOn required, none sent
    for _ in range(3):  # the decision was taken on receipt; ticks do not change it
        node.step()
    assert node.power == "Off" and node.os == "off"
    assert [
        (p.length, p.secure_on_sent, p.secure_on_matched, p.outcome) for p in wol_group.wol.packets
    ] == [
        (108, True, False, "secure_on_rejected"),
        (102, False, False, "secure_on_rejected"),
    ]

    await send(wol_group, MAC, SECURE_ON)
    last = wol_group.wol.packets[-1]
    assert (last.mac, last.node, last.secure_on_matched, last.outcome) == (
        MAC,
        "wol-secure",
        True,
        "woke",
    )
    assert node.power == "On"
    seen, _ = await probe_until(prober, target, "Ready")
    assert seen[0] == "Unreachable" and seen[-1] == "Ready", seen
    wol = await prober.wake_on_lan(target, "eth0")
    assert "g" in wol.supported and "g" in wol.enabled

    await send(wol_group, MAC, SECURE_ON)
    assert wol_group.wol.packets[-1].outcome == "already_on"

    await prober.poweroff(target)
    await eventually(lambda: node.power == "Off" and node.os == "off", what="powered itself off")
    assert await probe_state(prober, target) == "Unreachable"
    assert wol_group.node("wol-plain").os == "off"  # never addressed


async def test_a_node_without_secure_on_wakes_on_either_length(
    wol_group: SideNodeGroup, client_key: SshClientKey
) -> None:
    node = wol_group.node("wol-plain")
    await send(wol_group, OTHER_MAC, SECURE_ON)
    packet = wol_group.wol.packets[-1]
    assert (packet.secure_on_sent, packet.secure_on_matched, packet.outcome) == (True, None, "woke")
    await eventually(lambda: node.listening, what="SSH up after the boot delay")


async def test_every_datagram_is_recorded_and_only_magic_packets_count(
    wol_group: SideNodeGroup,
) -> None:
    good = magic_packet(MAC)
    listener = wol_group.wol
    assert parse_magic_packet(good) == (MAC, None)
    assert parse_magic_packet(magic_packet(MAC, SECURE_ON)) == (MAC, SECURE_ON.get_secret_value())
    broken = [
        good[:-1],  # 101 bytes
        good + b"\x00",  # 103 bytes
        b"\xfe" + good[1:],  # no sync stream
        good[:6] + bytes.fromhex("525400aa0002") + good[12:],  # the 16 copies disagree
        b"",
    ]
    for datagram in broken:
        assert parse_magic_packet(datagram) is None
        assert listener.received(datagram, "127.0.0.1:1").outcome == "malformed"
    unknown = listener.received(magic_packet("52:54:00:ff:ff:ff"), "127.0.0.1:1")
    assert (unknown.mac, unknown.node, unknown.outcome) == (
        "52:54:00:ff:ff:ff",
        None,
        "unknown_mac",
    )
    assert len(listener.packets) == len(broken) + 1
    assert all(n.os == "off" for n in wol_group.nodes.values())


async def test_a_wake_right_after_the_power_went_off_boots_the_node(
    wol_group: SideNodeGroup, prober: SshProber, client_key: SshClientKey
) -> None:
    node = wol_group.node("wol-plain")
    node.settings.shutdown_delay = 0
    node.wake()
    target = target_for(node, client_key)
    await probe_until(prober, target, "Ready")
    await prober.poweroff(target)
    await eventually(lambda: node.power == "Off", interval=0.001)
    await send(wol_group, OTHER_MAC)  # before or after the next tick: either way it boots
    assert wol_group.wol.packets[-1].outcome == "woke"
    await probe_until(prober, target, "Ready")
    assert node.boots == 2
