"""Wake-on-LAN: build the magic packet and send it over UDP; report only "packet sent".

A magic packet is 6 bytes of 0xFF followed by the target MAC repeated 16 times (102
bytes), optionally followed by a 6-byte SecureOn password (108 bytes). Sending it proves
nothing about the node: `WakePacketSent` records what was sent, where and when — that
the node woke must be observed elsewhere (a ready probe, a BMC PowerState).

SO_BROADCAST is enabled only for a broadcast target: the limited broadcast address
255.255.255.255, or an address the kernel itself classifies as broadcast (a send
without the option fails with EACCES; then the option is set and the send repeated).
The SecureOn password is held in SecretBytes and never logged or shown in reprs.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pydantic import SecretBytes

from nodewarden.clock import utc_now

logger = logging.getLogger(__name__)

LIMITED_BROADCAST = "255.255.255.255"
DEFAULT_PORT = 9
MAGIC_PREFIX = b"\xff" * 6
MAC_REPEATS = 16
PACKET_LENGTH = len(MAGIC_PREFIX) + 6 * MAC_REPEATS
SECURE_ON_LENGTH = 6

_MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(\1[0-9A-Fa-f]{2}){4}$")


class WakeOnLanError(Exception):
    """Base class of Wake-on-LAN failures."""


class InvalidMacAddress(WakeOnLanError, ValueError):
    """The MAC address is not six hex pairs joined by ':' or '-', or not a unicast NIC address."""


class InvalidSecureOn(WakeOnLanError, ValueError):
    """The SecureOn password is not exactly 6 bytes (or 12 hex digits / six hex pairs)."""


class InvalidWakeTarget(WakeOnLanError, ValueError):
    """The destination is not an IPv4 address or the port is out of range."""


class WakePacketNotSent(WakeOnLanError):
    """The operating system refused to send the packet."""


def parse_mac(text: str) -> bytes:
    """The 6 bytes of a MAC written 'aa:bb:cc:dd:ee:ff' or 'AA-BB-CC-DD-EE-FF'.

    Separators must be consistent. Group (multicast/broadcast) and all-zero addresses
    are rejected: they cannot be a NIC's own address.
    """
    if not isinstance(text, str) or not _MAC_RE.match(text.strip()):
        raise InvalidMacAddress(
            f"invalid MAC address {text!r}: write six hex pairs separated by ':' or '-', "
            "e.g. 52:54:00:12:34:56"
        )
    raw = bytes.fromhex(re.sub(r"[:-]", "", text.strip()))
    if raw[0] & 0x01:
        raise InvalidMacAddress(
            f"invalid MAC address {text!r}: a multicast/broadcast address is not a NIC address"
        )
    if raw == bytes(6):
        raise InvalidMacAddress(f"invalid MAC address {text!r}: all zeros")
    return raw


def format_mac(raw: bytes) -> str:
    """Canonical lower-case, colon-separated form of 6 MAC bytes."""
    return ":".join(f"{b:02x}" for b in raw)


def parse_secure_on(value: SecretBytes | bytes | str) -> SecretBytes:
    """A SecureOn password from 6 raw bytes, 12 hex digits, or six hex pairs ('-'/':')."""
    if isinstance(value, SecretBytes):
        raw = value.get_secret_value()
    elif isinstance(value, bytes):
        raw = value
    elif isinstance(value, str):
        digits = re.sub(r"[:-]", "", value.strip())
        if len(digits) != 2 * SECURE_ON_LENGTH or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
            raise InvalidSecureOn(
                "invalid SecureOn password: write 12 hex digits, optionally as six pairs "
                "separated by ':' or '-'"
            )
        raw = bytes.fromhex(digits)
    else:
        raise InvalidSecureOn("invalid SecureOn password: expected bytes or a hex string")
    if len(raw) != SECURE_ON_LENGTH:
        raise InvalidSecureOn(
            f"invalid SecureOn password: {len(raw)} bytes, must be exactly {SECURE_ON_LENGTH}"
        )
    return SecretBytes(raw)


def magic_packet(mac: str, secure_on: SecretBytes | None = None) -> bytes:
    """Six 0xFF bytes, the MAC 16 times, then the 6 SecureOn bytes when given."""
    packet = MAGIC_PREFIX + parse_mac(mac) * MAC_REPEATS
    if secure_on is not None:
        packet += parse_secure_on(secure_on).get_secret_value()
    return packet


@dataclass(frozen=True, slots=True)
class WakePacketSent:
    """A magic packet left this host. Not evidence that the node woke."""

    mac: str
    destination: str
    port: int
    bytes_sent: int
    packets: int
    secure_on: bool
    broadcast_enabled: bool
    sent_at: datetime
    source: str


class WakeOnLanSender:
    """Sends magic packets over UDP/IPv4 from the asyncio event loop."""

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock

    async def send(
        self,
        mac: str,
        *,
        destination: str = LIMITED_BROADCAST,
        port: int = DEFAULT_PORT,
        secure_on: SecretBytes | None = None,
        packets: int = 1,
    ) -> WakePacketSent:
        """Send `packets` copies of the magic packet for `mac` to destination:port."""
        packet = magic_packet(mac, secure_on)
        try:
            address = ipaddress.IPv4Address(destination)
        except ValueError:
            raise InvalidWakeTarget(
                f"invalid Wake-on-LAN destination {destination!r}: expected an IPv4 address"
            ) from None
        if not 1 <= port <= 65535:
            raise InvalidWakeTarget(f"invalid Wake-on-LAN port {port}: must be 1..65535")
        if packets < 1:
            raise InvalidWakeTarget("packets must be at least 1")
        target = (str(address), port)
        broadcast = str(address) == LIMITED_BROADCAST
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            if broadcast:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sent = 0
            for _ in range(packets):
                try:
                    sent += await loop.sock_sendto(sock, packet, target)
                except PermissionError as exc:
                    if broadcast or exc.errno != errno.EACCES:
                        raise WakePacketNotSent(
                            f"sending the magic packet to {target[0]}:{port} was refused: "
                            f"{exc.strerror}"
                        ) from None
                    # The kernel says the destination is a broadcast address.
                    broadcast = True
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                    sent += await self._send_once(loop, sock, packet, target)
                except OSError as exc:
                    raise WakePacketNotSent(
                        f"sending the magic packet to {target[0]}:{port} failed: {exc.strerror}"
                    ) from None
        result = WakePacketSent(
            mac=format_mac(parse_mac(mac)),
            destination=target[0],
            port=port,
            bytes_sent=sent,
            packets=packets,
            secure_on=secure_on is not None,
            broadcast_enabled=broadcast,
            sent_at=self._clock(),
            source=f"wol:{target[0]}:{port}",
        )
        logger.info(
            "wake-on-lan packet sent to %s via %s:%s",
            result.mac,
            result.destination,
            port,
            extra={
                "mac": result.mac,
                "wol_destination": result.destination,
                "wol_port": port,
                "bytes_sent": sent,
                "broadcast": broadcast,
            },
        )
        return result

    @staticmethod
    async def _send_once(
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        packet: bytes,
        target: tuple[str, int],
    ) -> int:
        try:
            return await loop.sock_sendto(sock, packet, target)
        except OSError as exc:
            raise WakePacketNotSent(
                f"sending the magic packet to {target[0]}:{target[1]} failed: {exc.strerror}"
            ) from None


async def send_magic_packet(
    mac: str,
    *,
    destination: str = LIMITED_BROADCAST,
    port: int = DEFAULT_PORT,
    secure_on: SecretBytes | None = None,
    packets: int = 1,
) -> WakePacketSent:
    """Convenience: `WakeOnLanSender().send(...)`."""
    return await WakeOnLanSender().send(
        mac, destination=destination, port=port, secure_on=secure_on, packets=packets
    )
