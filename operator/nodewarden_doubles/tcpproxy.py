"""FAKE network for fault tests: a loopback TCP proxy that cuts, refuses and stalls connections.

A test double (not a peer nodewarden talks to in production): the real API server cannot
be told to drop an established connection, refuse new ones for a while, or go silent
with the connection still open, so tests put this between a client and the server:

    async with TcpProxy("127.0.0.1", api_port) as proxy:   # listens on 127.0.0.1:<free>
        ... point the client at 127.0.0.1:proxy.port ...
        proxy.drop_all()              # RST every open connection
        await proxy.refuse()          # stop listening: connects get ECONNREFUSED
        await proxy.accept()          # listen again on the same port
        await proxy.outage(15)        # drop_all + refuse for 15 s + accept
        proxy.stall(); proxy.unstall()  # hold every byte in both directions (black hole)

It forwards bytes untouched, so TLS passes through end to end: a server certificate
issued for 127.0.0.1 stays valid through a proxy on 127.0.0.1 at another port.
`ProxyThread` runs one in a background thread for synchronous tests (e.g. to cut a
subprocess operator's API connection). Both ends must be loopback addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

R = TypeVar("R")

CHUNK = 65536


def _require_loopback(host: str, what: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{what} must be a loopback IP address (e.g. 127.0.0.1), got {host!r}")


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream connection."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port`, with fault switches."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        _require_loopback(target_host, "target_host")
        _require_loopback(listen_host, "listen_host")
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = listen_port
        self.connections_total = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def open_connections(self) -> int:
        return len(self._links)

    @property
    def listening(self) -> bool:
        return self._server is not None

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    async def start(self) -> Self:
        await self.accept()
        return self

    async def close(self) -> None:
        await self.refuse()
        self.drop_all()
        self._flowing.set()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- fault switches -----------------------------------------------------------------

    async def accept(self) -> None:
        """Listen (again) on the proxy's port."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._handle, self.listen_host, self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def refuse(self) -> None:
        """Stop listening: new connections are refused; open ones are left alone."""
        server, self._server = self._server, None
        if server is not None:
            server.close()  # closes the listening socket now (no wait for open connections)
            await asyncio.sleep(0)

    def drop_all(self) -> int:
        """Reset every open connection (both sides); returns how many were dropped."""
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.clear()
        return len(links)

    def stall(self) -> None:
        """Stop forwarding in both directions; connections stay open and silent."""
        self._flowing.clear()

    def unstall(self) -> None:
        self._flowing.set()

    async def outage(self, seconds: float) -> None:
        """Cut the line: drop every connection and refuse new ones for `seconds`."""
        await self.refuse()
        self.drop_all()
        await asyncio.sleep(seconds)
        await self.accept()

    # --- forwarding ---------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        try:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            for w in (writer, up_writer):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                await self._flowing.wait()
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except OSError:  # one side reset: reset the other too
            writer.transport.abort()


class ProxyThread:
    """A `TcpProxy` on its own event loop in a daemon thread, driven from synchronous code."""

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.proxy: TcpProxy = self._call(self._make(target_host, target_port, listen_port))

    async def _make(self, host: str, port: int, listen_port: int) -> TcpProxy:
        return await TcpProxy(host, port, listen_port=listen_port).start()

    def _call(self, coro: Coroutine[Any, Any, R], timeout: float = 30) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _sync(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    @property
    def port(self) -> int:
        return self.proxy.port

    def drop_all(self) -> int:
        return int(self._call(self._sync(self.proxy.drop_all)))

    def refuse(self) -> None:
        self._call(self.proxy.refuse())

    def accept(self) -> None:
        self._call(self.proxy.accept())

    def stall(self) -> None:
        self._call(self._sync(self.proxy.stall))

    def unstall(self) -> None:
        self._call(self._sync(self.proxy.unstall))

    def outage(self, seconds: float) -> None:
        """Blocks for `seconds` while the line is cut."""
        self._call(self.proxy.outage(seconds), timeout=seconds + 30)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self.proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
