"""Wake-on-LAN: packet bytes, MAC/SecureOn validation, and real UDP sends to a listener.

Unicast sends go to a UDP listener on 127.0.0.1. Broadcast sends (255.255.255.255 and
the loopback broadcast 127.255.255.255) run only inside a network namespace this test
creates with `unshare -n`, holding nothing but its own loopback, so no packet can
leave the machine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
import textwrap
from datetime import UTC

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretBytes

from nodewarden.wol import (
    PACKET_LENGTH,
    InvalidMacAddress,
    InvalidSecureOn,
    InvalidWakeTarget,
    WakeOnLanSender,
    magic_packet,
    parse_mac,
    parse_secure_on,
)

unicast_macs = st.binary(min_size=6, max_size=6).filter(lambda b: not b[0] & 1 and any(b))


def written(raw: bytes, separator: str, upper: bool) -> str:
    text = separator.join(f"{b:02x}" for b in raw)
    return text.upper() if upper else text


@given(raw=unicast_macs, separator=st.sampled_from([":", "-"]), upper=st.booleans())
def test_magic_packet_is_six_ff_then_the_mac_sixteen_times(
    raw: bytes, separator: str, upper: bool
) -> None:
    packet = magic_packet(written(raw, separator, upper))
    assert len(packet) == PACKET_LENGTH == 102
    assert packet[:6] == b"\xff" * 6
    assert [packet[6 + 6 * i : 12 + 6 * i] for i in range(16)] == [raw] * 16


@given(raw=unicast_macs, password=st.binary(min_size=6, max_size=6))
def test_secure_on_appends_six_bytes(raw: bytes, password: bytes) -> None:
    packet = magic_packet(written(raw, ":", False), SecretBytes(password))
    assert len(packet) == 108
    assert packet[:102] == magic_packet(written(raw, "-", True))
    assert packet[102:] == password


@pytest.mark.parametrize(
    "text",
    [
        "",
        "00:11:22:33:44",
        "00:11:22:33:44:55:66",
        "00:11:22-33:44:55",
        "0011.2233.4455",
        "001122334455",
        "0g:11:22:33:44:55",
        "0:11:22:33:44:55",
        "00:11:22:33:44:555",
        "01:00:5e:00:00:01",
        "ff:ff:ff:ff:ff:ff",
        "00:00:00:00:00:00",
    ],
)
def test_bad_mac_is_rejected_with_a_clear_error(text: str) -> None:
    with pytest.raises(InvalidMacAddress) as caught:
        parse_mac(text)
    assert repr(text) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_secure_on_forms() -> None:
    expected = bytes.fromhex("a1b2c3d4e5f6")
    for form in ("a1b2c3d4e5f6", "A1:B2:C3:D4:E5:F6", "a1-b2-c3-d4-e5-f6", expected):
        assert parse_secure_on(form).get_secret_value() == expected
    for bad in ("a1b2c3d4e5", "a1b2c3d4e5f6a7", "zzb2c3d4e5f6", b"12345", b"1234567"):
        with pytest.raises(InvalidSecureOn):
            parse_secure_on(bad)


async def _listener() -> tuple[asyncio.DatagramTransport, asyncio.Queue[bytes], int]:
    received: asyncio.Queue[bytes] = asyncio.Queue()

    class Collect(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
            received.put_nowait(data)

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(Collect, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    return transport, received, port


async def test_unicast_send_reaches_the_listener_byte_for_byte(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    transport, received, port = await _listener()
    secure_on = SecretBytes(bytes.fromhex("0badc0ffee42"))
    try:
        result = await WakeOnLanSender().send(
            "52-54-00-AB-CD-EF", destination="127.0.0.1", port=port, secure_on=secure_on
        )
        data = await asyncio.wait_for(received.get(), timeout=5)
    finally:
        transport.close()
    assert data == magic_packet("52:54:00:ab:cd:ef", secure_on)
    assert data[-6:] == bytes.fromhex("0badc0ffee42")
    assert result.bytes_sent == len(data) == 108
    assert result.mac == "52:54:00:ab:cd:ef"
    assert (result.destination, result.port) == ("127.0.0.1", port)
    assert result.broadcast_enabled is False
    assert result.secure_on is True
    assert result.sent_at.tzinfo is UTC
    assert result.source == f"wol:127.0.0.1:{port}"
    for text in (repr(result), caplog.text):
        assert "0badc0ffee42" not in text.lower()
        assert "0b:ad:c0:ff:ee:42" not in text.lower()
    assert "52:54:00:ab:cd:ef" in caplog.text


async def test_several_packets_are_sent_when_asked() -> None:
    transport, received, port = await _listener()
    try:
        result = await WakeOnLanSender().send(
            "52:54:00:00:00:01", destination="127.0.0.1", port=port, packets=3
        )
        packets = [await asyncio.wait_for(received.get(), timeout=5) for _ in range(3)]
    finally:
        transport.close()
    assert packets == [magic_packet("52:54:00:00:00:01")] * 3
    assert result.bytes_sent == 3 * 102 and result.packets == 3


@pytest.mark.parametrize(
    ("destination", "port", "packets"),
    [("wol.example", 9, 1), ("::1", 9, 1), ("127.0.0.1", 0, 1), ("127.0.0.1", 9, 0)],
)
async def test_bad_targets_are_rejected(destination: str, port: int, packets: int) -> None:
    with pytest.raises(InvalidWakeTarget):
        await WakeOnLanSender().send(
            "52:54:00:00:00:01", destination=destination, port=port, packets=packets
        )


NETNS_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, socket, subprocess
    from nodewarden.wol import WakeOnLanSender

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "route", "add", "default", "dev", "lo"], check=True)

    async def main():
        out = []
        for destination in ("255.255.255.255", "127.255.255.255"):
            listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            listener.bind(("0.0.0.0", 0))
            listener.settimeout(5)
            port = listener.getsockname()[1]
            sent = await WakeOnLanSender().send(
                "52:54:00:12:34:56", destination=destination, port=port
            )
            data, _ = listener.recvfrom(200)
            out.append({"destination": destination, "broadcast": sent.broadcast_enabled,
                        "bytes_sent": sent.bytes_sent, "received": data.hex()})
        print(json.dumps(out))

    asyncio.run(main())
    """
)


def test_broadcast_sends_enable_so_broadcast_inside_a_private_netns() -> None:
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        pytest.skip("needs unshare(1) and ip(8) for a private network namespace")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here (needs CAP_SYS_ADMIN)")
    done = subprocess.run(
        [unshare, "-n", sys.executable, "-c", NETNS_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    expected = magic_packet("52:54:00:12:34:56").hex()
    assert [r["destination"] for r in results] == ["255.255.255.255", "127.255.255.255"]
    for result in results:
        assert result["broadcast"] is True
        assert result["bytes_sent"] == 102
        assert result["received"] == expected
