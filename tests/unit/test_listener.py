"""The connection guard in process: stalled connections are dropped at the header deadline,
a new connection beyond the cap evicts the oldest stalled one (so a prompt client is
served), a connection serving a request is never evicted, and oversized headers are
dropped. The whole operator under a flood: tests/cluster/test_slow_clients.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from aiohttp import web

from nodewarden.listener import ListenerLimits, start_guarded

LIMITS = ListenerLimits(header_timeout=0.3, request_timeout=3.0, max_connections=8)


async def _app(
    slow: asyncio.Event | None = None, inside: list[int] | None = None
) -> web.Application:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def hold(_: web.Request) -> web.Response:
        assert slow is not None and inside is not None
        inside.append(1)
        await slow.wait()
        return web.Response(text="late")

    app = web.Application()
    app.router.add_get("/ok", ok)
    app.router.add_get("/hold", hold)
    return app


async def _stalled(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    return reader, writer


async def _request(port: int, path: str = "/ok") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    return answer


async def test_stalled_connections_are_dropped_and_evicted_for_prompt_ones() -> None:
    runner, port = await start_guarded(await _app(), "t", "127.0.0.1", 0, LIMITS)
    try:
        stalled = [await _stalled(port) for _ in range(40)]
        await asyncio.sleep(0.15)  # older than EVICT_AFTER: they may be evicted now
        answer = await _request(port)
        assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer
        started = time.monotonic()
        # every stalled connection is closed by the server: evicted or at its deadline
        for reader, writer in stalled:
            assert await asyncio.wait_for(reader.read(), timeout=5) == b""
            writer.close()
        assert time.monotonic() - started < LIMITS.header_timeout + 1.0
    finally:
        await runner.cleanup()


async def test_a_request_being_served_is_not_evicted_and_the_rest_are_refused() -> None:
    slow = asyncio.Event()
    inside: list[int] = []
    # a request deadline far beyond the test's own steps: on a loaded machine the held
    # requests must not reach it (the deadline has its own test below)
    limits = dataclasses.replace(LIMITS, request_timeout=60.0)
    runner, port = await start_guarded(await _app(slow, inside), "t", "127.0.0.1", 0, limits)
    try:
        held = [asyncio.create_task(_request(port, "/hold")) for _ in range(LIMITS.max_connections)]
        # wait until every held request is inside its handler (a condition, not a sleep: on a
        # loaded machine a request whose headers were not yet read is "waiting", and may be
        # evicted for the new connection, as it should be)
        deadline = time.monotonic() + 10
        while len(inside) < LIMITS.max_connections:
            assert time.monotonic() < deadline, f"only {len(inside)} requests reached the handler"
            await asyncio.sleep(0.01)
        # the cap is full of requests being served: a new connection is closed at once
        reader, writer = await _stalled(port)
        assert await asyncio.wait_for(reader.read(), timeout=2) == b""
        writer.close()
        slow.set()
        answers = await asyncio.gather(*held)
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    finally:
        await runner.cleanup()


async def test_a_request_past_its_deadline_is_closed() -> None:
    slow = asyncio.Event()
    inside: list[int] = []
    limits = dataclasses.replace(LIMITS, request_timeout=0.5)
    runner, port = await start_guarded(await _app(slow, inside), "t", "127.0.0.1", 0, limits)
    try:
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            answer = await _request(port, "/hold")
            assert answer == b""
        assert inside, "the request reached its handler before the deadline closed it"
        assert time.monotonic() - started < 5
    finally:
        slow.set()
        await runner.cleanup()


async def test_oversized_headers_are_dropped() -> None:
    runner, port = await start_guarded(await _app(), "t", "127.0.0.1", 0, LIMITS)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nX: " + b"a" * (LIMITS.max_header_bytes + 10))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        assert await asyncio.wait_for(reader.read(), timeout=2) == b""
        writer.close()
    finally:
        await runner.cleanup()
