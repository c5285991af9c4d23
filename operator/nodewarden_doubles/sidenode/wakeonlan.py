"""`WakeOnLanListener`: UDP on 127.0.0.1 that plays the NICs of the Wake-on-LAN side nodes.

A FAKE of a NIC's wake logic (the spec's "UDP listener on loopback"): a datagram is a
magic packet when it is exactly 102 bytes (6 x 0xFF, then one MAC 16 times) or 108 bytes
(the same plus a 6-byte SecureOn password). The MAC picks the registered node:

- a node with a SecureOn password wakes only on a 108-byte packet carrying that
  password (compared in constant time); a missing or wrong one is recorded and ignored;
- a node without one wakes on either length (the extra bytes are ignored, as NICs do);
- the node's ``ignore_wake`` fault drops the wake after the packet is recorded;
- a BMC-powered node registered by its MAC records the packet and stays as it is.

Every datagram is recorded (`WakePacketRecord`: time, sender, MAC, SecureOn sent and
whether it matched, outcome) for test assertions. No password is ever recorded or logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from nodewarden.wol import MAC_REPEATS, MAGIC_PREFIX, PACKET_LENGTH, SECURE_ON_LENGTH, format_mac
from nodewarden_doubles.sidenode.node import PoweredSideNode

logger = logging.getLogger(__name__)

PacketOutcome = Literal[
    "woke",
    "already_on",
    "ignored_fault",
    "not_wol_node",
    "secure_on_rejected",
    "unknown_mac",
    "malformed",
]


@dataclass(frozen=True, slots=True)
class WakePacketRecord:
    """One datagram the listener received."""

    received_at: datetime
    monotonic: float
    sender: str
    length: int
    mac: str | None
    """The target MAC (None: not a magic packet)."""
    node: str | None
    secure_on_sent: bool
    secure_on_matched: bool | None
    """True / False when the node requires SecureOn; None when it does not (or no node)."""
    outcome: PacketOutcome

    def as_json(self) -> dict[str, Any]:
        return {
            "received_at": self.received_at.isoformat(),
            "monotonic": self.monotonic,
            "sender": self.sender,
            "length": self.length,
            "mac": self.mac,
            "node": self.node,
            "secure_on_sent": self.secure_on_sent,
            "secure_on_matched": self.secure_on_matched,
            "outcome": self.outcome,
        }


def parse_magic_packet(data: bytes) -> tuple[str, bytes | None] | None:
    """(MAC, SecureOn bytes or None) of a 102- or 108-byte magic packet; None otherwise."""
    if len(data) not in (PACKET_LENGTH, PACKET_LENGTH + SECURE_ON_LENGTH):
        return None
    if not data.startswith(MAGIC_PREFIX):
        return None
    mac = data[len(MAGIC_PREFIX) : len(MAGIC_PREFIX) + 6]
    if data[len(MAGIC_PREFIX) : PACKET_LENGTH] != mac * MAC_REPEATS:
        return None
    password = data[PACKET_LENGTH:] if len(data) > PACKET_LENGTH else None
    return format_mac(mac), password


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, listener: WakeOnLanListener) -> None:
        self._listener = listener

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self._listener.received(data, f"{addr[0]}:{addr[1]}")


class WakeOnLanListener:
    """Receives magic packets on 127.0.0.1:port and wakes the matching WoL side node."""

    def __init__(
        self,
        nodes: Iterable[PoweredSideNode] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the Wake-on-LAN listener binds loopback only, not {host!r}")
        self.host = host
        self.port = port
        self._clock = clock
        self._wall = wall_clock
        self._nodes: dict[str, PoweredSideNode] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self.packets: list[WakePacketRecord] = []
        for node in nodes:
            self.add(node)

    def add(self, node: PoweredSideNode) -> None:
        """Route magic packets for ``node.mac`` to ``node``."""
        if node.mac is None:
            raise ValueError(f"side node {node.name!r} has no MAC to wake it by")
        other = self._nodes.get(node.mac)
        if other is not None and other is not node:
            raise ValueError(f"MAC {node.mac} belongs to both {other.name!r} and {node.name!r}")
        self._nodes[node.mac] = node

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=(self.host, self.port)
        )
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        logger.info("wake-on-lan listener on %s:%s", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    def received(self, data: bytes, sender: str) -> WakePacketRecord:
        """Handle one datagram (also callable directly in unit tests)."""
        parsed = parse_magic_packet(data)
        mac: str | None = None
        password: bytes | None = None
        node: PoweredSideNode | None = None
        matched: bool | None = None
        outcome: PacketOutcome
        if parsed is None:
            outcome = "malformed"
        else:
            mac, password = parsed
            node = self._nodes.get(mac)
            if node is None:
                outcome = "unknown_mac"
            else:
                required = node.settings.secure_on
                if required is not None:
                    matched = password is not None and hmac.compare_digest(
                        password, required.get_secret_value()
                    )
                outcome = "secure_on_rejected" if matched is False else node.wake()
        record = WakePacketRecord(
            received_at=self._wall(),
            monotonic=self._clock(),
            sender=sender,
            length=len(data),
            mac=mac,
            node=node.name if node is not None else None,
            secure_on_sent=password is not None,
            secure_on_matched=matched,
            outcome=outcome,
        )
        self.packets.append(record)
        logger.info(
            "wake-on-lan packet for %s: %s",
            mac or "?",
            outcome,
            extra={"mac": mac, "side_node": record.node, "wol_outcome": outcome},
        )
        return record
