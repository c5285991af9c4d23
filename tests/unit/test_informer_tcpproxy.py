"""The fault proxy the informer and chaos tests use: forwards, drops, refuses, stalls (loopback only)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from nodewarden_doubles.tcpproxy import ProxyThread, TcpProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()


async def _roundtrip(port: int, payload: bytes = b"ping") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), 5)
    finally:
        writer.close()


async def test_forwards_and_drops_open_connections(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", echo_port) as proxy:
        assert proxy.port != echo_port
        assert await _roundtrip(proxy.port) == b"ping"
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        assert proxy.drop_all() == 1
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            writer.write(b"y")
            await writer.drain()
            await asyncio.wait_for(reader.readexactly(1), 5)
        writer.close()


async def test_refuses_then_accepts_on_the_same_port(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", echo_port) as proxy:
        port = proxy.port
        await proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        await proxy.accept()
        assert proxy.port == port
        assert await _roundtrip(port) == b"ping"


async def test_a_stall_holds_bytes_until_released(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", echo_port) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.stall()
        writer.write(b"held")
        await writer.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.5)
        proxy.unstall()
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"held"
        writer.close()


def test_targets_outside_loopback_are_refused() -> None:
    with pytest.raises(ValueError, match="target_host must be a loopback"):
        TcpProxy("10.0.0.1", 443)
    with pytest.raises(ValueError, match="listen_host"):
        TcpProxy("127.0.0.1", 443, listen_host="0.0.0.0")


async def test_the_threaded_proxy_is_driven_from_synchronous_code(echo_port: int) -> None:
    proxy = await asyncio.to_thread(ProxyThread, "127.0.0.1", echo_port)
    try:
        assert await _roundtrip(proxy.port) == b"ping"
        await asyncio.to_thread(proxy.refuse)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", proxy.port)
        await asyncio.to_thread(proxy.accept)
        assert await _roundtrip(proxy.port) == b"ping"
    finally:
        await asyncio.to_thread(proxy.close)
